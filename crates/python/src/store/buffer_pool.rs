//! `BufferPool`, `BufferLease` and `BufferLeaseView` (upstream's names, also
//! exported as `RegisteredBufferPool`, `RegisteredBufferLease` and
//! `RegisteredBufferLeaseView`). The lease rules live in
//! `mooncake_client::LeasePool`; every failure is a `RuntimeError` with the
//! rule's message. A blocking `acquire` waits with the GIL released.

use super::capsule::store_client;
use crate::args::UInt;
use crate::buffer::{export_object, exporter_new, exporting_type, Exporter};
use crate::family::method_family;
use mooncake_client::{Lease, LeasePool, PoolConfig, PoolError};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::ffi::CStr;
use std::sync::Arc;

fn err(e: PoolError) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// A pool of registered scratch buffers leased from a store's local buffer.
#[pyclass(module = "mooncake.store", frozen)]
pub struct BufferPool {
    pool: Arc<LeasePool>,
}

#[pymethods]
impl BufferPool {
    #[new]
    #[pyo3(signature = (store, max_bytes=UInt(0), min_size_class=UInt(64 * 1024), max_size_class=None,
        alignment=UInt(8 * 1024 * 1024), block_on_exhaustion=true, default_timeout=None,
        max_regions=None, prewarm_size=None, prewarm_count=UInt(0)))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        store: &Bound<'_, PyAny>,
        max_bytes: UInt,
        min_size_class: UInt,
        max_size_class: Option<UInt>,
        alignment: UInt,
        block_on_exhaustion: bool,
        default_timeout: Option<f64>,
        max_regions: Option<UInt>,
        prewarm_size: Option<UInt>,
        prewarm_count: UInt,
    ) -> PyResult<Self> {
        let _ = (prewarm_size, prewarm_count);
        let client = store_client(store)?.ok_or_else(|| err(PoolError::NotSetUp))?;
        let cfg = PoolConfig {
            max_bytes: max_bytes.0,
            min_size_class: min_size_class.0,
            max_size_class: max_size_class.map(|v| v.0),
            alignment: alignment.usize(),
            block_on_exhaustion,
            default_timeout,
            max_regions: max_regions.map(UInt::usize),
        };
        Ok(BufferPool {
            pool: LeasePool::new(client, cfg).map_err(err)?,
        })
    }

    /// Accepted for compatibility: leases are allocated on demand.
    fn prewarm(&self, size: UInt, count: UInt) {
        let _ = (size, count);
    }

    /// Close the pool (a `RuntimeError` while leases are active).
    fn close(&self) -> PyResult<()> {
        self.pool.close().map_err(err)
    }
}

method_family! {
    #[pyo3(signature = (size, block=None, timeout=None))]
    fn _method(
        &self,
        py: Python<'_>,
        size: UInt,
        block: Option<bool>,
        timeout: Option<f64>,
    ) -> PyResult<BufferLease> {
        let pool = Arc::clone(&self.pool);
        let lease = py
            .allow_threads(move || pool.acquire(size.0, block, timeout))
            .map_err(err)?;
        Ok(BufferLease {
            lease: Arc::new(lease),
        })
    }
    #[pymethods] for BufferPool {
        /// Lease `size` bytes; waits per `block`/`timeout` when nothing is free.
        acquire {}
        /// Same as `acquire` (for `with pool.buffer(n) as lease:`).
        buffer {}
    }
}

/// One lease: `ptr`, `size`, `buffer` (a memoryview), `release()`.
#[pyclass(module = "mooncake.store", frozen)]
pub struct BufferLease {
    lease: Arc<Lease>,
}

#[pymethods]
impl BufferLease {
    /// Address of the first byte (a `RuntimeError` once released).
    #[getter]
    fn ptr(&self) -> PyResult<usize> {
        self.lease.ptr().map_err(err)
    }

    /// The requested size.
    #[getter]
    fn size(&self) -> u64 {
        self.lease.size()
    }

    /// A writable memoryview of the lease's `size` bytes; the lease cannot
    /// be released while it (or a view of it) is alive.
    #[getter]
    fn buffer<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.lease.ptr().map_err(err)?;
        let view = export_object(py, BufferLeaseView::new(Arc::clone(&self.lease)))?;
        py.import("builtins")?.getattr("memoryview")?.call1((view,))
    }

    /// Give the memory back to the pool.
    fn release(&self) -> PyResult<()> {
        self.lease.release().map_err(err)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.release()
    }

    fn __repr__(&self) -> String {
        match self.lease.ptr() {
            Ok(p) => format!("<BufferLease ptr={p:#x} size={}>", self.lease.size()),
            Err(_) => "<BufferLease released>".to_string(),
        }
    }
}

/// The exporter behind `BufferLease.buffer`: counts as a live view.
#[pyclass(module = "mooncake.store", frozen, subclass)]
pub struct BufferLeaseView {
    lease: Arc<Lease>,
}

impl BufferLeaseView {
    fn new(lease: Arc<Lease>) -> Self {
        lease.add_export();
        BufferLeaseView { lease }
    }
}

impl Drop for BufferLeaseView {
    fn drop(&mut self) {
        self.lease.drop_export();
    }
}

// SAFETY: the lease's memory cannot be released while this view object
// lives (it counts as an export), and it never moves.
unsafe impl Exporter for BufferLeaseView {
    const FORMAT: &'static CStr = c"B";
    const SUBCLASS_NAME: &'static CStr = c"mooncake.store.BufferLeaseView";

    fn region(slf: &Bound<'_, Self>) -> PyResult<(*mut u8, usize)> {
        let lease = &slf.get().lease;
        Ok((lease.ptr().map_err(err)? as *mut u8, lease.size() as usize))
    }
}

exporter_new!(BufferLeaseView);

#[pymethods]
impl BufferLeaseView {
    /// A memoryview of this view.
    #[getter]
    fn buffer<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        slf.py()
            .import("builtins")?
            .getattr("memoryview")?
            .call1((slf,))
    }
}

/// Add the pool classes and their `Registered*` aliases.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BufferPool>()?;
    m.add_class::<BufferLease>()?;
    m.add(
        "BufferLeaseView",
        exporting_type::<BufferLeaseView>(m.py())?,
    )?;
    m.add("RegisteredBufferPool", m.getattr("BufferPool")?)?;
    m.add("RegisteredBufferLease", m.getattr("BufferLease")?)?;
    m.add("RegisteredBufferLeaseView", m.getattr("BufferLeaseView")?)?;
    Ok(())
}
