//! `save_tensor_to_safetensor(key, file_name=None)` and
//! `load_tensor_from_safetensor(key=None, file_name)` (upstream's
//! signatures): the client moves the bytes (`Client::save_safetensor`,
//! `Client::load_safetensor`), the format rules are `mooncake_tensor`'s.
//! Returns: `0`, or FILE_NOT_FOUND (-1100) for a missing key and the
//! failure's code otherwise; the loaded tensor, or `None` on any failure.
//! Every failure logs one line naming the key and the file.

use super::torch;
use crate::report::Call;
use crate::store::MooncakeDistributedStore;
use mooncake_client::{ErrorCode, ObjectIo};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use std::path::PathBuf;

/// Upstream's FILE_NOT_FOUND code, returned when the key to export is missing.
const FILE_NOT_FOUND: i64 = -1100;

#[pymethods]
impl MooncakeDistributedStore {
    /// Export the tensor stored under `key` into a safetensors file (named
    /// `key` when `file_name` is None).
    #[pyo3(signature = (key, file_name=None))]
    fn save_tensor_to_safetensor(
        &self,
        py: Python<'_>,
        key: String,
        file_name: Option<String>,
    ) -> i64 {
        let path = PathBuf::from(file_name.unwrap_or_else(|| key.clone()));
        let r = self.run(py, |c| c.save_safetensor(&key, &path));
        let call = Call::new(py, "save_tensor_to_safetensor");
        match r {
            Ok(()) => 0,
            Err(e) => {
                call.fail(
                    Some(&key),
                    &e.clone().context(format!("file {}", path.display())),
                );
                if e.code() == ErrorCode::ObjectNotFound {
                    FILE_NOT_FOUND
                } else {
                    i64::from(e.code().code())
                }
            }
        }
    }

    /// Load a tensor from a safetensors file, store it under `key` (the file
    /// name when None) and return it; `None` on failure.
    #[pyo3(signature = (key=None, file_name=None))]
    fn load_tensor_from_safetensor(
        &self,
        py: Python<'_>,
        key: Option<String>,
        file_name: Option<String>,
    ) -> PyResult<Option<PyObject>> {
        let call = Call::new(py, "load_tensor_from_safetensor");
        let Some(file_name) = file_name else {
            return Err(PyTypeError::new_err(
                "load_tensor_from_safetensor() missing required argument 'file_name'",
            ));
        };
        let path = PathBuf::from(&file_name);
        let r = self.run(py, |c| c.load_safetensor(key.as_deref(), &path));
        let loaded = match r {
            Ok(l) => l,
            Err(e) => {
                call.fail(key.as_deref(), &e.context(format!("file {file_name}")));
                return Ok(None);
            }
        };
        if !loaded.matched && key.is_some() {
            call.note(&format!(
                "key {:?} not found in safetensor file {file_name}; using first entry {:?}",
                loaded.key, loaded.name
            ));
        }
        let h = &loaded.header;
        let t = torch::empty(py, h.dtype, &h.local_shape)?;
        let data = loaded.data();
        if !data.is_empty() {
            let dst = torch::data_ptr(&t)?;
            // SAFETY: `t` is a fresh contiguous tensor of exactly
            // `data.len()` bytes (its shape and dtype come from the header
            // whose size was checked against the payload).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len()) };
        }
        Ok(Some(t.unbind()))
    }
}
