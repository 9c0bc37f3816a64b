//! Lifecycle methods: `setup`, `close`, `get_hostname`, `health_check`,
//! `_get_pyclient_capsule` and `get_client_stats`.

use super::class::MooncakeDistributedStore;
use super::{log, setup, CLIENT_CAPSULE_NAME};
use mooncake_client::Client;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};
use std::ffi::CString;
use std::sync::Arc;

/// `health_check()` value for a store that is not set up or closed.
const HEALTH_NOT_SET_UP: i32 = 1;

fn close_client(py: Python<'_>, client: Option<Arc<Client>>) {
    if let Some(c) = client {
        py.allow_threads(|| c.close());
    }
}

#[pymethods]
impl MooncakeDistributedStore {
    /// `setup(local_hostname, metadata_server, global_segment_size,
    /// local_buffer_size, protocol, rdma_devices, master_server_addr,
    /// engine=None, enable_ssd_offload=False, ssd_offload_path="",
    /// tenant_id="default", enable_client_http_server=False,
    /// client_http_port=9300) -> int`, or `setup(config: dict) -> int`.
    ///
    /// A store that is already set up is closed first.
    #[pyo3(signature = (*args, **kwargs))]
    fn setup(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<i32> {
        let parsed = setup::parse(py, args, kwargs)?;
        close_client(py, self.replace(None));
        let cfg = match parsed {
            Ok(cfg) => cfg,
            Err((code, why)) => {
                log::fail(py, "setup", None, code as i64, &why);
                return Ok(code);
            }
        };
        let target = format!(
            "master {} as {}",
            cfg.master_server_addr, cfg.local_hostname
        );
        match py.allow_threads(|| Client::setup(cfg)) {
            Ok(client) => {
                // A concurrent setup may have installed another client meanwhile.
                close_client(py, self.replace(Some(client)));
                Ok(0)
            }
            Err(e) => {
                log::fail(py, "setup", None, e.code() as i64, &target);
                Ok(e.code())
            }
        }
    }

    /// Unmount and disconnect; idempotent, returns 0.
    fn close(&self, py: Python<'_>) -> i32 {
        close_client(py, self.replace(None));
        0
    }

    /// The segment name `host:port`, or `""` when not set up.
    fn get_hostname(&self, py: Python<'_>) -> String {
        match self.client_or_log(py, "get_hostname", None) {
            Some(c) => c.hostname(),
            None => String::new(),
        }
    }

    /// 0 healthy, 1 not set up or closed, 2 the last heartbeat failed.
    fn health_check(&self) -> i32 {
        self.current().map_or(HEALTH_NOT_SET_UP, |c| c.health())
    }

    /// A `PyCapsule` named `mooncake.PyClient.shared_ptr` holding a reference
    /// to this store's client, or `None` when not set up.
    fn _get_pyclient_capsule<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<Bound<'py, PyCapsule>>> {
        let Some(client) = self.current() else {
            return Ok(None);
        };
        let name = CString::new(CLIENT_CAPSULE_NAME)?;
        PyCapsule::new(py, client, Some(name)).map(Some)
    }

    /// Cumulative client counters (`bytes_read_local`, ..., `master_rpcs`,
    /// `same_host_mappings`); `{}` when not set up.
    fn get_client_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        if let Some(c) = self.client_or_log(py, "get_client_stats", None) {
            for (name, value) in c.stats() {
                d.set_item(name, value)?;
            }
        }
        Ok(d)
    }
}
