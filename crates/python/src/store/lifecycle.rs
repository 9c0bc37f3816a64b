//! Lifecycle methods: `setup`, `setup_dummy`, `close`, `get_hostname`,
//! `health_check`, `_get_pyclient_capsule` and `get_client_stats`
//! (`setup_dummy` attaches to a standalone `mooncake_client` daemon).

use super::capsule::client_capsule;
use super::class::MooncakeDistributedStore;
use super::class::Store;
use super::setup;
use crate::args::UInt;
use crate::report::Call;
use mooncake_client::{Client, Error, HEALTH_CLOSED};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};
use std::sync::Arc;

fn close_client(py: Python<'_>, store: Option<Arc<Store>>) {
    if let Some(s) = store {
        py.allow_threads(|| s.close());
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

    /// `setup_dummy(mem_pool_size, local_buffer_size, server_address) -> int`:
    /// attach, as a dummy client, to the `mooncake_client` daemon serving
    /// `server_address`'s port on this host. 0, or -1 (upstream's code) on
    /// any failure, with the reason logged. A store that is already set up
    /// is closed first.
    fn setup_dummy(
        &self,
        py: Python<'_>,
        mem_pool_size: UInt,
        local_buffer_size: UInt,
        server_address: String,
    ) -> i64 {
        let call = Call::new(py, "setup_dummy");
        close_client(py, self.replace(None));
        let result = py.allow_threads(|| {
            mooncake_standalone::setup_dummy(mem_pool_size.0, local_buffer_size.0, &server_address)
        });
        call.code(
            None,
            result.map(|dummy| {
                close_client(py, self.replace(Some(dummy)));
            }),
        )
    }

    /// `alloc_from_mem_pool(size) -> int`: shared memory from a dummy
    /// client's pool (the daemon reads and writes it in place), or 0 on
    /// failure or when the store is not a dummy client.
    fn alloc_from_mem_pool(&self, py: Python<'_>, arg0: UInt) -> u64 {
        let r = match self.store() {
            Some(s) => py.allow_threads(|| s.alloc_from_mem_pool(arg0.0)),
            None => Err(Error::internal(
                "alloc_from_mem_pool needs a dummy client (setup_dummy)",
            )),
        };
        Call::new(py, "alloc_from_mem_pool")
            .ok(None, r)
            .unwrap_or(0)
    }

    /// Unmount and disconnect; idempotent, returns 0.
    fn close(&self, py: Python<'_>) -> i32 {
        close_client(py, self.replace(None));
        0
    }

    /// The segment name `host:port`, or `""` when not set up.
    fn get_hostname(&self, py: Python<'_>) -> String {
        let r = self
            .store()
            .map(|c| c.hostname())
            .ok_or_else(Error::not_set_up);
        Call::new(py, "get_hostname")
            .ok(None, r)
            .unwrap_or_default()
    }

    /// 0 healthy, 1 not set up or closed, 2 the last heartbeat failed.
    fn health_check(&self, py: Python<'_>) -> i32 {
        match self.store() {
            Some(s) => py.allow_threads(|| s.health()),
            None => HEALTH_CLOSED,
        }
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
        let r = self.store().ok_or_else(Error::not_set_up);
        if let Some(c) = Call::new(py, "get_client_stats").ok(None, r) {
            for (name, value) in py.allow_threads(|| c.stats()) {
                d.set_item(name, value)?;
            }
        }
        Ok(d)
    }
}
