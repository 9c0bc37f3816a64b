//! The engine's RPC protocol, spoken on its TCP port and, between processes
//! of one host, on its abstract Unix socket. Every connection opens with the
//! stack's handshake for [`Service::Engine`](mooncake_common::framing::Service)
//! (which proves the cluster token when one is set); then requests follow
//! one at a time, each a frame (`u32` LE length + bincode [`Request`]):
//!
//! ```text
//! Describe          -> frame(Descriptor)
//! Probe             -> status
//! Notify            -> status
//! Write { ranges }  + the ranges' bytes, concatenated   -> status
//! Read { ranges }   -> status | the ranges' bytes when status is 0
//! VmWrite { pairs } -> status   (Unix socket only: the target copies from
//! VmRead { pairs }  -> status    the initiator's memory, or into it)
//! VmWriteShared { pairs, split } -> status, or GO + status (see below)
//! VmReadShared { pairs, split }     (Unix socket only; see below)
//! IpcWrite { handle, pairs } -> status (Unix socket only: the target maps
//! IpcRead { handle, pairs }  -> status  the initiator's exported device
//!                                      allocation and copies from or into it)
//! ```
//!
//! A `Vm*` request whose target ranges lie in device memory is answered
//! [`STATUS_DEVICE`]: the initiator sends it as `Write`/`Read` instead,
//! which the target stages through pinned host memory. A target that
//! cannot map a CUDA IPC handle answers [`STATUS_IPC_REFUSED`]: the
//! initiator stages its device memory itself.
//!
//! A shared copy splits one cross-process copy between the two processes,
//! so that two cores move it: the target checks and pins every pair and
//! answers [`STATUS_GO`] (or a refusal, and the request ends there), then
//! copies the bytes before `split` (counted along the pairs) while the
//! initiator copies the rest. Each side then sends the status of its own
//! part (an `i32` LE); the target keeps its regions pinned until the
//! initiator's status has arrived.
//!
//! A status is an `i32` LE: 0, or one of the `STATUS_*` codes. Ranges are
//! `(address in the target, length)`; pairs are `(address in the initiator,
//! address in the target, length)`.

use serde::{Deserialize, Serialize};

/// The request succeeded.
pub const STATUS_OK: i32 = 0;
/// A target range lies outside the memory the target registered.
pub const STATUS_OUT_OF_BOUNDS: i32 = -1;
/// The request is malformed (lengths overflow, too many ranges).
pub const STATUS_BAD_REQUEST: i32 = -2;
/// The kernel refused the cross-process copy (`EPERM`): use TCP.
pub const STATUS_VM_DENIED: i32 = -3;
/// The cross-process copy failed otherwise (the initiator's memory is
/// not mapped, or the initiator is gone).
pub const STATUS_VM_FAILED: i32 = -4;

/// A target range of a cross-process copy is device memory: use
/// `Write`/`Read`.
pub const STATUS_DEVICE: i32 = -5;
/// The target cannot map the initiator's CUDA IPC handle: stage instead.
pub const STATUS_IPC_REFUSED: i32 = -6;

/// The target checked a shared copy's pairs: the initiator copies its part.
pub const STATUS_GO: i32 = 1;

/// Most ranges one request carries.
pub const MAX_RANGES: usize = 1 << 22;

/// One request (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// The target's descriptor.
    Describe,
    /// Liveness.
    Probe,
    /// Queue a notification at the target.
    Notify {
        /// The notification's name.
        name: String,
        /// Its message.
        msg: String,
    },
    /// Write the payload that follows into these target ranges.
    Write {
        /// `(target address, length)`.
        ranges: Vec<(u64, u64)>,
    },
    /// Send back these target ranges.
    Read {
        /// `(target address, length)`.
        ranges: Vec<(u64, u64)>,
    },
    /// Copy from the initiator's memory into the target's.
    VmWrite {
        /// `(initiator address, target address, length)`.
        pairs: Vec<(u64, u64, u64)>,
    },
    /// Copy from the target's memory into the initiator's.
    VmRead {
        /// `(initiator address, target address, length)`.
        pairs: Vec<(u64, u64, u64)>,
    },
    /// [`Request::VmWrite`] with the bytes from `split` on copied by the
    /// initiator.
    VmWriteShared {
        /// `(initiator address, target address, length)`.
        pairs: Vec<(u64, u64, u64)>,
        /// Bytes, counted along the pairs, that the target copies.
        split: u64,
    },
    /// [`Request::VmRead`] with the bytes from `split` on copied by the
    /// initiator.
    VmReadShared {
        /// `(initiator address, target address, length)`.
        pairs: Vec<(u64, u64, u64)>,
        /// Bytes, counted along the pairs, that the target copies.
        split: u64,
    },
    /// Copy from the initiator's exported device allocation into the
    /// target's memory.
    IpcWrite {
        /// The allocation's IPC handle.
        handle: Vec<u8>,
        /// `(offset in the allocation, target address, length)`.
        pairs: Vec<(u64, u64, u64)>,
    },
    /// Copy from the target's memory into the initiator's exported device
    /// allocation.
    IpcRead {
        /// The allocation's IPC handle.
        handle: Vec<u8>,
        /// `(offset in the allocation, target address, length)`.
        pairs: Vec<(u64, u64, u64)>,
    },
}

impl Request {
    /// The number of ranges the request names.
    pub fn len(&self) -> usize {
        match self {
            Request::Write { ranges } | Request::Read { ranges } => ranges.len(),
            Request::VmWrite { pairs }
            | Request::VmRead { pairs }
            | Request::VmWriteShared { pairs, .. }
            | Request::VmReadShared { pairs, .. }
            | Request::IpcWrite { pairs, .. }
            | Request::IpcRead { pairs, .. } => pairs.len(),
            _ => 0,
        }
    }

    /// Whether the request names no range.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a peer needs to reach an engine, published to the metadata server
/// or answered to `Describe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptor {
    /// The engine's segment name (`host:rpc_port` under `P2PHANDSHAKE`).
    pub name: String,
    /// Where its RPC port listens (`host`).
    pub rpc_host: String,
    /// Its RPC port.
    pub rpc_port: u16,
    /// Its host identity (same boot, hostname and network namespace).
    pub host_id: String,
    /// Its abstract Unix socket for same-host requests (empty: none).
    pub unix_name: String,
    /// Its process id.
    pub pid: u32,
    /// Its registered regions `(address, length)`, in registration order.
    pub buffers: Vec<(u64, u64)>,
}

impl Descriptor {
    /// `host:port` of the RPC endpoint.
    pub fn endpoint(&self) -> String {
        if self.rpc_host.contains(':') {
            format!("[{}]:{}", self.rpc_host, self.rpc_port)
        } else {
            format!("{}:{}", self.rpc_host, self.rpc_port)
        }
    }
}

/// Sum of range lengths, `None` when it overflows.
pub fn total(lens: impl Iterator<Item = u64>) -> Option<u64> {
    lens.into_iter().try_fold(0u64, |a, l| a.checked_add(l))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooncake_common::framing::{decode, encode};

    #[test]
    fn requests_roundtrip() {
        for r in [
            Request::Describe,
            Request::Probe,
            Request::Notify {
                name: "n".into(),
                msg: "m".into(),
            },
            Request::Write {
                ranges: vec![(1, 2), (3, 4)],
            },
            Request::VmRead {
                pairs: vec![(1, 2, 3)],
            },
            Request::VmWriteShared {
                pairs: vec![(1, 2, 3)],
                split: 1,
            },
        ] {
            let b = encode(&r).unwrap();
            assert_eq!(decode::<Request>(&b).unwrap(), r);
        }
        assert!(decode::<Request>(&[9, 0, 0, 0]).is_err());
        assert_eq!(total([1u64, 2].into_iter()), Some(3));
        assert_eq!(total([u64::MAX, 1].into_iter()), None);
    }

    #[test]
    fn endpoints_bracket_ipv6() {
        let mut d = Descriptor {
            name: "n".into(),
            rpc_host: "10.0.0.1".into(),
            rpc_port: 5,
            host_id: String::new(),
            unix_name: String::new(),
            pid: 1,
            buffers: vec![],
        };
        assert_eq!(d.endpoint(), "10.0.0.1:5");
        d.rpc_host = "::1".into();
        assert_eq!(d.endpoint(), "[::1]:5");
    }
}
