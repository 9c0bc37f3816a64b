//! `MooncakeHostMemAllocator` (upstream's import path
//! `mooncake.store.MooncakeHostMemAllocator`): host memory that a store
//! reads and writes without a staging copy, in process or through a
//! `mooncake_client` daemon (it is shared memory the daemon maps).

use crate::args::UInt;
use pyo3::prelude::*;

/// Allocator of shared host memory (`alloc`, `free`).
#[pyclass(module = "mooncake.store")]
pub struct MooncakeHostMemAllocator;

#[pymethods]
impl MooncakeHostMemAllocator {
    #[new]
    fn py_new() -> Self {
        MooncakeHostMemAllocator
    }

    /// `size` zero-filled bytes of shared host memory: the address, or 0 on
    /// failure (and for `size` 0).
    fn alloc(&self, py: Python<'_>, size: UInt) -> usize {
        py.allow_threads(|| mooncake_standalone::host_alloc(size.0))
    }

    /// Free memory `alloc` returned: 0, or -1 when `ptr` is not such memory.
    fn free(&self, py: Python<'_>, ptr: UInt) -> i32 {
        py.allow_threads(|| mooncake_standalone::host_free(ptr.usize()))
    }
}
