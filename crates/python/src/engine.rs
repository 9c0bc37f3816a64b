//! `mooncake.engine`: `TransferEngine`, `TransferOpcode`, `TransferNotify`
//! and `InnerTransferEngine` over the transfer engine
//! (`mooncake_transfer::engine`).
//!
//! Conversion only: arguments become the crate's calls (every transfer runs
//! with the GIL released), and a failure becomes upstream's return value in
//! one place ([`code`]) plus one line on `logging.getLogger
//! ("mooncake.engine")` naming the method and the reason. The engine's own
//! events (a target refusing a peer's range, the fallback to TCP) go to the
//! same logger through the sink installed by [`register`].

use crate::args::UInt;
use crate::family::method_family;
use mooncake_transfer::engine::log::Level;
use mooncake_transfer::engine::{
    build_conn_string, items, split_conn_string, BatchState, EngineError, ErrorKind, Item, Opcode,
    TransferEngine as Engine,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyBytes, PyString};
use std::sync::Arc;

static LOGGER: GILOnceCell<Py<PyAny>> = GILOnceCell::new();

fn emit(py: Python<'_>, level: Level, msg: &str) {
    let Ok(logger) = LOGGER.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
        Ok(py
            .import("logging")?
            .call_method1("getLogger", ("mooncake.engine",))?
            .unbind())
    }) else {
        return;
    };
    let method = match level {
        Level::Info => "info",
        Level::Warning => "warning",
    };
    let _ = logger.bind(py).call_method1(method, ("%s", msg));
}

/// What kind of call failed, for [`code`].
#[derive(Clone, Copy)]
enum Call {
    /// A transfer or anything else answered with -1 on failure.
    Transfer,
    /// `register_memory` and friends.
    Register,
    /// `unregister_memory` and friends.
    Unregister,
    /// `send_probe`.
    Probe,
}

/// The one mapping of an engine failure to upstream's return code.
fn code(e: &EngineError, call: Call) -> i64 {
    match (call, e.kind()) {
        (Call::Register, ErrorKind::Overlap) => -7,
        (Call::Unregister, ErrorKind::NotRegistered) => -3,
        (Call::Unregister, ErrorKind::InUse) => -4,
        (Call::Probe, ErrorKind::NotInitialized) => -1,
        (Call::Probe, ErrorKind::UnknownPeer) => -101,
        (Call::Probe, _) => -102,
        _ => -1,
    }
}

/// Log `method`'s failure and return its code.
fn fail(py: Python<'_>, method: &str, e: &EngineError, call: Call) -> i64 {
    emit(py, Level::Warning, &format!("{method}: {e}"));
    code(e, call)
}

fn ret(py: Python<'_>, method: &str, r: Result<(), EngineError>, call: Call) -> i64 {
    match r {
        Ok(()) => 0,
        Err(e) => fail(py, method, &e, call),
    }
}

fn u64s(v: Vec<UInt>) -> Vec<u64> {
    v.into_iter().map(|u| u.0).collect()
}

/// The ranges argument of a transfer method: one range (`buffer`,
/// `peer_buffer_address`, `length`) or a batch (the three lists, which
/// must have one entry per range).
trait Ranges {
    fn items(self) -> Result<Vec<Item>, EngineError>;
}

impl Ranges for (UInt, UInt, UInt) {
    fn items(self) -> Result<Vec<Item>, EngineError> {
        Ok(vec![(self.0 .0, self.1 .0, self.2 .0)])
    }
}

impl Ranges for (Vec<UInt>, Vec<UInt>, Vec<UInt>) {
    fn items(self) -> Result<Vec<Item>, EngineError> {
        items(&u64s(self.0), &u64s(self.1), &u64s(self.2))
    }
}

/// The kind of a transfer (`TransferOpcode.Read` / `.Write`; `READ` and
/// `WRITE` are the documented aliases).
#[pyclass(
    module = "mooncake.engine",
    name = "TransferOpcode",
    eq,
    eq_int,
    frozen
)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum TransferOpcode {
    /// From the target into local memory.
    Read = 0,
    /// From local memory into the target.
    Write = 1,
}

#[pymethods]
impl TransferOpcode {
    #[classattr]
    #[allow(non_snake_case)]
    fn READ() -> TransferOpcode {
        TransferOpcode::Read
    }

    #[classattr]
    #[allow(non_snake_case)]
    fn WRITE() -> TransferOpcode {
        TransferOpcode::Write
    }
}

impl From<TransferOpcode> for Opcode {
    fn from(o: TransferOpcode) -> Opcode {
        match o {
            TransferOpcode::Read => Opcode::Read,
            TransferOpcode::Write => Opcode::Write,
        }
    }
}

/// A notification delivered to the target after a transfer.
#[pyclass(module = "mooncake.engine", name = "TransferNotify")]
#[derive(Clone)]
pub(crate) struct TransferNotify {
    #[pyo3(get, set)]
    name: String,
    #[pyo3(get, set)]
    msg: String,
}

#[pymethods]
impl TransferNotify {
    #[new]
    #[pyo3(signature = (name=String::new(), msg=String::new()))]
    fn new(name: String, msg: String) -> Self {
        TransferNotify { name, msg }
    }

    fn __repr__(&self) -> String {
        format!("TransferNotify(name={:?}, msg={:?})", self.name, self.msg)
    }
}

/// The engine inside a `TransferEngine` (what `get_engine()` returns), to
/// pass to `MooncakeDistributedStore.setup(..., engine)`.
#[pyclass(module = "mooncake.engine", name = "InnerTransferEngine", frozen)]
pub(crate) struct InnerTransferEngine {
    pub(crate) inner: Arc<Engine>,
}

/// The engine that `setup(..., engine)` was given, if it is ours:
/// `InnerTransferEngine` or a `TransferEngine`.
pub(crate) fn shared_engine(ob: &Bound<'_, PyAny>) -> Option<Arc<Engine>> {
    if let Ok(e) = ob.downcast::<InnerTransferEngine>() {
        return Some(Arc::clone(&e.get().inner));
    }
    if let Ok(e) = ob.downcast::<TransferEngine>() {
        return Some(Arc::clone(&e.get().inner));
    }
    None
}

/// `mooncake.engine.TransferEngine`.
#[pyclass(module = "mooncake.engine", name = "TransferEngine", frozen)]
pub(crate) struct TransferEngine {
    inner: Arc<Engine>,
}

impl TransferEngine {
    fn sync(
        &self,
        py: Python<'_>,
        method: &str,
        target: &str,
        op: Opcode,
        ranges: impl Ranges,
        notify: Option<TransferNotify>,
    ) -> i64 {
        let e = Arc::clone(&self.inner);
        let n = notify.map(|n| (n.name, n.msg));
        let r = ranges
            .items()
            .and_then(|it| py.allow_threads(|| e.transfer(target, op, &it, n)));
        ret(py, method, r, Call::Transfer)
    }

    /// Submit in the background; the batch id, or 0 on failure (batch ids
    /// are unsigned upstream, 0 its failure sentinel).
    fn submit(
        &self,
        py: Python<'_>,
        method: &str,
        target: &str,
        op: Opcode,
        ranges: impl Ranges,
    ) -> u64 {
        let e = Arc::clone(&self.inner);
        let r = ranges
            .items()
            .and_then(|it| py.allow_threads(|| e.submit(target, op, it, None)));
        match r {
            Ok(id) => id,
            Err(e) => {
                fail(py, method, &e, Call::Transfer);
                0
            }
        }
    }

    fn on_cuda(
        &self,
        py: Python<'_>,
        method: &str,
        target: &str,
        op: Opcode,
        ranges: impl Ranges,
        stream: u64,
    ) -> PyResult<()> {
        let e = Arc::clone(&self.inner);
        let r = ranges
            .items()
            .and_then(|it| py.allow_threads(|| e.transfer_on_cuda(target, op, &it, stream)));
        r.map_err(|e| {
            emit(py, Level::Warning, &format!("{method}: {e}"));
            PyRuntimeError::new_err(format!("{method}: {e}"))
        })
    }
}

#[pymethods]
impl TransferEngine {
    #[new]
    fn new() -> Self {
        TransferEngine {
            inner: Arc::new(Engine::new()),
        }
    }

    /// 0, or -1 after logging why (already initialized, bad name, port in
    /// use, metadata server unreachable).
    #[pyo3(signature = (local_hostname, metadata_server, protocol, device_name))]
    fn initialize(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
    ) -> i64 {
        let (ty, server) = split_conn_string(metadata_server);
        let conn = build_conn_string(&ty, &server);
        let e = Arc::clone(&self.inner);
        let r = py.allow_threads(|| e.initialize(local_hostname, &conn, protocol, device_name));
        ret(py, "initialize", r, Call::Transfer)
    }

    #[pyo3(signature = (local_hostname, metadata_server, protocol, device_name, metadata_type))]
    fn initialize_ext(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
        metadata_type: &str,
    ) -> i64 {
        let conn = build_conn_string(metadata_type, metadata_server);
        let e = Arc::clone(&self.inner);
        let r = py.allow_threads(|| e.initialize(local_hostname, &conn, protocol, device_name));
        ret(py, "initialize_ext", r, Call::Transfer)
    }

    /// The RPC port; -1 before `initialize`.
    fn get_rpc_port(&self, py: Python<'_>) -> i64 {
        match self.inner.rpc_port() {
            Ok(p) => i64::from(p),
            Err(e) => fail(py, "get_rpc_port", &e, Call::Transfer),
        }
    }

    fn get_engine(&self) -> InnerTransferEngine {
        InnerTransferEngine {
            inner: Arc::clone(&self.inner),
        }
    }

    fn get_engine_ptr(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The address of a new engine-owned registered buffer, or 0.
    #[pyo3(signature = (length))]
    fn allocate_managed_buffer(&self, py: Python<'_>, length: UInt) -> u64 {
        match self.inner.allocate_managed(length.0) {
            Ok(a) => a,
            Err(e) => {
                fail(py, "allocate_managed_buffer", &e, Call::Transfer);
                0
            }
        }
    }

    #[pyo3(signature = (buffer_addr, length))]
    fn free_managed_buffer(&self, py: Python<'_>, buffer_addr: UInt, length: UInt) -> i64 {
        let r = self.inner.free_managed(buffer_addr.0, length.0);
        ret(py, "free_managed_buffer", r, Call::Unregister)
    }

    #[pyo3(signature = (segment_name))]
    fn get_first_buffer_address(&self, py: Python<'_>, segment_name: &str) -> u64 {
        let e = Arc::clone(&self.inner);
        match py.allow_threads(|| e.first_buffer_address(segment_name)) {
            Ok(a) => a,
            Err(e) => {
                fail(py, "get_first_buffer_address", &e, Call::Transfer);
                0
            }
        }
    }

    /// A batch id, or 0 on failure.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint=""))]
    fn transfer_submit_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: UInt,
        peer_buffer_address: UInt,
        length: UInt,
        transport_hint: &str,
    ) -> u64 {
        let _ = transport_hint;
        let ranges = (buffer, peer_buffer_address, length);
        self.submit(
            py,
            "transfer_submit_write",
            target_hostname,
            Opcode::Write,
            ranges,
        )
    }

    /// 1 done, 0 in progress, -1 failed (or unknown id), -2 timed out.
    #[pyo3(signature = (batch_id))]
    fn transfer_check_status(&self, py: Python<'_>, batch_id: UInt) -> i64 {
        match self.inner.batch_state(batch_id.0) {
            Ok((BatchState::Done, _)) => 1,
            Ok((BatchState::Running, _)) => 0,
            Ok((BatchState::TimedOut, _)) => -2,
            Ok((BatchState::Failed, e)) => {
                if let Some(e) = e {
                    emit(py, Level::Warning, &format!("transfer_check_status: {e}"));
                }
                -1
            }
            Err(e) => fail(py, "transfer_check_status", &e, Call::Transfer),
        }
    }

    /// Wait for the batches; 0 when all succeeded, -1 otherwise.
    #[pyo3(signature = (batch_ids))]
    fn get_batch_transfer_status(&self, py: Python<'_>, batch_ids: Vec<UInt>) -> i64 {
        let ids = u64s(batch_ids);
        let e = Arc::clone(&self.inner);
        let r = py.allow_threads(|| e.wait_batches(&ids));
        ret(py, "get_batch_transfer_status", r, Call::Transfer)
    }

    /// Copy `length` bytes of `src_ptr` (bytes-like or str) to
    /// `dest_address`, which must lie in registered memory.
    #[pyo3(signature = (dest_address, src_ptr, length))]
    fn write_bytes_to_buffer(
        &self,
        py: Python<'_>,
        dest_address: UInt,
        src_ptr: &Bound<'_, PyAny>,
        length: UInt,
    ) -> PyResult<i64> {
        let data: Vec<u8> = if let Ok(s) = src_ptr.downcast::<PyString>() {
            s.to_str()?.as_bytes().to_vec()
        } else if let Ok(b) = src_ptr.downcast::<PyBytes>() {
            b.as_bytes().to_vec()
        } else {
            crate::buffer::ByteView::new(src_ptr)?.as_slice().to_vec()
        };
        let n = length.usize();
        if n > data.len() {
            let e = EngineError::new(
                ErrorKind::InvalidArgument,
                format!("length {n} exceeds the {} bytes given", data.len()),
            );
            return Ok(fail(py, "write_bytes_to_buffer", &e, Call::Transfer));
        }
        let r = self.inner.write_bytes(dest_address.0, &data[..n]);
        Ok(ret(py, "write_bytes_to_buffer", r, Call::Transfer))
    }

    /// `length` bytes from `source_address` (registered memory); raises
    /// `ValueError` (after logging it) for memory outside it.
    #[pyo3(signature = (source_address, length))]
    fn read_bytes_from_buffer<'py>(
        &self,
        py: Python<'py>,
        source_address: UInt,
        length: UInt,
    ) -> PyResult<Bound<'py, PyBytes>> {
        match self.inner.read_bytes(source_address.0, length.0) {
            Ok(v) => Ok(PyBytes::new(py, &v)),
            Err(e) => {
                emit(py, Level::Warning, &format!("read_bytes_from_buffer: {e}"));
                Err(PyValueError::new_err(format!(
                    "read_bytes_from_buffer: {e}"
                )))
            }
        }
    }

    #[pyo3(signature = (buffer_addr, capacity, location="*"))]
    fn register_memory(
        &self,
        py: Python<'_>,
        buffer_addr: UInt,
        capacity: UInt,
        location: &str,
    ) -> i64 {
        // SAFETY: upstream's contract, which Python callers follow:
        // registered memory stays valid until it is unregistered.
        let r = unsafe {
            self.inner
                .register_memory(buffer_addr.0, capacity.0, location)
        };
        ret(py, "register_memory", r, Call::Register)
    }

    #[pyo3(signature = (buffer_addr))]
    fn unregister_memory(&self, py: Python<'_>, buffer_addr: UInt) -> i64 {
        let r = self.inner.unregister_memory(buffer_addr.0);
        ret(py, "unregister_memory", r, Call::Unregister)
    }

    /// 0 when every region registered; else the first failure's code
    /// (regions registered before it stay registered, as upstream's do).
    #[pyo3(signature = (buffer_addresses, capacities, location="*"))]
    fn batch_register_memory(
        &self,
        py: Python<'_>,
        buffer_addresses: Vec<UInt>,
        capacities: Vec<UInt>,
        location: &str,
    ) -> i64 {
        let m = "batch_register_memory";
        if buffer_addresses.len() != capacities.len() {
            let e = EngineError::new(
                ErrorKind::LengthMismatch,
                format!(
                    "buffer_addresses and capacities have different lengths ({}, {})",
                    buffer_addresses.len(),
                    capacities.len()
                ),
            );
            return fail(py, m, &e, Call::Register);
        }
        for (a, c) in buffer_addresses.iter().zip(&capacities) {
            // SAFETY: as `register_memory`.
            if let Err(e) = unsafe { self.inner.register_memory(a.0, c.0, location) } {
                return fail(py, m, &e, Call::Register);
            }
        }
        0
    }

    /// 0 when every region was unregistered; else the first failure's code
    /// (the others are still unregistered).
    #[pyo3(signature = (buffer_addresses))]
    fn batch_unregister_memory(&self, py: Python<'_>, buffer_addresses: Vec<UInt>) -> i64 {
        let mut first = 0;
        for a in buffer_addresses {
            if let Err(e) = self.inner.unregister_memory(a.0) {
                let c = fail(py, "batch_unregister_memory", &e, Call::Unregister);
                if first == 0 {
                    first = c;
                }
            }
        }
        first
    }

    #[pyo3(signature = (device_name=None))]
    fn get_local_topology(&self, device_name: Option<&str>) -> String {
        self.inner.topology(device_name.unwrap_or(""))
    }

    fn get_notifies(&self, py: Python<'_>) -> Vec<TransferNotify> {
        match self.inner.take_notifies() {
            Ok(v) => v
                .into_iter()
                .map(|(name, msg)| TransferNotify { name, msg })
                .collect(),
            Err(e) => {
                fail(py, "get_notifies", &e, Call::Transfer);
                Vec::new()
            }
        }
    }

    /// 0 when the peer answers; -102 when it is dead (-101 when its name
    /// does not resolve).
    #[pyo3(signature = (peer_server_name))]
    fn send_probe(&self, py: Python<'_>, peer_server_name: &str) -> i64 {
        let e = Arc::clone(&self.inner);
        let r = py.allow_threads(|| e.probe(peer_server_name));
        ret(py, "send_probe", r, Call::Probe)
    }

    /// No EFA in this build: opens (and keeps) a connection to the segment
    /// so the first transfer does not pay for it; 0, or -1 when the segment
    /// cannot be reached.
    #[pyo3(signature = (segment_name))]
    fn warmup_efa_segment(&self, py: Python<'_>, segment_name: &str) -> i64 {
        let e = Arc::clone(&self.inner);
        let r = py.allow_threads(|| e.probe(segment_name));
        ret(py, "warmup_efa_segment", r, Call::Transfer)
    }
}

// Each transfer call comes in forms that differ only in the direction:
// the generic one takes it as `opcode` (the synchronous ones may also
// notify the target), the `*_write` and `*_read` ones fix it.

/// The synchronous and the CUDA-stream transfer methods over one form of
/// the ranges argument ([`Ranges`]): one range, or a batch of them. The two
/// forms differ only in their names and in those of the range parameters.
macro_rules! transfer_methods {
    (
        ranges($buffer:ident, $peer:ident, $length:ident: $ty:ty);
        sync: $sync:ident, $(#[$wm:meta])* $sync_write:ident, $(#[$rm:meta])* $sync_read:ident;
        on_cuda: $(#[$cwm:meta])* $cuda_write:ident, $(#[$crm:meta])* $cuda_read:ident;
    ) => {
        method_family! {
            fn method(
                &self,
                py: Python<'_>,
                target_hostname: &str,
                $buffer: $ty,
                $peer: $ty,
                $length: $ty,
            ) -> i64 {
                let _ = transport_hint;
                let ranges = ($buffer, $peer, $length);
                self.sync(py, method, target_hostname, op, ranges, notify)
            }
            #[pymethods] for TransferEngine {
                #[pyo3(signature = (target_hostname, $buffer, $peer, $length, opcode, notify=None, transport_hint=""))]
                $sync(opcode: TransferOpcode, notify: Option<TransferNotify>, transport_hint: &str) {
                    op: Opcode::from(opcode),
                }
                $(#[$wm])*
                #[pyo3(signature = (target_hostname, $buffer, $peer, $length, transport_hint=""))]
                $sync_write(transport_hint: &str) { op: Opcode::Write, notify: None }
                $(#[$rm])*
                #[pyo3(signature = (target_hostname, $buffer, $peer, $length, transport_hint=""))]
                $sync_read(transport_hint: &str) { op: Opcode::Read, notify: None }
            }
        }

        method_family! {
            #[pyo3(signature = (target_hostname, $buffer, $peer, $length, stream_ptr=0, transport_hint=""))]
            fn method(
                &self,
                py: Python<'_>,
                target_hostname: &str,
                $buffer: $ty,
                $peer: $ty,
                $length: $ty,
                stream_ptr: u64,
                transport_hint: &str,
            ) -> PyResult<()> {
                let _ = transport_hint;
                let ranges = ($buffer, $peer, $length);
                self.on_cuda(py, method, target_hostname, op, ranges, stream_ptr)
            }
            #[pymethods] for TransferEngine {
                $(#[$cwm])*
                $cuda_write { op: Opcode::Write }
                $(#[$crm])*
                $cuda_read { op: Opcode::Read }
            }
        }
    };
}

transfer_methods! {
    ranges(buffer, peer_buffer_address, length: UInt);
    sync: transfer_sync,
        /// Write `length` bytes at `buffer` to the target's address: 0, or
        /// a negative code.
        transfer_sync_write,
        /// Read `length` bytes at the target's address into `buffer`: 0,
        /// or a negative code.
        transfer_sync_read;
    on_cuda:
        /// `transfer_sync_write` ordered on the CUDA stream `stream_ptr`;
        /// raises on failure.
        transfer_write_on_cuda,
        /// `transfer_sync_read` ordered on the CUDA stream `stream_ptr`;
        /// raises on failure.
        transfer_read_on_cuda;
}

transfer_methods! {
    ranges(buffers, peer_buffer_addresses, lengths: Vec<UInt>);
    sync: batch_transfer_sync,
        /// `transfer_sync_write` of several ranges as one batch.
        batch_transfer_sync_write,
        /// `transfer_sync_read` of several ranges as one batch.
        batch_transfer_sync_read;
    on_cuda:
        /// `batch_transfer_sync_write` ordered on the CUDA stream
        /// `stream_ptr`; raises on failure.
        batch_transfer_write_on_cuda,
        /// `batch_transfer_sync_read` ordered on the CUDA stream
        /// `stream_ptr`; raises on failure.
        batch_transfer_read_on_cuda;
}

method_family! {
    fn method(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: Vec<UInt>,
        peer_buffer_addresses: Vec<UInt>,
        lengths: Vec<UInt>,
    ) -> u64 {
        let _ = transport_hint;
        let ranges = (buffers, peer_buffer_addresses, lengths);
        self.submit(py, method, target_hostname, op, ranges)
    }
    #[pymethods] for TransferEngine {
        #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint=""))]
        batch_transfer_async(opcode: TransferOpcode, transport_hint: &str) {
            op: Opcode::from(opcode),
        }
        /// Start a batch write in the background: its batch id, or 0 on
        /// failure.
        #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""))]
        batch_transfer_async_write(transport_hint: &str) { op: Opcode::Write }
        /// Start a batch read in the background: its batch id, or 0 on
        /// failure.
        #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""))]
        batch_transfer_async_read(transport_hint: &str) { op: Opcode::Read }
    }
}

/// Add the engine classes and flags to the module and route the engine's
/// log lines to the `mooncake.engine` logger.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<TransferEngine>()?;
    m.add_class::<TransferOpcode>()?;
    m.add_class::<TransferNotify>()?;
    m.add_class::<InnerTransferEngine>()?;
    m.add(
        "ENGINE_SUPPORT_CUDA",
        mooncake_transfer::engine::cuda_available(),
    )?;
    mooncake_transfer::engine::log::set_sink(|level, msg| {
        // SAFETY: Py_IsInitialized has no preconditions; a line logged
        // while the interpreter is going away is dropped instead.
        if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
            return;
        }
        Python::with_gil(|py| emit(py, level, msg));
    });
    Ok(())
}
