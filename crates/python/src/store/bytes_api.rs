//! The byte-value methods: `put`, `put_parts`,
//! `put_batch`, their `upsert` variants, `get`, `get_batch`, `get_buffer`,
//! `batch_get_buffer`, `get_size`, `is_exist` and `batch_is_exist`.
//!
//! Values arrive as [`ByteView`]s; the rules are the client's.

use super::class::MooncakeDistributedStore;
use super::class::Store;
use super::config::{options, ReplicateConfig};
use super::handle::BufferHandle;
use crate::args::one_of;
use crate::buffer::{byte_views, uninit_bytes, ByteView};
use crate::family::method_family;
use crate::report::Call;
use mooncake_client::Error;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

impl MooncakeDistributedStore {
    /// Shared body of put/upsert (an empty value is rejected).
    fn write_value(
        &self,
        call: Call<'_>,
        key: &str,
        value: &ByteView,
        config: Option<ReplicateConfig>,
        upsert: bool,
    ) -> i64 {
        let cfg = options(config);
        let r = self.run(call.py(), |c| c.put(key, value.as_slice(), &cfg, upsert));
        call.code(Some(key), r)
    }

    /// Shared body of put_parts/upsert_parts: zero bytes in all store
    /// nothing, return 0 and log a WARNING (upstream).
    fn write_parts(
        &self,
        call: Call<'_>,
        key: &str,
        parts: &[ByteView],
        config: Option<ReplicateConfig>,
        upsert: bool,
    ) -> i64 {
        let cfg = options(config);
        let slices: Vec<&[u8]> = parts.iter().map(ByteView::as_slice).collect();
        let r = self.run(call.py(), |c| c.put_parts(key, &slices, &cfg, upsert));
        if r == Ok(0) {
            call.note(&format!(
                "key={}: no data given; nothing stored",
                crate::report::show_key(key)
            ));
        }
        call.code(Some(key), r.map(|_| ()))
    }

    /// Staged reads of `keys` straight into new `bytes` objects: each
    /// object is allocated (uninitialised) once the sizes are known and
    /// filled with the GIL released, so a value is copied exactly once.
    /// `None` per failed key, one log line per call.
    fn read_bytes(&self, call: Call<'_>, keys: &[String]) -> Vec<Option<Py<PyBytes>>> {
        let mut objects: Vec<Option<Py<PyBytes>>> = Vec::new();
        let r = self.run(call.py(), |c| {
            let alloc = |sizes: &[mooncake_client::Result<u64>]| {
                Python::with_gil(|py| {
                    sizes
                        .iter()
                        .map(|s| {
                            let b = s.as_ref().ok().and_then(|&n| uninit_bytes(py, n as usize));
                            let ptr = b.as_ref().map(|(_, p)| *p);
                            objects.push(b.map(|(o, _)| o));
                            ptr
                        })
                        .collect()
                })
            };
            Ok(c.get_batch_with(keys, Box::new(alloc)))
        });
        let mut objects = objects.into_iter();
        let items = r.map(|sizes| {
            sizes
                .into_iter()
                .map(|s| {
                    let obj = objects.next().flatten();
                    s.and_then(|_| obj.ok_or_else(|| Error::internal("no bytes object")))
                })
                .collect()
        });
        call.oks(keys, items)
    }
    /// `get_batch`'s values: `b""` per failed key; `get_batch([])` returns
    /// `[b""]` (upstream quirk).
    fn values<'py>(&self, call: Call<'py>, keys: Vec<String>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let py = call.py();
        if keys.is_empty() {
            call.note("no keys given; returning [b\"\"]");
            return Ok(vec![PyBytes::new(py, b"").into_any()]);
        }
        let values = self.read_bytes(call, &keys).into_iter();
        Ok(values
            .map(|v| {
                v.map_or_else(
                    || PyBytes::new(py, b"").into_any(),
                    |b| b.into_bound(py).into_any(),
                )
            })
            .collect())
    }

    /// `batch_get_buffer`'s handles: `None` per failed key.
    fn buffers<'py>(&self, call: Call<'py>, keys: Vec<String>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let py = call.py();
        let r = self.run(py, |c| Ok(c.get_batch(&keys)));
        let values = call.oks(&keys, r).into_iter();
        values
            .map(|v| {
                v.map_or_else(
                    || Ok(py.None().into_bound(py)),
                    |v| BufferHandle::wrap(py, v),
                )
            })
            .collect()
    }
}

method_family! {
    fn method(&self, py: Python<'_>, key: String) -> PyResult<i64> {
        Ok(write(self, Call::new(py, method), &key, &views?, config, upsert))
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Store `value` (any buffer-protocol object) under `key`; write-once.
        #[pyo3(signature = (key, value, config=None))]
        put(value: &Bound<'_, PyAny>, config: Option<ReplicateConfig>) {
            views: ByteView::new(value),
            write: Self::write_value,
            upsert: false,
        }
        /// Insert or replace `key` with `value`.
        #[pyo3(signature = (key, value, config=None))]
        upsert(value: &Bound<'_, PyAny>, config: Option<ReplicateConfig>) {
            views: ByteView::new(value),
            write: Self::write_value,
            upsert: true,
        }
        /// Store the concatenation of `parts`; no data at all stores nothing and returns 0.
        #[pyo3(signature = (key, *parts, config=None))]
        put_parts(parts: &Bound<'_, PyTuple>, config: Option<ReplicateConfig>) {
            views: byte_views(parts.iter()),
            write: Self::write_parts,
            upsert: false,
        }
        /// Insert or replace `key` with the concatenation of `parts`.
        #[pyo3(signature = (key, *parts, config=None))]
        upsert_parts(parts: &Bound<'_, PyTuple>, config: Option<ReplicateConfig>) {
            views: byte_views(parts.iter()),
            write: Self::write_parts,
            upsert: true,
        }
    }
}

method_family! {
    #[pyo3(signature = (keys, values, config=None))]
    fn method(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
        config: Option<ReplicateConfig>,
    ) -> PyResult<i64> {
        let views = byte_views(values)?;
        let cfg = options(config);
        let slices: Vec<&[u8]> = views.iter().map(ByteView::as_slice).collect();
        let r = self.run(py, |c| c.put_batch(&keys, &slices, &cfg, upsert));
        Ok(Call::new(py, method).batch_code(keys.len(), r))
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Store many values; 0 or the first failing code.
        put_batch { upsert: false }
        /// Insert or replace many values; 0 or the first failing code.
        upsert_batch { upsert: true }
    }
}

method_family! {
    #[pyo3(signature = (arg0=None, *, key=None))]
    fn method(&self, py: Python<'_>, arg0: Option<String>, key: Option<String>) -> PyResult<i64> {
        let key = one_of(method, arg0, key, "key")?;
        let r = self.run(py, |c| query(c, &key));
        Ok(Call::new(py, method).code(Some(&key), r))
    }
    #[pymethods] for MooncakeDistributedStore {
        /// Size of the object `arg0` (alias `key=`), or a negative code. Grants a lease.
        get_size { query: Store::get_size }
        /// 1 if `arg0` (alias `key=`) has a complete replica, 0 if not, negative on error.
        is_exist { query: Store::is_exist }
    }
}

method_family! {
    #[pyo3(signature = (arg0=None, *, keys=None))]
    fn method<'py>(
        &self,
        py: Python<'py>,
        arg0: Option<Vec<String>>,
        keys: Option<Vec<String>>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let keys = one_of(method, arg0, keys, "keys")?;
        read(self, Call::new(py, method), keys)
    }
    #[pymethods] for MooncakeDistributedStore {
        /// One value per key of `arg0` (alias `keys=`), `b""` for failures.
        get_batch { read: Self::values }
        /// One `BufferHandle` (or `None`) per key of `arg0` (alias `keys=`).
        batch_get_buffer { read: Self::buffers }
    }
}

#[pymethods]
impl MooncakeDistributedStore {
    /// The value of `arg0` (alias `key=`), or `b""` on any failure.
    #[pyo3(signature = (arg0=None, *, key=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        arg0: Option<String>,
        key: Option<String>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let key = one_of("get", arg0, key, "key")?;
        let mut v = self.read_bytes(Call::new(py, "get"), std::slice::from_ref(&key));
        Ok(match v.pop().flatten() {
            Some(b) => b.into_bound(py),
            None => PyBytes::new(py, b""),
        })
    }

    /// A `BufferHandle` with the value of `arg0` (alias `key=`), or `None`.
    #[pyo3(signature = (arg0=None, *, key=None))]
    fn get_buffer<'py>(
        &self,
        py: Python<'py>,
        arg0: Option<String>,
        key: Option<String>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let key = one_of("get_buffer", arg0, key, "key")?;
        let r = self.run(py, |c| c.get(&key));
        Call::new(py, "get_buffer")
            .ok(Some(&key), r)
            .map(|v| BufferHandle::wrap(py, v))
            .transpose()
    }

    /// `is_exist` per key; `[]` for `[]`.
    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        let r = self.run(py, |c| Ok(c.batch_is_exist(&keys)));
        Call::new(py, "batch_is_exist").codes(&keys, r)
    }
}
