//! PyO3 bindings for the PG core (`mooncake._native.PgGroup`, `PgWork` and
//! the `pg_*` functions). This module only converts: tensors cross as
//! `data_ptr()` integers plus byte counts and dtype/op codes (the Python
//! package `mooncake.pg` keeps the tensors alive), and every core error is
//! turned into a Python exception by [`to_py`].

use mooncake_pg::{
    clear_faults, fault_stats, inject_faults, set_collective_timeout_us,
    set_fault_reconciliation_window_us, set_p2p_timeout_us, Completion, CoordinatorHandle, DType,
    ErrorKind, Group, GroupParams, OpArgs, OpKind, PeerInfo, PgError, ReduceOp,
};
use pyo3::exceptions::{PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use std::sync::Arc;
use std::time::Duration;

/// The one conversion of a core error into a Python exception.
fn to_py(e: &PgError) -> PyErr {
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::InvalidArgument => PyValueError::new_err(msg),
        ErrorKind::Timeout => PyTimeoutError::new_err(msg),
        ErrorKind::Runtime => PyRuntimeError::new_err(msg),
    }
}

fn py_err(e: PgError) -> PyErr {
    to_py(&e)
}

/// Handle of one submitted op.
#[pyclass(module = "mooncake._native", frozen)]
pub(crate) struct PgWork {
    done: Arc<Completion>,
    group: Option<Arc<Group>>,
}

#[pymethods]
impl PgWork {
    /// Blocks (GIL released) until done; raises on error or on `timeout`
    /// seconds passing. Returns True.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let t = timeout.filter(|t| *t > 0.0).map(Duration::from_secs_f64);
        let done = self.done.clone();
        let group = self.group.clone();
        let finished = py.allow_threads(move || match group {
            Some(g) => g.wait(&done, t),
            None => done.wait(t),
        });
        if !finished {
            return Err(PyTimeoutError::new_err(format!(
                "operation did not complete within {:.3}s (it keeps running)",
                timeout.unwrap_or(0.0)
            )));
        }
        match self.done.snapshot().error {
            Some(e) => Err(to_py(&e)),
            None => Ok(true),
        }
    }

    /// Non-blocking completion check.
    fn is_completed(&self) -> bool {
        self.done.is_done()
    }

    /// Bitmap of slots whose contribution was lost (F_i).
    fn failed_mask(&self) -> u64 {
        self.done.snapshot().failed
    }

    /// Error message, if the op failed.
    fn error(&self) -> Option<String> {
        self.done.snapshot().error.map(|e| e.to_string())
    }

    /// Source slot of a completed receive (-1 if unknown).
    fn source_rank(&self) -> i64 {
        self.done.snapshot().source
    }
}

fn work(r: Result<Arc<Completion>, PgError>) -> PyResult<PgWork> {
    r.map(|done| PgWork { done, group: None }).map_err(py_err)
}

impl PgGroup {
    /// A collective's Work: its waiter may run queued ops inline.
    fn coll(&self, r: Result<Arc<Completion>, PgError>) -> PyResult<PgWork> {
        r.map(|done| PgWork {
            done,
            group: Some(self.g.clone()),
        })
        .map_err(py_err)
    }
}

/// One member of a Mooncake process group.
#[pyclass(module = "mooncake._native", frozen)]
pub(crate) struct PgGroup {
    g: Arc<Group>,
    /// The tensor whose memory the mask is written to, kept alive while it
    /// is registered (works keep `g` alive past this object).
    mask_owner: parking_lot::Mutex<Option<Py<PyAny>>>,
}

impl Drop for PgGroup {
    fn drop(&mut self) {
        // `g` may outlive this object (works hold it): stop its mask writes
        // before the tensor reference below is released.
        self.g.clear_mask_tensor();
    }
}

#[pymethods]
impl PgGroup {
    #[new]
    #[pyo3(signature = (rank, size, capacity, is_extension, key, auto_deactivate=true, auto_sync=true, host=String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        rank: usize,
        size: usize,
        capacity: usize,
        is_extension: bool,
        key: String,
        auto_deactivate: bool,
        auto_sync: bool,
        host: String,
    ) -> PyResult<Self> {
        let g = Group::new(GroupParams {
            rank,
            size,
            capacity,
            is_extension,
            key,
            auto_deactivate,
            auto_sync,
            host,
        })
        .map_err(py_err)?;
        Ok(PgGroup {
            g: Arc::new(g),
            mask_owner: parking_lot::Mutex::new(None),
        })
    }

    /// Registers with the membership coordinator at `coordinator`;
    /// `endpoint` is where peers dial this member.
    fn attach(
        &self,
        py: Python<'_>,
        coordinator: String,
        endpoint: String,
        timeout_s: f64,
    ) -> PyResult<()> {
        let g = self.g.clone();
        let t = Duration::from_secs_f64(timeout_s.max(0.001));
        py.allow_threads(move || g.attach_coordinator(&coordinator, &endpoint, t))
            .map_err(py_err)
    }

    /// `join_group`: blocks (GIL released) until an activation commits.
    fn join(&self, py: Python<'_>, timeout_s: f64) -> PyResult<()> {
        let g = self.g.clone();
        let t = Duration::from_secs_f64(timeout_s.max(0.001));
        py.allow_threads(move || g.join(t)).map_err(py_err)
    }

    /// `activate_ranks` / `deactivate_ranks`: `(status, epoch, dropped, reason)`.
    fn propose(
        &self,
        py: Python<'_>,
        activate: bool,
        ranks: Vec<usize>,
    ) -> PyResult<(u32, u64, Vec<usize>, String)> {
        let g = self.g.clone();
        let o = py
            .allow_threads(move || g.propose(activate, &ranks))
            .map_err(py_err)?;
        Ok((o.status as u32, o.epoch, o.dropped, o.reason))
    }

    /// `sync_after_failure`: `(status, epoch, reason)`.
    fn sync(&self, py: Python<'_>) -> PyResult<(u32, u64, String)> {
        let g = self.g.clone();
        let o = py.allow_threads(move || g.sync()).map_err(py_err)?;
        Ok((o.status as u32, o.epoch, o.reason))
    }

    /// `get_peer_state`: readiness per rank (local, no communication).
    fn peer_state(&self, ranks: Vec<usize>) -> PyResult<Vec<bool>> {
        self.g.peer_state(&ranks).map_err(py_err)
    }

    /// `extend_group_size_to`: raises the capacity.
    fn extend(&self, capacity: usize) -> PyResult<()> {
        self.g.extend(capacity).map_err(py_err)
    }

    /// Registers the int32 mask tensor (address, elements); `owner` (the
    /// tensor) is kept alive until it is replaced, cleared or this object
    /// is dropped.
    #[pyo3(signature = (ptr, len, owner=None))]
    fn set_mask_tensor(&self, ptr: usize, len: usize, owner: Option<Py<PyAny>>) {
        let mut held = self.mask_owner.lock();
        // SAFETY: mooncake.pg passes the data_ptr() of a contiguous int32
        // tensor of `len` elements (`owner`, held below until the core
        // forgets the address) and clears the registration before resizing
        // it; shutdown and drop clear it too.
        unsafe { self.g.set_mask_tensor(ptr, len) }
        *held = owner;
    }

    /// Forgets the mask tensor: the core writes to it no more (call before
    /// resizing it).
    fn clear_mask_tensor(&self) {
        let mut held = self.mask_owner.lock();
        self.g.clear_mask_tensor();
        *held = None;
    }

    /// Connects to peers: list of (slot, endpoint, member_id, same_host, shm_name).
    fn connect(
        &self,
        py: Python<'_>,
        peers: Vec<(usize, String, u64, bool, String)>,
        timeout_s: f64,
    ) -> PyResult<()> {
        let infos = peers
            .into_iter()
            .map(
                |(slot, endpoint, member_id, same_host, shm_name)| PeerInfo {
                    slot,
                    endpoint,
                    member_id,
                    same_host,
                    shm_name,
                },
            )
            .collect();
        let g = self.g.clone();
        let t = Duration::from_secs_f64(timeout_s.max(0.001));
        py.allow_threads(move || g.connect(infos, t))
            .map_err(py_err)
    }

    /// Queues collective `kind` (one of `all_reduce`, `broadcast`,
    /// `all_gather`, `reduce_scatter`, `all_to_all`, `barrier`, `reduce`,
    /// `gather`, `scatter`). `srcs`/`dsts` are tensor addresses (one, or one
    /// per slot), `nbytes` the bytes per rank or slot, `src_lens`/`dst_lens`
    /// the per-slot sizes of `all_to_all`; `dt`/`op` are dtype and
    /// reduce-op codes, `root` the root slot of rooted ops.
    #[pyo3(signature = (kind, srcs, dsts, nbytes, dt, op=0, root=0, src_lens=None, dst_lens=None))]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        kind: &str,
        srcs: Vec<usize>,
        dsts: Vec<usize>,
        nbytes: usize,
        dt: u32,
        op: u32,
        root: usize,
        src_lens: Option<Vec<usize>>,
        dst_lens: Option<Vec<usize>>,
    ) -> PyResult<PgWork> {
        let args = OpArgs {
            srcs,
            dsts,
            nbytes,
            src_lens: src_lens.unwrap_or_default(),
            dst_lens: dst_lens.unwrap_or_default(),
            root,
        };
        let (k, op) = OpKind::from_codes(kind, args, dt, op).map_err(py_err)?;
        // SAFETY: mooncake.pg passes addresses and sizes of contiguous
        // tensors it keeps alive in the Work (and its in-flight registry)
        // until this op completes.
        self.coll(unsafe { self.g.submit(k, dt, op) })
    }

    /// Sends from the calling thread with the GIL released.
    fn send(&self, py: Python<'_>, dst: usize, ptr: usize, nbytes: usize) -> PyResult<PgWork> {
        let g = self.g.clone();
        // SAFETY: the caller (mooncake.pg) passes a live contiguous tensor's
        // address and size and holds the tensor for the call's duration.
        work(py.allow_threads(move || unsafe { g.send(dst, ptr, nbytes) }))
    }

    /// Posts a receive from `src` (None: any source).
    #[pyo3(signature = (src, ptr, nbytes))]
    fn recv(&self, src: Option<usize>, ptr: usize, nbytes: usize) -> PyResult<PgWork> {
        // SAFETY: mooncake.pg passes a contiguous tensor of `nbytes` bytes
        // that the Work keeps alive until the receive completes.
        work(unsafe { self.g.recv(src, ptr, nbytes) })
    }

    /// Closes the group (idempotent).
    fn shutdown(&self, py: Python<'_>) {
        let g = self.g.clone();
        py.allow_threads(move || g.shutdown());
    }
}

/// `PgGroup` methods that return what the core group's method of the same
/// name returns.
macro_rules! group_forwards {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?;)+) => {
        #[pymethods]
        impl PgGroup {
            $(
                $(#[$doc])*
                fn $name(&self $(, $arg: $ty)*) $(-> $ret)? {
                    self.g.$name($($arg),*)
                }
            )+
        }
    };
}

group_forwards! {
    /// `get_num_synced_ranks`.
    fn num_synced() -> usize;
    /// Epoch of the last membership view applied.
    fn epoch() -> u64;
    /// True while in the group's active set.
    fn is_active() -> bool;
    /// TCP port of this process's engine.
    fn port() -> u16;
    /// Random id of this member.
    fn member_id() -> u64;
    /// Random id of this process's engine.
    fn instance_id() -> u64;
    /// Shared-memory segment name ("" when shm is off).
    fn shm_name() -> String;
    /// Reserved capacity.
    fn capacity() -> usize;
    /// Active mask bitmap.
    fn mask() -> u64;
    /// Visible size V.
    fn visible_size() -> usize;
    /// Number of peers reached over shared memory.
    fn shm_peer_count() -> usize;
    /// Bounded spin (µs) before sleeping; 0 disables it.
    fn set_spin_us(us: u64);
}

/// A membership coordinator hosted by this process (stopped by `shutdown`
/// or when collected).
#[pyclass(module = "mooncake._native", frozen)]
pub(crate) struct PgCoordinator {
    c: CoordinatorHandle,
}

#[pymethods]
impl PgCoordinator {
    /// Starts a coordinator that peers reach at `advertise:port`.
    #[new]
    fn new(advertise: &str) -> PyResult<Self> {
        CoordinatorHandle::start(advertise)
            .map(|c| PgCoordinator { c })
            .map_err(py_err)
    }

    /// `host:port` agents connect to.
    fn endpoint(&self) -> String {
        self.c.endpoint().to_string()
    }

    /// Stops serving (idempotent).
    fn shutdown(&self) {
        self.c.stop()
    }
}

/// The `pg_*` module functions, each the core function after `=>` applied
/// to its arguments, and `add_functions`, which adds them all.
macro_rules! pg_functions {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? => $core:expr;)+) => {
        $(
            $(#[$doc])*
            #[pyfunction]
            fn $name($($arg: $ty),*) $(-> $ret)? {
                ($core)($($arg),*)
            }
        )+

        fn add_functions(m: &Bound<'_, PyModule>) -> PyResult<()> {
            $(m.add_function(wrap_pyfunction!($name, m)?)?;)+
            Ok(())
        }
    };
}

pg_functions! {
    /// Process-wide fault-reconciliation window in µs (0: the default, 30 s).
    fn pg_set_fault_reconciliation_window_us(us: u64) => set_fault_reconciliation_window_us;
    /// Adds fault-injection rules (`rule;rule`, the syntax of
    /// `MOONCAKE_PG_FAULT`); raises ValueError
    /// on a malformed rule (then nothing is added).
    fn pg_inject_fault(rules: &str) -> PyResult<()> => |r| inject_faults(r).map_err(py_err);
    /// Removes every fault-injection rule.
    fn pg_clear_faults() => clear_faults;
    /// `(rule, times fired)` for every fault-injection rule.
    fn pg_fault_stats() -> Vec<(String, u64)> => fault_stats;
    /// Process-wide collective silence timeout T in µs (0: the environment's).
    fn pg_set_collective_timeout_us(us: u64) => set_collective_timeout_us;
    /// Process-wide P2P silence timeout T in µs (0: the environment's).
    fn pg_set_p2p_timeout_us(us: u64) => set_p2p_timeout_us;
    /// `(torch dtype name, code)` for every dtype code (`"raw"`: moved, never reduced).
    fn pg_dtype_codes() -> Vec<(&'static str, u32)> => DType::table;
    /// `(torch.distributed.ReduceOp name, code)` for every reduce-op code.
    fn pg_reduce_op_codes() -> Vec<(&'static str, u32)> => ReduceOp::table;
}

/// Adds the PG classes and functions to the extension module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PgGroup>()?;
    m.add_class::<PgWork>()?;
    m.add_class::<PgCoordinator>()?;
    add_functions(m)?;
    Ok(())
}
