//! Giving freed memory back to the system. After a large removal the
//! allocators keep the freed memory for reuse, so the master's resident
//! size would stay at its peak. Two allocators serve the master:
//!
//! - The extension's global allocator (mimalloc, `mooncake_common::alloc`)
//!   holds every Rust allocation. Its threads own their pages: memory that
//!   a removal on one thread frees from another thread's pages is released
//!   only by the thread that owns them. So [`return_free_memory`] collects
//!   the calling thread's heap and raises a process-wide count of large
//!   frees; every connection thread collects its own heap when it sees the
//!   count move ([`collect_if_freed`]: after each request, and every
//!   [`IDLE_COLLECT_TICK`] while it waits for one), and the trimming thread
//!   purges the freed spans the threads left in mimalloc's arenas.
//! - glibc's malloc holds what C code allocates; `malloc_trim` releases the
//!   free pages of every arena's bins, and the free top of the main arena.
//!   The top of a thread's own arena is not released by it (and glibc stops
//!   trimming those tops on `free` once large blocks have been freed, which
//!   raises its trim threshold), so the master allocates from one arena
//!   ([`one_arena`]).
//!
//! Trimming a large heap takes a while (a `madvise` over every free page),
//! so the process-wide part runs on a thread of its own and a removal's
//! reply does not wait for it.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::OnceLock;
use std::time::Duration;

/// How often a connection thread waiting for a request checks whether it
/// should release freed memory.
pub(crate) const IDLE_COLLECT_TICK: Duration = Duration::from_millis(100);

/// Large frees so far (raised by [`return_free_memory`]).
static FREES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The count of large frees this thread last collected for.
    static COLLECTED: Cell<u64> = const { Cell::new(0) };
}

/// Release the calling thread's free pages if a large free happened since
/// it last did (an atomic load otherwise).
pub(crate) fn collect_if_freed() {
    let now = FREES.load(Ordering::Acquire);
    if COLLECTED.with(|c| c.replace(now)) != now {
        mooncake_common::alloc::collect_this_thread();
    }
}

/// Make every thread of this process allocate from glibc's main arena (call
/// before starting threads; elsewhere a no-op).
pub(crate) fn one_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's tuning; M_ARENA_MAX
    // limits the arenas created from now on.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Release the calling thread's free pages now, and ask for the rest of the
/// allocators' free pages to be released to the system soon, on the
/// trimming thread (requests made while one trim runs are served by the
/// next).
pub(crate) fn return_free_memory() {
    let now = FREES.fetch_add(1, Ordering::AcqRel) + 1;
    COLLECTED.with(|c| c.set(now));
    mooncake_common::alloc::collect_this_thread();
    static TRIMMER: OnceLock<Option<Sender<()>>> = OnceLock::new();
    let tx = TRIMMER.get_or_init(|| {
        let (tx, rx) = channel::<()>();
        std::thread::Builder::new()
            .name("mc-trim".into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    while rx.try_recv().is_ok() {}
                    trim();
                }
            })
            .ok()
            .map(|_| tx)
    });
    match tx {
        Some(tx) => {
            let _ = tx.send(());
        }
        // No thread could be started: trim here.
        None => trim(),
    }
}

/// Release the allocators' free pages now: mimalloc's freed spans of every
/// thread, and glibc's free pages (glibc only).
fn trim() {
    mooncake_common::alloc::collect_this_thread();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of the process's own
    // allocator to the kernel; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}
