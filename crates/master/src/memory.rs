//! Giving freed memory back to the system. After a large removal the
//! allocator keeps the freed chunks in its free lists, so the master's
//! resident size stays at its peak; glibc's `malloc_trim` releases the free
//! pages of every arena (it `madvise`s whole free pages away, not just the
//! top of the heap).

/// Release the allocator's free pages to the system (glibc; elsewhere a
/// no-op).
pub(crate) fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of the process's own
    // allocator to the kernel; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}
