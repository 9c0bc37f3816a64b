//! The allocator for Rust code of processes that serve the store (the
//! extension's `#[global_allocator]`: the client, and the master and
//! daemons it hosts): mimalloc. Its per-thread pages of one size class keep
//! an allocation's cost flat as the heap grows to millions of objects,
//! where glibc's bins slow down with the free chunks they hold.
//!
//! Each thread owns its pages. A block freed by another thread goes back to
//! its owner's page, and a page emptied that way (or a large block freed
//! that way, which is only advised `MADV_FREE`) leaves the process's
//! resident size only when the owning thread collects its heap
//! ([`collect_this_thread`]): a process that frees much memory across
//! threads has each thread collect once it has seen the frees.

pub use mimalloc::MiMalloc as Allocator;

/// Releases the free pages of the calling thread's heap (blocks other
/// threads freed into it included), and purges the freed spans every
/// thread left in the allocator's arenas.
pub fn collect_this_thread() {
    // SAFETY: mi_collect frees no live allocation: it releases pages that
    // hold none, and purges freed spans.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
}
