//! Conversion of the duck-typed tensor arguments into plain values
//! (duck typing, as upstream): parallelism descriptors (any object
//! with `axes`, or a list of axes), axes (`kind`, `rank`, `size`,
//! `split_dim`, `expert_id`, `stage_id`), writer partitions (an object with
//! `rank`/`size`/`split_dim`, a dict, or a 3-tuple), read targets (`mode`,
//! `parallelism`) and the per-item lists of the batch forms. Malformed
//! values become INVALID_PARAMS errors (a write returns -600, a read
//! `None`); validation of the values is `mooncake-tensor`'s.

use mooncake_client::{Error, Result};
use mooncake_tensor::{
    Parallelism, RawAxis, RawWriterPartition, ReadMode, ReadRequest, WriterPartition,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

fn invalid(why: impl Into<String>) -> Error {
    Error::invalid(why.into())
}

fn attr<'py>(obj: &Bound<'py, PyAny>, name: &str) -> Option<Bound<'py, PyAny>> {
    obj.getattr(name).ok()
}

fn int_field(obj: &Bound<'_, PyAny>, name: &str, what: &str) -> Result<i64> {
    let v = attr(obj, name).ok_or_else(|| invalid(format!("{what} has no {name}")))?;
    v.extract::<i64>()
        .map_err(|_| invalid(format!("{what}.{name} must be an int")))
}

fn opt_int_field(obj: &Bound<'_, PyAny>, name: &str, what: &str) -> Result<Option<i64>> {
    match attr(obj, name) {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => v
            .extract::<i64>()
            .map(Some)
            .map_err(|_| invalid(format!("{what}.{name} must be an int or None"))),
    }
}

/// Items of a list or tuple, or `None` for anything else.
fn sequence<'py>(obj: &Bound<'py, PyAny>) -> Option<Vec<Bound<'py, PyAny>>> {
    if let Ok(l) = obj.downcast::<PyList>() {
        return Some(l.iter().collect());
    }
    if let Ok(t) = obj.downcast::<PyTuple>() {
        return Some(t.iter().collect());
    }
    None
}

fn raw_axis(obj: &Bound<'_, PyAny>) -> Result<RawAxis> {
    let kind = attr(obj, "kind").ok_or_else(|| invalid("parallel axis has no kind"))?;
    let kind: String = kind
        .extract()
        .map_err(|_| invalid("parallel axis kind must be a str"))?;
    Ok(RawAxis {
        kind,
        rank: int_field(obj, "rank", "parallel axis")?,
        size: int_field(obj, "size", "parallel axis")?,
        split_dim: opt_int_field(obj, "split_dim", "parallel axis")?,
        expert_id: opt_int_field(obj, "expert_id", "parallel axis")?,
        stage_id: opt_int_field(obj, "stage_id", "parallel axis")?,
    })
}

/// A parallelism request: any object with `axes`, or (ours) a list/tuple
/// of axes; `mooncake-tensor` validates its axes (count, kinds, ranks,
/// split dims).
pub(crate) fn parallelism(obj: &Bound<'_, PyAny>) -> Result<Parallelism> {
    let axes = match attr(obj, "axes") {
        Some(a) => a,
        None if sequence(obj).is_some() => obj.clone(),
        None => return Err(invalid("parallelism must provide axes")),
    };
    let items = sequence(&axes)
        .or_else(|| {
            axes.try_iter()
                .ok()
                .map(|it| it.filter_map(Result::ok).collect())
        })
        .ok_or_else(|| invalid("parallelism axes must be a list"))?;
    let raw = items.iter().map(raw_axis).collect::<Result<Vec<_>>>()?;
    Ok(Parallelism::new(&raw)?)
}

/// An optional parallelism argument (`None` stays `None`).
pub(crate) fn opt_parallelism(obj: Option<&Bound<'_, PyAny>>) -> Result<Option<Parallelism>> {
    match obj {
        Some(o) if !o.is_none() => parallelism(o).map(Some),
        _ => Ok(None),
    }
}

/// A writer partition: an object with `rank`, `size`, `split_dim`, or
/// (ours) a dict with those keys or a 3-tuple `(rank, size, split_dim)`.
pub(crate) fn writer_partition(obj: Option<&Bound<'_, PyAny>>) -> Result<Option<WriterPartition>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let what = "writer_partition";
    let raw = if let Ok(d) = obj.downcast::<PyDict>() {
        let get = |name: &str| -> Result<i64> {
            d.get_item(name)
                .ok()
                .flatten()
                .ok_or_else(|| invalid(format!("{what} has no {name}")))?
                .extract::<i64>()
                .map_err(|_| invalid(format!("{what}.{name} must be an int")))
        };
        RawWriterPartition {
            rank: get("rank")?,
            size: get("size")?,
            split_dim: get("split_dim")?,
        }
    } else if let (Some(items), false) = (sequence(obj), obj.hasattr("rank").unwrap_or(false)) {
        let [r, s, d] = items.as_slice() else {
            return Err(invalid(format!(
                "{what} tuple must be (rank, size, split_dim)"
            )));
        };
        let int = |v: &Bound<'_, PyAny>| -> Result<i64> {
            v.extract::<i64>()
                .map_err(|_| invalid(format!("{what} tuple items must be ints")))
        };
        RawWriterPartition {
            rank: int(r)?,
            size: int(s)?,
            split_dim: int(d)?,
        }
    } else {
        RawWriterPartition {
            rank: int_field(obj, "rank", what)?,
            size: int_field(obj, "size", what)?,
            split_dim: int_field(obj, "split_dim", what)?,
        }
    };
    Ok(Some(WriterPartition::new(raw)?))
}

/// A read request for `key` and an optional target (any object with `mode`
/// and `parallelism`); `None` is a plain `get_tensor`.
pub(crate) fn read_request(key: &str, target: Option<&Bound<'_, PyAny>>) -> Result<ReadRequest> {
    let Some(t) = target.filter(|t| !t.is_none()) else {
        return Ok(ReadRequest::plain(key));
    };
    let mode = attr(t, "mode").ok_or_else(|| invalid("read target has no mode"))?;
    let mode = mode
        .downcast::<PyString>()
        .map_err(|_| invalid("read target mode must be a str"))?
        .to_string();
    let mode = ReadMode::parse(&mode)?;
    let par = match attr(t, "parallelism") {
        Some(p) => opt_parallelism(Some(&p))?,
        None => None,
    };
    Ok(ReadRequest {
        key: key.to_string(),
        mode,
        parallelism: par,
        advisory_split_dim: false,
    })
}

/// A per-item list argument of a batch form (`parallelisms`,
/// `writer_partitions`, `targets`): `Ok(None)` when absent, the items when
/// a list/tuple of `n` entries, an error otherwise.
pub(crate) fn per_item<'py>(
    obj: Option<&Bound<'py, PyAny>>,
    n: usize,
    name: &str,
) -> Result<Option<Vec<Bound<'py, PyAny>>>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let items = sequence(obj).ok_or_else(|| invalid(format!("{name} must be a list")))?;
    if items.len() != n {
        return Err(invalid(format!(
            "{name} has {} entries for {n} keys",
            items.len()
        )));
    }
    Ok(Some(items))
}
