//! PyO3 surface of EngramStore: `EngramStoreConfig` and `EngramStore`
//! (`populate`, `lookup`, `lookup_into`, `remove_from_store`, getters).
//!
//! The store client is read at call time from the store object's
//! `_get_pyclient_capsule()` (a `PyCapsule` named
//! `mooncake.PyClient.shared_ptr` holding an `Arc<Client>`). Arrays are
//! accessed through the buffer protocol; outputs are allocated with
//! `numpy.empty`. The whole gather (id validation through the last copy)
//! runs with the GIL released.

use mooncake_client::{Client, WriteConfig};
use mooncake_engram::convert::{f32_to_bf16, f32_to_f16};
use mooncake_engram::{validate_layout, EngramCore, OutBuf, OutKind, TableDtype};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyCapsule, PyFloat, PyInt, PyString, PyType};
use std::ffi::CStr;
use std::sync::Arc;

/// Name of the capsule that carries an `Arc<Client>`.
pub const CAPSULE_NAME: &CStr = c"mooncake.PyClient.shared_ptr";

const LOOKUP_FAILED: &str = "EngramStore lookup failed";
const POPULATE_FAILED: &str = "populate failed";

static NUMPY: GILOnceCell<Py<PyModule>> = GILOnceCell::new();

/// The imported `numpy` module (cached).
fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    Ok(NUMPY
        .get_or_try_init(py, || py.import("numpy").map(Bound::unbind))?
        .bind(py))
}

/// A C-contiguous buffer-protocol view, released (with the GIL) on drop.
struct RawBuffer {
    view: Box<ffi::Py_buffer>,
}

impl RawBuffer {
    /// Request a C-contiguous (and optionally writable) view of `obj`.
    fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Self> {
        // SAFETY: Py_buffer is plain data; all-zero is a valid initial value.
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        let flags = ffi::PyBUF_C_CONTIGUOUS | if writable { ffi::PyBUF_WRITABLE } else { 0 };
        // SAFETY: `obj` is a live object and `view` a valid, pinned (boxed) target.
        if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(RawBuffer { view })
    }

    fn ptr(&self) -> usize {
        self.view.buf as usize
    }

    fn len(&self) -> usize {
        self.view.len.max(0) as usize
    }
}

impl Drop for RawBuffer {
    fn drop(&mut self) {
        // SAFETY: the view was filled by PyObject_GetBuffer and is released once.
        Python::with_gil(|_| unsafe { ffi::PyBuffer_Release(&mut *self.view) });
    }
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

/// Physical layout of one EngramStore layer.
#[pyclass(module = "mooncake.store", name = "EngramStoreConfig")]
#[derive(Clone)]
pub struct PyEngramStoreConfig {
    vocab: Vec<i64>,
    dim: i32,
    dtype: String,
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
            vocab: vec![1024],
            dim: 64,
            dtype: "float32".into(),
        };
        if let Some(v) = table_vocab_sizes {
            c.vocab = extract_int_list(v)?;
        }
        if let Some(d) = embedding_dim {
            c.dim = extract_i32(d, "embedding_dim")?;
        }
        if let Some(t) = table_dtype {
            c.dtype = dtype_name(t)?;
        }
        Ok(c)
    }

    /// Per-head row counts (a copy).
    #[getter]
    fn get_table_vocab_sizes(&self) -> Vec<i64> {
        self.vocab.clone()
    }

    #[setter]
    fn set_table_vocab_sizes(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.vocab = extract_int_list(v)?;
        Ok(())
    }

    /// Row width D.
    #[getter]
    fn get_embedding_dim(&self) -> i32 {
        self.dim
    }

    #[setter]
    fn set_embedding_dim(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.dim = extract_i32(v, "embedding_dim")?;
        Ok(())
    }

    /// Table element type name.
    #[getter]
    fn get_table_dtype(&self) -> String {
        self.dtype.clone()
    }

    #[setter]
    fn set_table_dtype(&mut self, v: &Bound<'_, PyAny>) -> PyResult<()> {
        self.dtype = dtype_name(v)?;
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "EngramStoreConfig(table_vocab_sizes={:?}, embedding_dim={}, table_dtype='{}')",
            self.vocab, self.dim, self.dtype
        )
    }
}

/// Outcome of calling a store object's `_get_pyclient_capsule()`.
enum Resolved {
    /// No client (not set up): metadata-only.
    None,
    Client(Arc<Client>),
}

/// Call `store._get_pyclient_capsule()` and read the client out of the capsule.
fn resolve_store(store: &Bound<'_, PyAny>) -> PyResult<Resolved> {
    let cap = store.call_method0("_get_pyclient_capsule").map_err(|e| {
        let msg = e
            .value(store.py())
            .str()
            .map(|s| s.to_string())
            .unwrap_or_default();
        PyRuntimeError::new_err(format!(
            "Failed to unwrap store wrapper for EngramStore: {msg}"
        ))
    })?;
    if cap.is_none() {
        return Ok(Resolved::None);
    }
    let Ok(cap) = cap.downcast::<PyCapsule>() else {
        return Err(PyRuntimeError::new_err(
            "store wrapper returned a non-capsule PyClient handle",
        ));
    };
    if cap.name()? != Some(CAPSULE_NAME) {
        return Err(PyRuntimeError::new_err(
            "store wrapper returned an unexpected PyClient capsule type",
        ));
    }
    let ptr = cap.pointer() as *const Arc<Client>;
    if ptr.is_null() {
        return Ok(Resolved::None);
    }
    // SAFETY: a capsule with this name holds an `Arc<Client>` as its first
    // field (pyo3 `PyCapsule::new` layout); the capsule is alive while we clone.
    let client = unsafe { Arc::clone(&*ptr) };
    if client.is_closed() {
        return Ok(Resolved::None);
    }
    Ok(Resolved::Client(client))
}

/// Read the replication attributes of a `ReplicateConfig`-like object.
fn write_config(rc: Option<&Bound<'_, PyAny>>) -> PyResult<WriteConfig> {
    let mut cfg = WriteConfig::default();
    let Some(rc) = rc.filter(|r| !r.is_none()) else {
        return Ok(cfg);
    };
    if let Ok(n) = rc.getattr("replica_num") {
        cfg.replica_num = n.extract()?;
    }
    if let Ok(p) = rc.getattr("preferred_segments") {
        if let Ok(v) = p.extract::<Vec<String>>() {
            cfg.preferred_segments = v;
        }
    }
    if let Ok(p) = rc.getattr("preferred_segment") {
        if let Ok(s) = p.extract::<String>() {
            if !s.is_empty() && !cfg.preferred_segments.contains(&s) {
                cfg.preferred_segments.insert(0, s);
            }
        }
    }
    if let Ok(p) = rc.getattr("with_hard_pin") {
        cfg.hard_pin = p.extract().unwrap_or(false);
    }
    Ok(cfg)
}

/// Row ids parsed into `[B, L, H]` int64 (flat).
struct Ids {
    data: Vec<i64>,
    b: usize,
    l: usize,
}

/// One EngramStore layer: per-head tables `engram:l{layer}:h{h}`.
#[pyclass(module = "mooncake.store", name = "EngramStore", frozen)]
pub struct PyEngramStore {
    core: Arc<EngramCore>,
    vocab: Vec<i64>,
    store: Option<Py<PyAny>>,
    write_cfg: WriteConfig,
}

impl PyEngramStore {
    fn heads(&self) -> usize {
        self.vocab.len()
    }

    fn dtype(&self) -> TableDtype {
        self.core.layout().dtype
    }

    /// The usable client now, or None (metadata-only, not set up, closed).
    fn client(&self, py: Python<'_>) -> Option<Arc<Client>> {
        let store = self.store.as_ref()?.bind(py);
        match resolve_store(store) {
            Ok(Resolved::Client(c)) => Some(c),
            Ok(Resolved::None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "EngramStore: cannot resolve the store client");
                None
            }
        }
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
        if kind != "i" && kind != "u" {
            return Err(PyRuntimeError::new_err(format!(
                "row_ids must be an integer array (got dtype {}); EngramStore does not truncate floating-point ids",
                dtype.str()?
            )));
        }
        let arr = np.call_method1("ascontiguousarray", (arr, np.getattr("int64")?))?;
        let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
        if shape.len() != 3 {
            return Err(PyRuntimeError::new_err(
                "row_ids array must have shape [B, L, H]",
            ));
        }
        if shape[2] != self.heads() {
            return Err(PyRuntimeError::new_err(
                "row_ids last dimension must match num_heads",
            ));
        }
        let n = shape[0] * shape[1] * shape[2];
        let mut data = vec![0i64; n];
        if n > 0 {
            let buf = RawBuffer::get(&arr, false)?;
            if buf.len() != n * 8 {
                return Err(PyRuntimeError::new_err(LOOKUP_FAILED));
            }
            // SAFETY: the view covers n int64 values; unaligned-safe byte copy.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    buf.ptr() as *const u8,
                    data.as_mut_ptr() as *mut u8,
                    n * 8,
                )
            };
        }
        Ok(Ids {
            data,
            b: shape[0],
            l: shape[1],
        })
    }

    fn parse_ids_nested(
        &self,
        np: &Bound<'_, PyModule>,
        row_ids: &Bound<'_, PyAny>,
    ) -> PyResult<Ids> {
        let failed = || PyRuntimeError::new_err(LOOKUP_FAILED);
        let empty = || PyRuntimeError::new_err("row_ids must not be empty");
        let outer: Vec<Bound<'_, PyAny>> = row_ids.try_iter()?.collect::<PyResult<_>>()?;
        if outer.is_empty() {
            return Err(empty());
        }
        let np_integer = np.getattr("integer")?;
        let h_n = self.heads();
        let mut data = Vec::with_capacity(outer.len() * h_n);
        let mut l_n = None;
        for (bi, row) in outer.iter().enumerate() {
            let mut count_l = 0usize;
            let it = row.try_iter().map_err(|_| failed())?;
            for item in it {
                let item = item?;
                count_l += 1;
                let mut count_h = 0usize;
                for x in item.try_iter().map_err(|_| failed())? {
                    let x = x?;
                    count_h += 1;
                    let v = if let Ok(i) = x.downcast::<PyInt>() {
                        i.extract::<i64>().unwrap_or(-1)
                    } else if x.is_instance(&np_integer)? {
                        x.extract::<i64>().unwrap_or(-1)
                    } else {
                        return Err(PyRuntimeError::new_err(format!(
                            "row_ids elements must be integers (got {})",
                            x.get_type().name()?
                        )));
                    };
                    data.push(v);
                }
                if count_h != h_n {
                    tracing::warn!(b = bi, h = count_h, "EngramStore lookup: ragged row_ids");
                    return Err(failed());
                }
            }
            match l_n {
                None if count_l == 0 => return Err(empty()),
                None => l_n = Some(count_l),
                Some(l) if l != count_l => {
                    tracing::warn!(b = bi, "EngramStore lookup: ragged row_ids");
                    return Err(failed());
                }
                Some(_) => {}
            }
        }
        Ok(Ids {
            data,
            b: outer.len(),
            l: l_n.unwrap_or(0),
        })
    }

    /// Gather into a raw output with the GIL released.
    fn gather(&self, py: Python<'_>, ids: &Ids, out: &RawBuffer, kind: OutKind) -> PyResult<()> {
        let client = self.client(py);
        let core = Arc::clone(&self.core);
        let buf = OutBuf {
            ptr: out.ptr(),
            len: out.len(),
            kind,
        };
        let r = py.allow_threads(|| {
            // SAFETY: the buffer view stays alive (held by the caller) and is writable.
            unsafe { core.lookup_into(client.as_ref(), &ids.data, ids.b, ids.l, buf) }
        });
        r.map_err(|_| PyRuntimeError::new_err(LOOKUP_FAILED))
    }

    /// Convert one populate input to a contiguous array (or bf16 bits) in
    /// the table dtype; errors carry the exact spec messages.
    fn table_bytes<'py>(
        &self,
        np: &Bound<'py, PyModule>,
        h: usize,
        item: &Bound<'py, PyAny>,
    ) -> PyResult<TableSource<'py>> {
        let mut arr = item.clone();
        if is_torch_tensor(&arr) {
            arr = torch_to_numpy(&arr)
                .map_err(|_| PyRuntimeError::new_err("embedding_buffers must be NumPy arrays"))?;
        }
        if !arr.is_instance(&np.getattr("ndarray")?)? {
            return Err(PyRuntimeError::new_err(
                "embedding_buffers must be NumPy arrays",
            ));
        }
        let dt = self.dtype();
        let dtype_err =
            || PyRuntimeError::new_err(format!("embedding_buffers must be {dt} arrays"));
        let adtype = arr.getattr("dtype")?;
        let kind: String = adtype.getattr("kind")?.extract()?;
        if !"biufc".contains(kind.as_str()) || kind.len() != 1 {
            return Err(dtype_err());
        }
        let ndim: usize = arr.getattr("ndim")?.extract()?;
        if ndim != 2 {
            return Err(PyRuntimeError::new_err(
                "each embedding buffer must be 2D [N_h, D]",
            ));
        }
        let shape: (i64, i64) = arr.getattr("shape")?.extract()?;
        if shape != (self.vocab[h], self.core.layout().dim as i64) {
            return Err(PyRuntimeError::new_err(
                "embedding buffer shape does not match get_table_vocab_sizes()/get_embedding_dim()",
            ));
        }
        let target = match dt {
            TableDtype::Float32 => "float32",
            // float32 input is narrowed in Rust without the GIL (NumPy's
            // cast holds it and is slow); other dtypes are cast by NumPy.
            TableDtype::Float16 => {
                if adtype.getattr("name")?.extract::<String>()? == "float32" {
                    "float32"
                } else {
                    "float16"
                }
            }
            TableDtype::BFloat16 => {
                if adtype.getattr("name")?.extract::<String>()? == "uint16" {
                    "uint16"
                } else {
                    "float32"
                }
            }
        };
        let c = np
            .call_method1("ascontiguousarray", (&arr, np.getattr(target)?))
            .map_err(|_| dtype_err())?;
        let buf = RawBuffer::get(&c, false)?;
        if dt == TableDtype::BFloat16 && target == "float32" {
            return Ok(TableSource::ToBf16(buf, std::marker::PhantomData));
        }
        if dt == TableDtype::Float16 && target == "float32" {
            return Ok(TableSource::ToF16(buf, std::marker::PhantomData));
        }
        Ok(TableSource::View(buf, std::marker::PhantomData))
    }
}

/// One table as handed to `populate` (the views hold references to the
/// arrays, so they stay valid while the GIL is released).
enum TableSource<'py> {
    /// A contiguous array in the table dtype.
    View(RawBuffer, std::marker::PhantomData<&'py ()>),
    /// A contiguous float32 array, converted to bfloat16 bits without the GIL.
    ToBf16(RawBuffer, std::marker::PhantomData<&'py ()>),
    /// A contiguous float32 array, converted to float16 bits without the GIL.
    ToF16(RawBuffer, std::marker::PhantomData<&'py ()>),
}

/// `f` (a round-to-nearest-even narrowing) of the `len / 4` float32 values
/// at `ptr` (read unaligned).
///
/// # Safety
/// `ptr..ptr+len` must be readable.
unsafe fn half_bits(ptr: usize, len: usize, f: impl Fn(f32) -> u16) -> Vec<u16> {
    (0..len / 4)
        .map(|i| f(std::ptr::read_unaligned((ptr as *const f32).add(i))))
        .collect()
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
        replicate_config: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let layer_id = extract_i32(layer_id, "layer_id")?;
        let cfg: PyEngramStoreConfig = config
            .downcast::<PyEngramStoreConfig>()
            .map_err(|_| PyTypeError::new_err("config must be an EngramStoreConfig"))?
            .borrow()
            .clone();
        let layout = validate_layout(&cfg.vocab, cfg.dim as i64, &cfg.dtype)
            .map_err(PyValueError::new_err)?;
        let store = match store.filter(|s| !s.is_none()) {
            None => None,
            Some(s) => {
                if !s.hasattr("_get_pyclient_capsule")? {
                    return Err(PyRuntimeError::new_err(
                        "EngramStore store parameter must be a PyClient or store wrapper that implements _get_pyclient_capsule()",
                    ));
                }
                resolve_store(s)?;
                Some(s.clone().unbind())
            }
        };
        Ok(PyEngramStore {
            core: Arc::new(EngramCore::new(layer_id, layout)),
            vocab: cfg.vocab,
            store,
            write_cfg: write_config(replicate_config)?,
        })
    }

    /// Upload one `[N_h, D]` table per head (create-only, rolled back on failure).
    fn populate(&self, py: Python<'_>, embedding_buffers: &Bound<'_, PyAny>) -> PyResult<()> {
        let np = numpy(py)?;
        if embedding_buffers.len()? != self.heads() {
            return Err(PyRuntimeError::new_err(
                "embedding_buffers size must match num_heads",
            ));
        }
        let mut sources = Vec::with_capacity(self.heads());
        for h in 0..self.heads() {
            let item = embedding_buffers.get_item(h)?;
            sources.push(self.table_bytes(np, h, &item)?);
        }
        let Some(client) = self.client(py) else {
            tracing::warn!("EngramStore populate: no usable store");
            return Err(PyRuntimeError::new_err(POPULATE_FAILED));
        };
        // (conversion, pointer, bytes); conversion 1 = bfloat16, 2 = float16.
        let raw: Vec<(u8, usize, usize)> = sources
            .iter()
            .map(|s| match s {
                TableSource::View(b, _) => (0, b.ptr(), b.len()),
                TableSource::ToBf16(b, _) => (1, b.ptr(), b.len()),
                TableSource::ToF16(b, _) => (2, b.ptr(), b.len()),
            })
            .collect();
        let core = Arc::clone(&self.core);
        let cfg = self.write_cfg.clone();
        // SAFETY: `sources` keeps every array alive until after the call.
        let ok = py.allow_threads(|| unsafe {
            let converted: Vec<Option<Vec<u16>>> = raw
                .iter()
                .map(|&(conv, p, n)| match conv {
                    1 => Some(half_bits(p, n, f32_to_bf16)),
                    2 => Some(half_bits(p, n, f32_to_f16)),
                    _ => None,
                })
                .collect();
            let spans: Vec<(usize, usize)> = raw
                .iter()
                .zip(&converted)
                .map(|(&(_, p, n), c)| match c {
                    Some(v) => (v.as_ptr() as usize, v.len() * 2),
                    None => (p, n),
                })
                .collect();
            core.populate(&client, &spans, &cfg)
        });
        drop(sources);
        if ok {
            Ok(())
        } else {
            Err(PyRuntimeError::new_err(POPULATE_FAILED))
        }
    }

    /// Gather rows: `[B, L, H]` ids -> new `[B, L, H, D]` array.
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        row_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ids = self.parse_ids(row_ids)?;
        let np = numpy(py)?;
        let (dtype, kind) = match self.dtype() {
            TableDtype::Float16 => ("float16", OutKind::Raw),
            _ => ("float32", OutKind::Float32),
        };
        let shape = (ids.b, ids.l, self.heads(), self.core.layout().dim);
        let out = np.call_method1("empty", (shape, np.getattr(dtype)?))?;
        {
            let buf = RawBuffer::get(&out, true)?;
            self.gather(py, &ids, &buf, kind)?;
        }
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
        let dim = self.core.layout().dim;
        let expected = (ids.b, ids.l, self.heads(), dim);
        let allowed: &[&str] = match self.dtype() {
            TableDtype::Float32 => &["float32"],
            TableDtype::Float16 => &["float16", "float32"],
            TableDtype::BFloat16 => &["uint16", "float32"],
        };
        let bad = || {
            PyRuntimeError::new_err(format!(
                "out must be a C-contiguous writable array of shape (B, L, H, D)=({}, {}, {}, {}) and dtype {}",
                expected.0,
                expected.1,
                expected.2,
                expected.3,
                allowed.join(" or ")
            ))
        };
        let arr = if is_torch_tensor(out) {
            torch_to_numpy(out).map_err(|_| bad())?
        } else {
            out.clone()
        };
        if !arr.is_instance(&np.getattr("ndarray")?)? {
            return Err(bad());
        }
        let flags = arr.getattr("flags")?;
        let contiguous: bool = flags.getattr("c_contiguous")?.extract()?;
        let writable: bool = flags.getattr("writeable")?.extract()?;
        let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
        let dname: String = arr.getattr("dtype")?.getattr("name")?.extract()?;
        if !contiguous
            || !writable
            || shape != [expected.0, expected.1, expected.2, expected.3]
            || !allowed.contains(&dname.as_str())
        {
            return Err(bad());
        }
        let kind = if dname == "float32" {
            OutKind::Float32
        } else {
            OutKind::Raw
        };
        {
            let buf = RawBuffer::get(&arr, true)?;
            self.gather(py, &ids, &buf, kind)?;
        }
        Ok(out.clone())
    }

    /// Remove all H tables (one batched remove); returns the number removed.
    #[pyo3(signature = (force=false))]
    fn remove_from_store(&self, py: Python<'_>, force: bool) -> PyResult<usize> {
        let Some(client) = self.client(py) else {
            self.core.invalidate();
            return Err(PyRuntimeError::new_err("remove_from_store failed, rc=-600"));
        };
        let core = Arc::clone(&self.core);
        py.allow_threads(|| core.remove(&client, force))
            .map_err(|rc| PyRuntimeError::new_err(format!("remove_from_store failed, rc={rc}")))
    }

    /// Per-head row counts (a copy).
    fn get_table_vocab_sizes(&self) -> Vec<i64> {
        self.vocab.clone()
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
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngramStoreConfig>()?;
    m.add_class::<PyEngramStore>()?;
    Ok(())
}
