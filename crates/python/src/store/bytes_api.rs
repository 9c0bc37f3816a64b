//! Byte-value API: `put`, `put_parts`, `put_batch`, their `upsert`
//! variants, `get`, `get_batch`, `get_buffer`, `batch_get_buffer`,
//! `get_size`, `is_exist` and `batch_is_exist`.

use super::args::one_of;
use super::batch::Plan;
use super::buffer::{acquire_all, BufferHandle, InputBuffer};
use super::class::{MooncakeDistributedStore, NOT_SET_UP};
use super::config::{ReplicateConfig, WriteKind};
use super::log;
use mooncake_client::StagedValue;
use mooncake_common::ErrorCode;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use std::collections::HashSet;

const INVALID: i32 = ErrorCode::InvalidParams as i32;

/// Build the client write config from an optional `ReplicateConfig`.
pub(super) fn write_config(
    config: Option<&PyRef<'_, ReplicateConfig>>,
    n_keys: Option<usize>,
) -> Result<mooncake_common::proto::WriteConfig, super::config::Rejection> {
    match config {
        Some(c) => c.to_write_config(WriteKind::Bytes, n_keys),
        None => ReplicateConfig::default().to_write_config(WriteKind::Bytes, n_keys),
    }
}

impl MooncakeDistributedStore {
    /// Shared body of put/put_parts/upsert/upsert_parts.
    #[allow(clippy::too_many_arguments)]
    fn write_parts(
        &self,
        py: Python<'_>,
        method: &str,
        key: &str,
        parts: &[InputBuffer],
        config: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
        empty_is_ok: bool,
    ) -> i32 {
        let Some(client) = self.client_or_log(py, method, Some(key)) else {
            return NOT_SET_UP;
        };
        if key.is_empty() {
            log::fail(py, method, Some(key), INVALID as i64, "empty key");
            return INVALID;
        }
        let total: usize = parts.iter().map(InputBuffer::len).sum();
        if total == 0 {
            if empty_is_ok {
                let msg = format!(
                    "{method}: key={}: no data given; nothing stored",
                    log::show_key(key)
                );
                log::emit(py, log::Level::Warning, &msg);
                return 0;
            }
            log::fail(py, method, Some(key), INVALID as i64, "empty value");
            return INVALID;
        }
        let cfg = match write_config(config.as_ref(), None) {
            Ok(cfg) => cfg,
            Err((code, why)) => {
                log::fail(py, method, Some(key), code.code() as i64, why);
                return code.code();
            }
        };
        drop(config);
        let slices: Vec<&[u8]> = parts.iter().map(InputBuffer::as_slice).collect();
        let rc = py.allow_threads(|| client.put_parts(key, &slices, &cfg, upsert));
        if rc < 0 {
            log::fail(py, method, Some(key), rc as i64, "");
        }
        rc
    }

    /// Shared body of put_batch/upsert_batch.
    fn write_batch(
        &self,
        py: Python<'_>,
        method: &str,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
        config: Option<PyRef<'_, ReplicateConfig>>,
        upsert: bool,
    ) -> PyResult<i32> {
        let buffers = acquire_all(&values)?;
        let Some(client) = self.client_or_log_all(py, method, keys.len()) else {
            return Ok(NOT_SET_UP);
        };
        let reject = |why: &str| {
            log::fail_all(py, method, keys.len(), INVALID as i64, why);
            Ok(INVALID)
        };
        if keys.len() != buffers.len() {
            return reject("keys and values differ in length");
        }
        if keys.is_empty() {
            return Ok(0);
        }
        if keys.iter().any(String::is_empty) {
            return reject("empty key");
        }
        if buffers.iter().any(|b| b.len() == 0) {
            return reject("empty value");
        }
        let cfg = match write_config(config.as_ref(), Some(keys.len())) {
            Ok(cfg) => cfg,
            Err((code, why)) => {
                log::fail_all(py, method, keys.len(), code.code() as i64, why);
                return Ok(code.code());
            }
        };
        drop(config);
        // Duplicate keys: the first value wins.
        let mut seen = HashSet::with_capacity(keys.len());
        let mut batch_keys = Vec::with_capacity(keys.len());
        let mut slices: Vec<&[u8]> = Vec::with_capacity(keys.len());
        for (k, b) in keys.iter().zip(&buffers) {
            if seen.insert(k.as_str()) {
                batch_keys.push(k.clone());
                slices.push(b.as_slice());
            }
        }
        let rc = py.allow_threads(|| client.put_batch(&batch_keys, &slices, &cfg, upsert));
        if rc < 0 {
            log::fail_all(
                py,
                method,
                batch_keys.len(),
                rc as i64,
                "first failing code",
            );
        }
        Ok(rc)
    }

    /// Staged read of one key; `None` (after logging) on any failure.
    fn read_one(&self, py: Python<'_>, method: &str, key: &str) -> Option<StagedValue> {
        let client = self.client_or_log(py, method, Some(key))?;
        if key.is_empty() {
            log::fail(py, method, Some(key), INVALID as i64, "empty key");
            return None;
        }
        match py.allow_threads(|| client.get(key)) {
            Ok(v) => Some(v),
            Err(e) => {
                log::fail(py, method, Some(key), e.code() as i64, "");
                None
            }
        }
    }

    /// Staged read of many keys; one `None` per failed key, one log line per call.
    fn read_many(&self, py: Python<'_>, method: &str, keys: &[String]) -> Vec<Option<StagedValue>> {
        let Some(client) = self.client_or_log_all(py, method, keys.len()) else {
            return keys.iter().map(|_| None).collect();
        };
        let plan = Plan::reject_empty_keys(keys);
        let sent = plan.pick(keys);
        let answers = if sent.is_empty() {
            Vec::new()
        } else {
            py.allow_threads(|| client.get_batch(&sent))
        };
        let merged = plan.merge(
            answers
                .into_iter()
                .map(|r| r.map_err(|e| e.code() as i64))
                .collect(),
            Err,
        );
        log::fail_results(py, method, keys, merged)
    }

    /// Staged read of many keys straight into new `bytes` objects: the
    /// objects are allocated (uninitialised) once the sizes are known and
    /// filled with the GIL released, so the value is copied exactly once.
    /// One `None` per failed key, one log line per call.
    fn read_bytes(
        &self,
        py: Python<'_>,
        method: &str,
        keys: &[String],
    ) -> Vec<Option<Py<PyBytes>>> {
        let Some(client) = self.client_or_log_all(py, method, keys.len()) else {
            return keys.iter().map(|_| None).collect();
        };
        let plan = Plan::reject_empty_keys(keys);
        let sent = plan.pick(keys);
        let mut objects: Vec<Option<Py<PyBytes>>> = Vec::new();
        let answers = if sent.is_empty() {
            Vec::new()
        } else {
            py.allow_threads(|| {
                client.get_batch_with(&sent, |sizes| {
                    Python::with_gil(|py| {
                        sizes
                            .iter()
                            .map(|s| {
                                let b = s.as_ref().ok().and_then(|n| uninit_bytes(py, *n as usize));
                                let ptr = b.as_ref().map(|(_, p)| *p);
                                objects.push(b.map(|(o, _)| o));
                                ptr
                            })
                            .collect()
                    })
                })
            })
        };
        let mut objects = objects.into_iter();
        let merged = plan.merge(
            answers
                .into_iter()
                .map(|r| {
                    let obj = objects.next().flatten();
                    match (r, obj) {
                        (Ok(_), Some(o)) => Ok(o),
                        (Ok(_), None) => Err(ErrorCode::InternalError.code() as i64),
                        (Err(e), _) => Err(e.code() as i64),
                    }
                })
                .collect(),
            Err,
        );
        log::fail_results(py, method, keys, merged)
    }

    /// Per-key `is_exist` with binding-side checks and logging.
    fn exist_many(&self, py: Python<'_>, method: &str, keys: &[String]) -> Vec<i32> {
        let Some(client) = self.client_or_log_all(py, method, keys.len()) else {
            return vec![NOT_SET_UP; keys.len()];
        };
        let plan = Plan::reject_empty_keys(keys);
        let sent = plan.pick(keys);
        let answers = if sent.is_empty() {
            Vec::new()
        } else {
            py.allow_threads(|| client.is_exist(&sent))
        };
        let merged = plan.merge(answers, |c| c as i32);
        log::fail_codes(py, method, keys, &merged);
        merged
    }
}

/// A new, uninitialised `bytes` object of `n` bytes and its data pointer.
/// The caller must fill all `n` bytes before the object is shared.
fn uninit_bytes(py: Python<'_>, n: usize) -> Option<(Py<PyBytes>, usize)> {
    let len = pyo3::ffi::Py_ssize_t::try_from(n).ok()?;
    // SAFETY: NULL source asks CPython for an uninitialised buffer; we hold the GIL.
    unsafe {
        let obj = pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), len);
        if obj.is_null() {
            pyo3::ffi::PyErr_Clear();
            return None;
        }
        let data = pyo3::ffi::PyBytes_AsString(obj) as usize;
        let b: Bound<'_, PyBytes> = Bound::from_owned_ptr(py, obj).downcast_into_unchecked();
        Some((b.unbind(), data))
    }
}

/// `b""` for a failed read.
fn empty_bytes(py: Python<'_>) -> Bound<'_, PyBytes> {
    PyBytes::new(py, b"")
}

#[pymethods]
impl MooncakeDistributedStore {
    /// Store `value` (any buffer-protocol object) under `key`; write-once.
    #[pyo3(signature = (key, value, config=None))]
    fn put(
        &self,
        py: Python<'_>,
        key: String,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        let buf = InputBuffer::acquire(value)?;
        Ok(self.write_parts(py, "put", &key, &[buf], config, false, false))
    }

    /// Insert or replace `key` with `value`.
    #[pyo3(signature = (key, value, config=None))]
    fn upsert(
        &self,
        py: Python<'_>,
        key: String,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        let buf = InputBuffer::acquire(value)?;
        Ok(self.write_parts(py, "upsert", &key, &[buf], config, true, false))
    }

    /// Store the concatenation of `parts`; no data at all stores nothing and returns 0.
    #[pyo3(signature = (key, *parts, config=None))]
    fn put_parts(
        &self,
        py: Python<'_>,
        key: String,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        let bufs = acquire_all(&parts.iter().collect::<Vec<_>>())?;
        Ok(self.write_parts(py, "put_parts", &key, &bufs, config, false, true))
    }

    /// Insert or replace `key` with the concatenation of `parts`.
    #[pyo3(signature = (key, *parts, config=None))]
    fn upsert_parts(
        &self,
        py: Python<'_>,
        key: String,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        let bufs = acquire_all(&parts.iter().collect::<Vec<_>>())?;
        Ok(self.write_parts(py, "upsert_parts", &key, &bufs, config, true, true))
    }

    /// Store many values; 0 or the first failing code.
    #[pyo3(signature = (keys, values, config=None))]
    fn put_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        self.write_batch(py, "put_batch", keys, values, config, false)
    }

    /// Insert or replace many values; 0 or the first failing code.
    #[pyo3(signature = (keys, values, config=None))]
    fn upsert_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: Vec<Bound<'_, PyAny>>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        self.write_batch(py, "upsert_batch", keys, values, config, true)
    }

    /// The value of `arg0` (alias `key=`), or `b""` on any failure.
    #[pyo3(signature = (arg0=None, *, key=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        arg0: Option<String>,
        key: Option<String>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let key = one_of("get", arg0, key, "key")?;
        let mut v = self.read_bytes(py, "get", std::slice::from_ref(&key));
        Ok(match v.pop().flatten() {
            Some(b) => b.into_bound(py),
            None => empty_bytes(py),
        })
    }

    /// One value per key of `arg0` (alias `keys=`), `b""` for failures;
    /// `get_batch([])` returns `[b""]` (upstream quirk).
    #[pyo3(signature = (arg0=None, *, keys=None))]
    fn get_batch<'py>(
        &self,
        py: Python<'py>,
        arg0: Option<Vec<String>>,
        keys: Option<Vec<String>>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let keys = one_of("get_batch", arg0, keys, "keys")?;
        if keys.is_empty() {
            log::emit(
                py,
                log::Level::Warning,
                "get_batch: no keys given; returning [b\"\"]",
            );
            return Ok(vec![empty_bytes(py)]);
        }
        let values = self.read_bytes(py, "get_batch", &keys);
        Ok(values
            .into_iter()
            .map(|v| match v {
                Some(b) => b.into_bound(py),
                None => empty_bytes(py),
            })
            .collect())
    }

    /// A `BufferHandle` with the value of `arg0` (alias `key=`), or `None`.
    #[pyo3(signature = (arg0=None, *, key=None))]
    fn get_buffer(
        &self,
        py: Python<'_>,
        arg0: Option<String>,
        key: Option<String>,
    ) -> PyResult<Option<BufferHandle>> {
        let key = one_of("get_buffer", arg0, key, "key")?;
        Ok(self.read_one(py, "get_buffer", &key).map(BufferHandle::new))
    }

    /// One `BufferHandle` (or `None`) per key of `arg0` (alias `keys=`).
    #[pyo3(signature = (arg0=None, *, keys=None))]
    fn batch_get_buffer(
        &self,
        py: Python<'_>,
        arg0: Option<Vec<String>>,
        keys: Option<Vec<String>>,
    ) -> PyResult<Vec<Option<BufferHandle>>> {
        let keys = one_of("batch_get_buffer", arg0, keys, "keys")?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self
            .read_many(py, "batch_get_buffer", &keys)
            .into_iter()
            .map(|v| v.map(BufferHandle::new))
            .collect())
    }

    /// Size of the object `arg0` (alias `key=`), or a negative code. Grants a lease.
    #[pyo3(signature = (arg0=None, *, key=None))]
    fn get_size(&self, py: Python<'_>, arg0: Option<String>, key: Option<String>) -> PyResult<i64> {
        let key = one_of("get_size", arg0, key, "key")?;
        let Some(client) = self.client_or_log(py, "get_size", Some(&key)) else {
            return Ok(NOT_SET_UP as i64);
        };
        if key.is_empty() {
            log::fail(py, "get_size", Some(&key), INVALID as i64, "empty key");
            return Ok(INVALID as i64);
        }
        let size = py.allow_threads(|| client.get_size(&key));
        if size < 0 {
            log::fail(py, "get_size", Some(&key), size, "");
        }
        Ok(size)
    }

    /// 1 if `arg0` (alias `key=`) has a complete replica, 0 if not, negative on error.
    #[pyo3(signature = (arg0=None, *, key=None))]
    fn is_exist(&self, py: Python<'_>, arg0: Option<String>, key: Option<String>) -> PyResult<i32> {
        let key = one_of("is_exist", arg0, key, "key")?;
        let Some(client) = self.client_or_log(py, "is_exist", Some(&key)) else {
            return Ok(NOT_SET_UP);
        };
        if key.is_empty() {
            log::fail(py, "is_exist", Some(&key), INVALID as i64, "empty key");
            return Ok(INVALID);
        }
        let codes = py.allow_threads(|| client.is_exist(std::slice::from_ref(&key)));
        let code = codes
            .first()
            .copied()
            .unwrap_or(ErrorCode::InternalError.code());
        if code < 0 {
            log::fail(py, "is_exist", Some(&key), code as i64, "");
        }
        Ok(code)
    }

    /// `is_exist` per key; `[]` for `[]`.
    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        if keys.is_empty() {
            return Vec::new();
        }
        self.exist_many(py, "batch_is_exist", &keys)
    }
}
