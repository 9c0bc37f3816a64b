//! TEMP: a minimal store client for EngramStore tests until the
//! `MooncakeDistributedStore` binding is merged. Drop this file (and its two
//! lines in lib.rs) once that binding provides `_get_pyclient_capsule()`.

use crate::engram::CAPSULE_NAME;
use mooncake_client::{Client, ClientConfig, WriteConfig};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyDict};
use std::sync::Arc;

/// Test-only client wrapper exposing the capsule and a few store calls.
#[pyclass(module = "mooncake._native", name = "_EngramTestClient", frozen)]
pub struct EngramTestClient {
    client: parking_lot::Mutex<Option<Arc<Client>>>,
}

impl EngramTestClient {
    fn get_client(&self) -> PyResult<Arc<Client>> {
        self.client
            .lock()
            .clone()
            .ok_or_else(|| PyRuntimeError::new_err("closed"))
    }
}

#[pymethods]
impl EngramTestClient {
    /// Set up a client (tcp, P2PHANDSHAKE metadata) against `master_addr`.
    #[new]
    #[pyo3(signature = (master_addr, global_segment_size, local_buffer_size=64 << 20, local_hostname="127.0.0.1".to_string()))]
    fn new(
        py: Python<'_>,
        master_addr: String,
        global_segment_size: u64,
        local_buffer_size: u64,
        local_hostname: String,
    ) -> PyResult<Self> {
        let cfg = ClientConfig {
            local_hostname,
            metadata_server: "P2PHANDSHAKE".into(),
            global_segment_size,
            local_buffer_size,
            protocol: "tcp".into(),
            master_server_addr: master_addr,
        };
        let c = py
            .allow_threads(|| Client::setup(cfg))
            .map_err(|e| PyRuntimeError::new_err(format!("setup failed: {e}")))?;
        Ok(EngramTestClient {
            client: parking_lot::Mutex::new(Some(c)),
        })
    }

    fn _get_pyclient_capsule<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<Bound<'py, PyCapsule>>> {
        match self.client.lock().clone() {
            Some(c) => Ok(Some(PyCapsule::new(py, c, Some(CAPSULE_NAME.to_owned()))?)),
            None => Ok(None),
        }
    }

    fn get<'py>(&self, py: Python<'py>, key: String) -> PyResult<Bound<'py, PyBytes>> {
        let c = self.get_client()?;
        match py.allow_threads(|| c.get(&key)) {
            Ok(v) => Ok(PyBytes::new(py, &v.data)),
            Err(_) => Ok(PyBytes::new(py, b"")),
        }
    }

    fn put(&self, key: String, value: Vec<u8>) -> PyResult<i32> {
        Ok(self
            .get_client()?
            .put_parts(&key, &[&value], &WriteConfig::default(), false))
    }

    fn batch_is_exist(&self, keys: Vec<String>) -> PyResult<Vec<i32>> {
        Ok(self.get_client()?.is_exist(&keys))
    }

    #[pyo3(signature = (key, force=false))]
    fn remove(&self, key: String, force: bool) -> PyResult<i32> {
        Ok(self.get_client()?.remove(&[key], force)[0])
    }

    fn get_client_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.get_client()?.stats() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn close(&self) -> i32 {
        if let Some(c) = self.client.lock().take() {
            c.close();
        }
        0
    }
}
