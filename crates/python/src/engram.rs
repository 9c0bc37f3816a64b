//! PyO3 surface of EngramStore:
//! `EngramStoreConfig` and `EngramStore` (`populate`, `lookup`,
//! `lookup_into`, `remove_from_store`, getters).
//!
//! Conversion only: NumPy arrays, torch tensors and nested lists become
//! ids, tables and outputs; the rules (defaults, layout checks, populate
//! casts, output dtypes, messages) are `mooncake-engram`'s, and its errors
//! are raised by [`OrRaise`] with their exact messages. The store
//! client is resolved at call time from the `store` argument
//! ([`store_client`]). The whole populate and gather (id validation through
//! the last copy) run with the GIL released.

use crate::buffer::{elements, half_bits, typed, typed_out, Half};
use crate::pybuf::{Element, Typed};
use crate::report::{raise, Call, OrRaise};
use crate::store::capsule::store_client;
use crate::store::{options, MooncakeDistributedStore, ReplicateConfig};
use mooncake_client::Client;
use mooncake_engram::{
    ids_kind_ok, ids_not_integer_array, ids_not_integers, not_an_array, EngramConfig, EngramCore,
    Ids, IdsBuilder, OutBuf, OutKind, Table, TableDtype,
};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyFloat, PyInt, PyString, PyType};
use std::sync::Arc;

static NUMPY: GILOnceCell<Py<PyModule>> = GILOnceCell::new();

/// The imported `numpy` module (cached).
fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    Ok(NUMPY
        .get_or_try_init(py, || py.import("numpy").map(Bound::unbind))?
        .bind(py))
}

/// Whether `obj` is a `torch.Tensor` (checked by type module, no import).
fn is_torch_tensor(obj: &Bound<'_, PyAny>) -> bool {
    obj.get_type()
        .module()
        .map(|m| m.to_string().starts_with("torch"))
        .unwrap_or(false)
        && obj.hasattr("numpy").unwrap_or(false)
}

/// A CPU torch tensor as a NumPy array sharing its memory; bfloat16
/// tensors come back as `uint16` raw bits.
fn torch_to_numpy<'py>(t: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = t.py();
    let t = t.call_method0("detach")?;
    let dtype = t.getattr("dtype")?.str()?.to_string();
    if dtype == "torch.bfloat16" {
        let torch = py.import("torch")?;
        let i16v = t.call_method1("view", (torch.getattr("int16")?,))?;
        return i16v
            .call_method0("numpy")?
            .call_method1("view", (numpy(py)?.getattr("uint16")?,));
    }
    t.call_method0("numpy")
}

/// Normalise a dtype designation (`"float16"`, `np.float16`,
/// `np.dtype("float16")`, `torch.bfloat16`) to its name.
fn dtype_name(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = obj.downcast::<PyString>() {
        return Ok(s.to_string());
    }
    if obj.is_instance_of::<PyType>() {
        if let Ok(n) = obj.getattr("__name__") {
            return Ok(n.str()?.to_string());
        }
    }
    let s = obj.str()?.to_string();
    Ok(s.strip_prefix("torch.").unwrap_or(&s).to_string())
}

/// A sequence of ints (list, tuple, NumPy integer array); floats -> TypeError.
fn extract_int_list(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "table_vocab_sizes must be a sequence of ints",
        ));
    }
    let mut out = Vec::new();
    for item in obj.try_iter()? {
        let item = item?;
        if item.is_instance_of::<PyFloat>() {
            return Err(PyTypeError::new_err(
                "table_vocab_sizes must contain only ints",
            ));
        }
        let v: i64 = item
            .extract()
            .map_err(|_| PyTypeError::new_err("table_vocab_sizes must contain only ints"))?;
        out.push(v);
    }
    Ok(out)
}

/// An int within i32 (no floats); anything else -> TypeError.
fn extract_i32(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i32> {
    if obj.is_instance_of::<PyFloat>() {
        return Err(PyTypeError::new_err(format!("{what} must be an int")));
    }
    obj.extract::<i32>()
        .map_err(|_| PyTypeError::new_err(format!("{what} must be an int within int32")))
}

/// The element type name of a NumPy dtype (`float32`, `float16`,
/// `uint16`, ...); a non-native byte order is another type, named with its
/// byte-order prefix (`>float32` is not float32). `dtype.name` costs
/// microseconds, so the types a lookup writes are named from `dtype.char`.
fn element_name(descr: &Bound<'_, PyAny>) -> PyResult<String> {
    let mut name = match descr.getattr("char")?.extract::<String>()?.as_str() {
        "f" => "float32".to_string(),
        "e" => "float16".to_string(),
        "H" => "uint16".to_string(),
        _ => descr.getattr("name")?.extract()?,
    };
    if !descr.getattr("isnative")?.extract::<bool>()? {
        name.insert_str(0, &descr.getattr("byteorder")?.extract::<String>()?);
    }
    Ok(name)
}

/// Physical layout of one EngramStore layer (its values are validated
/// only when an `EngramStore` is built from it).
#[pyclass(module = "mooncake.store", name = "EngramStoreConfig")]
#[derive(Clone)]
pub(crate) struct PyEngramStoreConfig {
    inner: EngramConfig,
}

#[pymethods]
impl PyEngramStoreConfig {
    /// `EngramStoreConfig(*, table_vocab_sizes=[1024], embedding_dim=64, table_dtype="float32")`.
    #[new]
    #[pyo3(signature = (*, table_vocab_sizes=None, embedding_dim=None, table_dtype=None))]
    fn new(
        table_vocab_sizes: Option<&Bound<'_, PyAny>>,
        embedding_dim: Option<&Bound<'_, PyAny>>,
        table_dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut c = PyEngramStoreConfig {
            inner: EngramConfig::default(),
        };
        if let Some(v) = table_vocab_sizes {
            c.set_table_vocab_sizes(v)?;
        }
        if let Some(d) = embedding_dim {
            c.set_embedding_dim(d)?;
        }
        if let Some(t) = table_dtype {
            c.set_table_dtype(t)?;
        }
        Ok(c)
    }

    /// Per-head row counts (a copy).
    #[getter]
    fn get_table_vocab_sizes(&self) -> Vec<i64> {
        self.inner.table_vocab_sizes.clone()
    }

    #[setter]
    fn set_table_vocab_sizes(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.table_vocab_sizes = extract_int_list(v)?;
        Ok(())
    }

    /// Row width D.
    #[getter]
    fn get_embedding_dim(&self) -> i32 {
        self.inner.embedding_dim
    }

    #[setter]
    fn set_embedding_dim(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.embedding_dim = extract_i32(v, "embedding_dim")?;
        Ok(())
    }

    /// Table element type name.
    #[getter]
    fn get_table_dtype(&self) -> String {
        self.inner.table_dtype.clone()
    }

    #[setter]
    fn set_table_dtype(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.table_dtype = dtype_name(v)?;
        Ok(())
    }

    /// `EngramStoreConfig(table_vocab_sizes=[...], embedding_dim=D, table_dtype='...')`.
    fn __repr__(&self) -> String {
        format!(
            "EngramStoreConfig(table_vocab_sizes={:?}, embedding_dim={}, table_dtype='{}')",
            self.inner.table_vocab_sizes, self.inner.embedding_dim, self.inner.table_dtype
        )
    }
}

/// One EngramStore layer: per-head tables `engram:l{layer}:h{h}`.
#[pyclass(module = "mooncake.store", name = "EngramStore", frozen)]
pub(crate) struct PyEngramStore {
    core: Arc<EngramCore>,
    store: Option<Py<PyAny>>,
    options: mooncake_client::ReplicateConfig,
}

/// A populate input or lookup output kept alive (and its memory exported)
/// while the GIL is released: float32 values, float16 values, or raw
/// bfloat16 bits (`uint16`).
enum Array {
    F32(Typed<f32>),
    F16(Typed<Half>),
    U16(Typed<u16>),
}

/// A C-contiguous `T` export of `arr` (`write`: as a writable output), its
/// address and byte length.
fn export<T: Element>(arr: &Bound<'_, PyAny>, write: bool) -> PyResult<(Typed<T>, usize, usize)> {
    if write {
        return typed_out::<T>(arr);
    }
    let b = typed::<T>(arr)?;
    let (p, n) = (b.ptr() as usize, b.len_bytes());
    Ok((b, p, n))
}

impl Array {
    /// A C-contiguous array of element type `dtype` (`float32`, `float16`,
    /// else `uint16`), read or (`write`) written in place; with its address
    /// and byte length.
    fn of(arr: &Bound<'_, PyAny>, dtype: &str, write: bool) -> PyResult<(Array, usize, usize)> {
        Ok(match dtype {
            "float32" => export::<f32>(arr, write).map(|(b, p, n)| (Array::F32(b), p, n))?,
            "float16" => export::<Half>(arr, write).map(|(b, p, n)| (Array::F16(b), p, n))?,
            _ => export::<u16>(arr, write).map(|(b, p, n)| (Array::U16(b), p, n))?,
        })
    }

    /// This array as a populate table.
    fn table(&self) -> Table<'_> {
        match self {
            Array::F32(b) => Table::F32(elements(b)),
            Array::F16(b) => Table::Bits(half_bits(b)),
            Array::U16(b) => Table::Bits(elements(b)),
        }
    }
}

impl PyEngramStore {
    fn heads(&self) -> usize {
        self.core.layout().num_heads()
    }

    fn dtype(&self) -> TableDtype {
        self.core.layout().dtype
    }

    /// The usable client now, or None (metadata-only, not set up, closed).
    fn client(&self, py: Python<'_>) -> Option<Arc<Client>> {
        let store = self.store.as_ref()?.bind(py);
        store_client(store).unwrap_or_else(|e| {
            let note = format!("cannot resolve the store client: {e}");
            Call::new(py, "EngramStore").note(&note);
            None
        })
    }

    /// Parse `row_ids` (NumPy integer array, torch tensor or nested sequence).
    fn parse_ids(&self, row_ids: &Bound<'_, PyAny>) -> PyResult<Ids> {
        let py = row_ids.py();
        let np = numpy(py)?;
        let mut arr = row_ids.clone();
        if is_torch_tensor(&arr) {
            arr = torch_to_numpy(&arr)?;
        }
        if arr.is_instance(&np.getattr("ndarray")?)? {
            return self.parse_ids_array(np, &arr);
        }
        if let Some(ids) = self.parse_ids_lists_fast(row_ids) {
            return Ok(ids);
        }
        self.parse_ids_nested(np, row_ids)
    }

    /// Fast path for a well-formed list of lists of lists of exact Python
    /// ints; `None` means "use the general path" (which reports errors).
    fn parse_ids_lists_fast(&self, row_ids: &Bound<'_, PyAny>) -> Option<Ids> {
        let h_n = self.heads() as ffi::Py_ssize_t;
        let outer = row_ids.as_ptr();
        // SAFETY: the GIL is held; all items are borrowed from lists that
        // `row_ids` keeps alive, and no Python code runs in between (only
        // exact ints are converted, so no __index__ is called).
        unsafe {
            if ffi::PyList_Check(outer) == 0 {
                return None;
            }
            let b = ffi::PyList_Size(outer);
            if b <= 0 {
                return None;
            }
            let mut l_n: ffi::Py_ssize_t = -1;
            let mut data = Vec::new();
            for bi in 0..b {
                let row = ffi::PyList_GetItem(outer, bi);
                if row.is_null() || ffi::PyList_Check(row) == 0 {
                    ffi::PyErr_Clear();
                    return None;
                }
                let l = ffi::PyList_Size(row);
                if l <= 0 || (l_n >= 0 && l != l_n) {
                    return None;
                }
                if l_n < 0 {
                    l_n = l;
                    data.reserve((b * l * h_n) as usize);
                }
                for li in 0..l {
                    let item = ffi::PyList_GetItem(row, li);
                    if item.is_null()
                        || ffi::PyList_Check(item) == 0
                        || ffi::PyList_Size(item) != h_n
                    {
                        ffi::PyErr_Clear();
                        return None;
                    }
                    for hi in 0..h_n {
                        let x = ffi::PyList_GetItem(item, hi);
                        if x.is_null() || ffi::PyLong_CheckExact(x) == 0 {
                            ffi::PyErr_Clear();
                            return None;
                        }
                        let v = ffi::PyLong_AsLongLong(x);
                        if v == -1 && !ffi::PyErr_Occurred().is_null() {
                            ffi::PyErr_Clear();
                            return None;
                        }
                        data.push(v);
                    }
                }
            }
            Some(Ids {
                data,
                b: b as usize,
                l: l_n as usize,
            })
        }
    }

    fn parse_ids_array(&self, np: &Bound<'_, PyModule>, arr: &Bound<'_, PyAny>) -> PyResult<Ids> {
        let dtype = arr.getattr("dtype")?;
        let kind: String = dtype.getattr("kind")?.extract()?;
        if !ids_kind_ok(&kind) {
            let name = dtype.str()?.to_string();
            return Err(raise(arr.py(), "lookup", ids_not_integer_array(&name)));
        }
        let arr = np.call_method1("ascontiguousarray", (arr, np.getattr("int64")?))?;
        let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
        let (b, l) = self
            .core
            .layout()
            .ids_shape(&shape)
            .or_raise(arr.py(), "lookup")?;
        let ids = typed::<i64>(&arr)?;
        Ok(Ids {
            data: elements(&ids).to_vec(),
            b,
            l,
        })
    }

    fn parse_ids_nested(
        &self,
        np: &Bound<'_, PyModule>,
        row_ids: &Bound<'_, PyAny>,
    ) -> PyResult<Ids> {
        let py = row_ids.py();
        let fail = |e| raise(py, "lookup", e);
        let outer: Vec<Bound<'_, PyAny>> = row_ids.try_iter()?.collect::<PyResult<_>>()?;
        let np_integer = np.getattr("integer")?;
        let mut ib = IdsBuilder::new(self.heads(), outer.len());
        for row in &outer {
            ib.begin_batch();
            let it = row.try_iter().map_err(|_| fail(ib.not_a_sequence(false)))?;
            for item in it {
                let xs = item?
                    .try_iter()
                    .map_err(|_| fail(ib.not_a_sequence(true)))?;
                ib.begin_row();
                for x in xs {
                    let x = x?;
                    let v = if let Ok(i) = x.downcast::<PyInt>() {
                        i.extract::<i64>().unwrap_or(-1)
                    } else if x.is_instance(&np_integer)? {
                        x.extract::<i64>().unwrap_or(-1)
                    } else {
                        let name = x.get_type().name()?.to_string();
                        return Err(fail(ids_not_integers(&name)));
                    };
                    ib.push(v);
                }
                ib.end_row().map_err(fail)?;
            }
            ib.end_batch().map_err(fail)?;
        }
        ib.finish().map_err(fail)
    }

    /// Gather into `out` (an output of `dtype`, written as `kind`) with the
    /// GIL released.
    fn gather(
        &self,
        py: Python<'_>,
        ids: &Ids,
        out: &Bound<'_, PyAny>,
        dtype: &str,
        kind: OutKind,
    ) -> PyResult<()> {
        let client = self.client(py);
        let (_export, ptr, len) = Array::of(out, dtype, true)?;
        let buf = OutBuf { ptr, len, kind };
        // SAFETY: `_export` keeps the writable output alive and exported
        // until after the call.
        let r = py.allow_threads(|| unsafe {
            self.core
                .lookup_into(client.as_ref(), &ids.data, ids.b, ids.l, buf)
        });
        r.or_raise(py, "lookup")
    }

    /// One populate input as a contiguous array the engram core takes:
    /// the table's bytes, or float32 values it narrows. Errors carry the
    /// engram core's messages.
    fn table_source(
        &self,
        np: &Bound<'_, PyModule>,
        h: usize,
        item: &Bound<'_, PyAny>,
    ) -> PyResult<Array> {
        let py = item.py();
        let mut arr = item.clone();
        if is_torch_tensor(&arr) {
            arr = torch_to_numpy(&arr).map_err(|_| raise(py, "populate", not_an_array()))?;
        }
        if !arr.is_instance(&np.getattr("ndarray")?)? {
            return Err(raise(py, "populate", not_an_array()));
        }
        let dt = self.dtype();
        let adtype = arr.getattr("dtype")?;
        let kind: String = adtype.getattr("kind")?.extract()?;
        dt.check_input_kind(&kind).or_raise(py, "populate")?;
        let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
        self.core
            .layout()
            .check_table_shape(h, &shape)
            .or_raise(py, "populate")?;
        let input = element_name(&adtype)?;
        let target = dt.populate_cast(&input);
        let c = np
            .call_method1("ascontiguousarray", (&arr, np.getattr(target)?))
            .map_err(|_| raise(py, "populate", dt.not_castable()))?;
        Ok(Array::of(&c, target, false)?.0)
    }
}

#[pymethods]
impl PyEngramStore {
    /// `EngramStore(layer_id, config, store=None, *, replicate_config=None)`.
    #[new]
    #[pyo3(signature = (layer_id, config, store=None, *, replicate_config=None))]
    fn new(
        layer_id: &Bound<'_, PyAny>,
        config: &Bound<'_, PyAny>,
        store: Option<&Bound<'_, PyAny>>,
        replicate_config: Option<ReplicateConfig>,
    ) -> PyResult<Self> {
        let py = layer_id.py();
        let layer_id = extract_i32(layer_id, "layer_id")?;
        let cfg = config
            .downcast::<PyEngramStoreConfig>()
            .map_err(|_| PyTypeError::new_err("config must be an EngramStoreConfig"))?
            .borrow()
            .inner
            .clone();
        let layout = cfg.layout().or_raise(py, "__init__")?;
        let store = match store.filter(|s| !s.is_none()) {
            None => None,
            Some(s) => {
                if !s.is_instance_of::<MooncakeDistributedStore>()
                    && !s.hasattr("_get_pyclient_capsule")?
                {
                    return Err(PyRuntimeError::new_err(
                        "EngramStore store parameter must be a PyClient or store wrapper that implements _get_pyclient_capsule()",
                    ));
                }
                store_client(s)?;
                Some(s.clone().unbind())
            }
        };
        Ok(PyEngramStore {
            core: Arc::new(EngramCore::new(layer_id, layout)),
            store,
            options: options(replicate_config),
        })
    }

    /// Upload one `[N_h, D]` table per head (create-only, rolled back on failure).
    fn populate(&self, py: Python<'_>, embedding_buffers: &Bound<'_, PyAny>) -> PyResult<()> {
        let np = numpy(py)?;
        let n = embedding_buffers.len()?;
        self.core
            .layout()
            .check_table_count(n)
            .or_raise(py, "populate")?;
        let sources = (0..n)
            .map(|h| self.table_source(np, h, &embedding_buffers.get_item(h)?))
            .collect::<PyResult<Vec<Array>>>()?;
        let client = self.client(py);
        let tables: Vec<Table<'_>> = sources.iter().map(Array::table).collect();
        let r = py.allow_threads(|| self.core.populate(client.as_ref(), &tables, &self.options));
        r.or_raise(py, "populate")
    }

    /// Gather rows: `[B, L, H]` ids -> new `[B, L, H, D]` array.
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        row_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ids = self.parse_ids(row_ids)?;
        let np = numpy(py)?;
        let (dtype, kind) = self.dtype().lookup_output();
        let shape = (ids.b, ids.l, self.heads(), self.core.layout().dim);
        let out = np.call_method1("empty", (shape, np.getattr(dtype)?))?;
        self.gather(py, &ids, &out, dtype, kind)?;
        Ok(out)
    }

    /// Gather rows into a caller-provided `[B, L, H, D]` array; returns `out`.
    fn lookup_into<'py>(
        &self,
        py: Python<'py>,
        row_ids: &Bound<'py, PyAny>,
        out: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ids = self.parse_ids(row_ids)?;
        let np = numpy(py)?;
        let layout = self.core.layout();
        let rejected = || {
            layout
                .check_output((ids.b, ids.l), &[], "", false, false)
                .map(|_| ())
                .or_raise(py, "lookup_into")
        };
        let arr = match is_torch_tensor(out) {
            true => match torch_to_numpy(out) {
                Ok(a) => a,
                Err(_) => return rejected().map(|()| out.clone()),
            },
            false => out.clone(),
        };
        if !arr.is_instance(&np.getattr("ndarray")?)? {
            return rejected().map(|()| out.clone());
        }
        let flags = arr.getattr("flags")?;
        let dtype = element_name(&arr.getattr("dtype")?)?;
        let kind = layout
            .check_output(
                (ids.b, ids.l),
                &arr.getattr("shape")?.extract::<Vec<usize>>()?,
                &dtype,
                flags.getattr("c_contiguous")?.extract()?,
                flags.getattr("writeable")?.extract()?,
            )
            .or_raise(py, "lookup_into")?;
        self.gather(py, &ids, &arr, &dtype, kind)?;
        Ok(out.clone())
    }

    /// Remove all H tables (one batched remove); returns the number removed.
    #[pyo3(signature = (force=false))]
    fn remove_from_store(&self, py: Python<'_>, force: bool) -> PyResult<usize> {
        let client = self.client(py);
        let r = py.allow_threads(|| self.core.remove(client.as_ref(), force));
        r.or_raise(py, "remove_from_store")
    }

    /// Per-head row counts (a copy).
    fn get_table_vocab_sizes(&self) -> Vec<u64> {
        self.core.layout().vocab_sizes.clone()
    }

    /// Store keys, head order.
    fn get_store_keys(&self) -> Vec<String> {
        self.core.keys().to_vec()
    }

    /// Number of heads H.
    fn get_num_heads(&self) -> usize {
        self.heads()
    }

    /// Row width D.
    fn get_embedding_dim(&self) -> usize {
        self.core.layout().dim
    }

    /// Table element type name.
    fn get_table_dtype(&self) -> &'static str {
        self.dtype().name()
    }

    /// The layer id.
    fn get_layer_id(&self) -> i32 {
        self.core.layer_id()
    }

    /// `EngramStore(layer_id=.., num_heads=.., embedding_dim=.., table_dtype='..')`.
    fn __repr__(&self) -> String {
        format!(
            "EngramStore(layer_id={}, num_heads={}, embedding_dim={}, table_dtype='{}')",
            self.core.layer_id(),
            self.heads(),
            self.core.layout().dim,
            self.dtype().name()
        )
    }
}

/// Register the EngramStore classes on the extension module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngramStoreConfig>()?;
    m.add_class::<PyEngramStore>()?;
    Ok(())
}
