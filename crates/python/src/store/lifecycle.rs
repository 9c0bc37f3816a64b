//! Lifecycle methods: `setup`, `close`, `get_hostname`, `health_check`,
//! `_get_pyclient_capsule` and `get_client_stats` (store spec, "Lifecycle").

use super::capsule::client_capsule;
use super::class::MooncakeDistributedStore;
use super::setup;
use crate::report::Call;
use mooncake_client::{Client, Error, HEALTH_CLOSED};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};
use std::sync::Arc;

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
    ) -> PyResult<i64> {
        let call = Call::new(py, "setup");
        let mut notes = Vec::new();
        let parsed = setup::parse(args, kwargs, &mut notes)?;
        close_client(py, self.replace(None));
        let checked = parsed.and_then(|cfg| cfg.check(&mut notes).map(|()| cfg));
        for note in &notes {
            call.note(note);
        }
        let result = checked.and_then(|cfg| py.allow_threads(|| Client::setup(cfg)));
        Ok(call.code(
            None,
            result.map(|client| {
                // A concurrent setup may have installed another client meanwhile.
                close_client(py, self.replace(Some(client)));
            }),
        ))
    }

    /// Unmount and disconnect; idempotent, returns 0.
    fn close(&self, py: Python<'_>) -> i32 {
        close_client(py, self.replace(None));
        0
    }

    /// The segment name `host:port`, or `""` when not set up.
    fn get_hostname(&self, py: Python<'_>) -> String {
        let r = self
            .current()
            .map(|c| c.hostname())
            .ok_or_else(Error::not_set_up);
        Call::new(py, "get_hostname")
            .ok(None, r)
            .unwrap_or_default()
    }

    /// 0 healthy, 1 not set up or closed, 2 the last heartbeat failed.
    fn health_check(&self) -> i32 {
        self.current().map_or(HEALTH_CLOSED, |c| c.health())
    }

    /// A `PyCapsule` named `mooncake.PyClient.shared_ptr` holding a reference
    /// to this store's client, or `None` when not set up.
    fn _get_pyclient_capsule<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<Bound<'py, PyCapsule>>> {
        self.current().map(|c| client_capsule(py, c)).transpose()
    }

    /// Cumulative client counters (`bytes_read_local`, ..., `master_rpcs`,
    /// `same_host_mappings`); `{}` when not set up.
    fn get_client_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let r = self.current().ok_or_else(Error::not_set_up);
        if let Some(c) = Call::new(py, "get_client_stats").ok(None, r) {
            for (name, value) in c.stats() {
                d.set_item(name, value)?;
            }
        }
        Ok(d)
    }
}
