//! `BufferPool` leases (upstream's Python `BufferPool` helper): scratch
//! buffers for repeated zero-copy calls, registered with the client so
//! `get_into_ranges` and the other direct paths can use them.
//!
//! Rules:
//! * A lease first takes its size from the store's local buffer (the same
//!   capacity staged `put`/`get` calls reserve); when that is full it is an
//!   *overflow* lease. Local and overflow leases together hold at most
//!   `max_bytes` (default twice the local buffer; a smaller value is raised
//!   to the local buffer's size), and at most `max_regions` leases are active
//!   when that is set.
//! * A lease that does not fit waits for a release (`block`, bounded by
//!   `timeout`) or fails at once; a size above `max_bytes` always fails.
//! * A lease with exported views (memoryviews of its bytes) cannot be
//!   released by hand; dropping it releases it regardless.
//! * `close` fails while leases are active; a closed pool grants nothing.
//!
//! Every lease's memory is a fresh allocation of `alignment` (a power of two,
//! at least the pointer size), registered for the lease's lifetime.

use crate::client::Client;
use crate::staging::Reservation;
use parking_lot::{Condvar, Mutex};
use std::alloc::Layout;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a pool call failed (the binding raises its text as `RuntimeError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The store has no local buffer to lease from.
    #[error("BufferPool requires a store configured with a local buffer")]
    NoLocalBuffer,
    /// The store is not set up or was closed.
    #[error("MooncakeDistributedStore is not initialized")]
    NotSetUp,
    /// Bad constructor arguments.
    #[error("{0}")]
    Config(&'static str),
    /// The request can never fit.
    #[error("requested buffer size {0} exceeds pool capacity {1}")]
    TooLarge(u64, u64),
    /// Nothing free and the caller would not wait.
    #[error("buffer pool is exhausted")]
    Exhausted,
    /// Nothing was freed within the timeout.
    #[error("timed out waiting for buffer")]
    TimedOut,
    /// A negative timeout.
    #[error("timeout must be non-negative")]
    NegativeTimeout,
    /// The pool was closed.
    #[error("buffer pool is closed")]
    Closed,
    /// Leases are still active at `close`.
    #[error("cannot close buffer pool with active leases")]
    ActiveLeases,
    /// Views of the lease's bytes are still alive.
    #[error("cannot release buffer while exported views exist")]
    ExportedViews,
    /// The lease was released already.
    #[error("buffer lease is closed")]
    LeaseClosed,
    /// The allocator or the registration failed.
    #[error("overflow buffer allocation or registration failed for {0} bytes")]
    Allocation(u64),
}

/// Constructor settings of a pool (upstream's keyword arguments).
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Upper bound of all active lease bytes; 0 = twice the local buffer.
    pub max_bytes: u64,
    /// Accepted for compatibility (leases are sized exactly).
    pub min_size_class: u64,
    /// Accepted for compatibility (leases are sized exactly).
    pub max_size_class: Option<u64>,
    /// Alignment of lease memory.
    pub alignment: usize,
    /// Whether `acquire` waits by default.
    pub block_on_exhaustion: bool,
    /// Default wait bound in seconds.
    pub default_timeout: Option<f64>,
    /// Most active leases.
    pub max_regions: Option<usize>,
}

#[derive(Debug, Default)]
struct State {
    total: u64,
    active: usize,
    closed: bool,
}

/// A pool of leases over one client.
pub struct LeasePool {
    client: Arc<Client>,
    cfg: PoolConfig,
    max_bytes: u64,
    state: Mutex<State>,
    freed: Condvar,
}

/// Memory of one lease; freed (and unregistered) on drop.
#[derive(Debug)]
struct Memory {
    ptr: usize,
    layout: Layout,
}

/// One active lease of `size` bytes.
pub struct Lease {
    pool: Arc<LeasePool>,
    mem: Mutex<Option<Memory>>,
    size: u64,
    charged: u64,
    _local: Mutex<Option<Reservation>>,
    overflow: bool,
    exports: AtomicUsize,
}

impl std::fmt::Debug for LeasePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasePool")
            .field("max_bytes", &self.max_bytes)
            .finish()
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("size", &self.size).finish()
    }
}

impl LeasePool {
    /// A pool over `client`'s local buffer.
    pub fn new(client: Arc<Client>, cfg: PoolConfig) -> Result<Arc<LeasePool>, PoolError> {
        if client.is_closed() {
            return Err(PoolError::NotSetUp);
        }
        if cfg.min_size_class == 0 || cfg.alignment == 0 {
            return Err(PoolError::Config(
                "min_size_class and alignment must be positive",
            ));
        }
        if cfg.alignment < std::mem::size_of::<usize>() || !cfg.alignment.is_power_of_two() {
            return Err(PoolError::Config(
                "alignment must be a power of two and at least sizeof(void*)",
            ));
        }
        let local = client.staging.capacity();
        if local == 0 {
            return Err(PoolError::NoLocalBuffer);
        }
        let max_bytes = match cfg.max_bytes {
            0 => local.saturating_mul(2),
            n => n.max(local),
        };
        Ok(Arc::new(LeasePool {
            client,
            cfg,
            max_bytes,
            state: Mutex::new(State::default()),
            freed: Condvar::new(),
        }))
    }

    /// The byte bound of all active leases.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Lease `size` bytes (module doc for the waiting rules).
    pub fn acquire(
        self: &Arc<Self>,
        size: u64,
        block: Option<bool>,
        timeout: Option<f64>,
    ) -> Result<Lease, PoolError> {
        let block = block.unwrap_or(self.cfg.block_on_exhaustion);
        let timeout = timeout.or(self.cfg.default_timeout);
        if timeout.is_some_and(|t| t < 0.0 || t.is_nan()) {
            return Err(PoolError::NegativeTimeout);
        }
        let charged = size.max(1);
        if charged > self.max_bytes {
            return Err(PoolError::TooLarge(size, self.max_bytes));
        }
        let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.min(1e9)));
        let mut st = self.state.lock();
        loop {
            if st.closed {
                return Err(PoolError::Closed);
            }
            let fits = charged <= self.max_bytes - st.total
                && self.cfg.max_regions.is_none_or(|m| st.active < m);
            if fits {
                st.total += charged;
                st.active += 1;
                break;
            }
            if !block {
                return Err(PoolError::Exhausted);
            }
            match deadline {
                Some(d) => {
                    if self.freed.wait_until(&mut st, d).timed_out() {
                        return Err(PoolError::TimedOut);
                    }
                }
                None => self.freed.wait(&mut st),
            }
        }
        drop(st);
        match self.allocate(size, charged) {
            Ok(lease) => Ok(lease),
            Err(e) => {
                self.give_back(charged);
                Err(e)
            }
        }
    }

    fn allocate(self: &Arc<Self>, size: u64, charged: u64) -> Result<Lease, PoolError> {
        let local = self.client.staging.reserve(charged);
        let overflow = local.is_none();
        let bytes = usize::try_from(charged).map_err(|_| PoolError::Allocation(size))?;
        let layout = Layout::from_size_align(bytes, self.cfg.alignment)
            .map_err(|_| PoolError::Allocation(size))?;
        // SAFETY: the layout has a non-zero size (`charged >= 1`).
        let ptr = unsafe { std::alloc::alloc(layout) } as usize;
        if ptr == 0 {
            return Err(PoolError::Allocation(size));
        }
        if self.client.register_buffer(ptr, bytes).is_err() {
            // SAFETY: `ptr` was just allocated with `layout` and is not shared.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
            return Err(PoolError::Allocation(size));
        }
        Ok(Lease {
            pool: Arc::clone(self),
            mem: Mutex::new(Some(Memory { ptr, layout })),
            size,
            charged,
            _local: Mutex::new(local),
            overflow,
            exports: AtomicUsize::new(0),
        })
    }

    fn give_back(&self, charged: u64) {
        let mut st = self.state.lock();
        st.total = st.total.saturating_sub(charged);
        st.active = st.active.saturating_sub(1);
        drop(st);
        self.freed.notify_all();
    }

    /// Close the pool; fails while leases are active.
    pub fn close(&self) -> Result<(), PoolError> {
        let mut st = self.state.lock();
        if st.closed {
            return Ok(());
        }
        if st.active > 0 {
            return Err(PoolError::ActiveLeases);
        }
        st.closed = true;
        drop(st);
        self.freed.notify_all();
        Ok(())
    }
}

impl Lease {
    /// Address of the lease's first byte.
    pub fn ptr(&self) -> Result<usize, PoolError> {
        self.mem
            .lock()
            .as_ref()
            .map(|m| m.ptr)
            .ok_or(PoolError::LeaseClosed)
    }

    /// The requested size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether the lease came from overflow memory rather than the local buffer.
    pub fn is_overflow(&self) -> bool {
        self.overflow
    }

    /// Count a view of the lease's bytes.
    pub fn add_export(&self) {
        self.exports.fetch_add(1, Ordering::AcqRel);
    }

    /// A view of the lease's bytes went away.
    pub fn drop_export(&self) {
        self.exports.fetch_sub(1, Ordering::AcqRel);
    }

    /// Release by hand: fails while views exist; a second release does nothing.
    pub fn release(&self) -> Result<(), PoolError> {
        if self.exports.load(Ordering::Acquire) != 0 && self.mem.lock().is_some() {
            return Err(PoolError::ExportedViews);
        }
        self.free();
        Ok(())
    }

    fn free(&self) {
        let Some(mem) = self.mem.lock().take() else {
            return;
        };
        let _ = self.pool.client.unregister_buffer(mem.ptr);
        // SAFETY: `mem` owns the allocation made with this layout; it was
        // taken out of the lease, so no one frees it twice.
        unsafe { std::alloc::dealloc(mem.ptr as *mut u8, mem.layout) };
        self._local.lock().take();
        self.pool.give_back(self.charged);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.free();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_errors_say_why() {
        assert_eq!(
            PoolError::Config("alignment must be a power of two and at least sizeof(void*)")
                .to_string(),
            "alignment must be a power of two and at least sizeof(void*)"
        );
        assert_eq!(PoolError::Exhausted.to_string(), "buffer pool is exhausted");
        assert!(PoolError::TooLarge(u64::MAX, 8)
            .to_string()
            .contains("capacity"));
    }
}
