//! The protocol between a dummy client and its `mooncake_client` daemon.
//!
//! Both ends run on one host and talk over the daemon's abstract Unix
//! socket [`socket_name`]`(port)`. Every connection opens with the stack's
//! handshake ([`Service::Standalone`]: protocol version and, when either
//! side holds a cluster token, proof of it), then one [`Open`] frame:
//!
//! * the dummy's first connection sends [`Open::Attach`]; it stays open for
//!   the dummy's life and carries [`Control`] requests (mapping its shared
//!   memory, registering buffers, pings). Its end (the dummy closed, or its
//!   process died) is how the daemon learns to reclaim what the dummy held;
//! * every further connection sends [`Open::Join`] and carries [`Call`]s,
//!   one at a time; the dummy keeps a pool of them, one per concurrent call.
//!
//! Payloads never cross the socket: a [`Buf`] names bytes of the dummy's
//! shared memory (a region id the daemon mapped, an offset, a length), and
//! the daemon's client reads and writes them in place. A region's memfd
//! crosses once, with `SCM_RIGHTS`, right after its [`Control::Map`] frame.
//!
//! Frames are the stack's length-prefixed bincode frames. Each request has
//! one reply type, named in its doc; two-phase calls (a read whose result
//! sizes decide where it goes) exchange one more frame pair in between.

use crate::bufs::Buf;
use crate::moves::Move;
use crate::queries::Query;
use mooncake_client::{Error, ReplicateConfig, Result, WriteMode};
use mooncake_common::framing::{decode, encode_frame, read_frame, MAX_REQUEST_FRAME};
use mooncake_common::spin_read::{spin_budget, SpinReader};
use mooncake_tensor::{
    DType, Parallelism, RawAxis, RawWriterPartition, ReadMode, ReadOutput, ReadRequest, WriteRoute,
    WriteSource, WriterPartition, HEADER_SIZE,
};
use mooncake_transfer::net::sockio::{recv_with_fds, send_with_fds};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

pub(crate) use mooncake_common::framing::Service;

/// Largest frame either side accepts (requests list keys and ranges, never
/// payload bytes).
pub(crate) const MAX_FRAME: usize = MAX_REQUEST_FRAME;

/// The abstract Unix socket (without its leading NUL) a daemon serving
/// port `port` listens on.
pub fn socket_name(port: u16) -> String {
    format!("mooncake-rs-client-{port}")
}

/// First frame of a connection, after the handshake.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Open {
    /// A new dummy attaches (its control connection). Reply: [`Attached`].
    Attach {
        /// The dummy's id.
        dummy: String,
        /// Its process id (for logs).
        pid: u32,
        /// Its `MC_STORE_CLUSTER_ID`.
        cluster_id: String,
        /// `setup_dummy`'s `mem_pool_size`.
        mem_pool_size: u64,
        /// `setup_dummy`'s `local_buffer_size`.
        local_buffer_size: u64,
    },
    /// Another connection of an attached dummy. Reply: `Result<Attached>`.
    Join {
        /// The dummy's id.
        dummy: String,
    },
}

/// The daemon's answer to [`Open`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Attached {
    /// The daemon's instance id (a restarted daemon has a new one).
    pub(crate) daemon: String,
    /// The daemon's segment name (`get_hostname()` of its client).
    pub(crate) hostname: String,
}

/// Requests on the control connection.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Control {
    /// Map region `region` of `size` bytes; its memfd follows with
    /// `SCM_RIGHTS` on a one-byte message. Reply: `Result<()>`.
    Map {
        /// Region id.
        region: u64,
        /// Size in bytes.
        size: u64,
    },
    /// Forget region `region` (its buffers are unregistered). Reply: `Result<()>`.
    Unmap {
        /// Region id.
        region: u64,
    },
    /// `register_buffer` of `buf`. Reply: `Result<()>`.
    Register(Buf),
    /// `unregister_buffer` of the buffer starting at `buf`. Reply: `Result<()>`.
    Unregister(Buf),
    /// Is the daemon and its client healthy? Reply: `i32` (`health_check()`).
    Ping,
}

/// A tensor axis list travels as the caller gave it ([`RawAxis`],
/// from [`Parallelism::raw_axes`]) and is validated again by the daemon.
fn axes_in(v: &[RawAxis]) -> Result<Parallelism> {
    Ok(Parallelism::new(v)?)
}

/// A tensor write's route.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum WireRoute {
    Full,
    Verbatim(u64),
    Writer(i64, i64, i64),
    Parallelism(Vec<RawAxis>),
    AllTpRanks(Vec<RawAxis>),
}

impl WireRoute {
    pub(crate) fn from_route(r: &WriteRoute) -> WireRoute {
        match r {
            WriteRoute::Full => WireRoute::Full,
            WriteRoute::Verbatim { size } => WireRoute::Verbatim(*size),
            WriteRoute::Writer(w) => {
                WireRoute::Writer(i64::from(w.rank), i64::from(w.size), w.split_dim as i64)
            }
            WriteRoute::Parallelism(p) => WireRoute::Parallelism(p.raw_axes()),
            WriteRoute::AllTpRanks(p) => WireRoute::AllTpRanks(p.raw_axes()),
        }
    }

    pub(crate) fn to_route(&self) -> Result<WriteRoute> {
        Ok(match self {
            WireRoute::Full => WriteRoute::Full,
            WireRoute::Verbatim(size) => WriteRoute::Verbatim { size: *size },
            WireRoute::Writer(rank, size, split_dim) => {
                WriteRoute::Writer(WriterPartition::new(RawWriterPartition {
                    rank: *rank,
                    size: *size,
                    split_dim: *split_dim,
                })?)
            }
            WireRoute::Parallelism(a) => WriteRoute::Parallelism(axes_in(a)?),
            WireRoute::AllTpRanks(a) => WriteRoute::AllTpRanks(axes_in(a)?),
        })
    }
}

/// One tensor write: the source lies in `src` (its first byte is the
/// caller's byte 0).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireWrite {
    pub(crate) key: String,
    pub(crate) dtype: i32,
    pub(crate) shape: Vec<u64>,
    pub(crate) payload_offset: u64,
    pub(crate) src: Buf,
    pub(crate) route: WireRoute,
}

impl WireWrite {
    /// The source description of this write.
    pub(crate) fn source(&self) -> Result<WriteSource> {
        let dtype = DType::from_code(self.dtype)
            .ok_or_else(|| Error::invalid(format!("unknown dtype code {}", self.dtype)))?;
        Ok(WriteSource {
            dtype,
            shape: self.shape.clone(),
            payload_offset: self.payload_offset,
        })
    }
}

/// One tensor read request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireRead {
    key: String,
    mode: u8,
    parallelism: Option<Vec<RawAxis>>,
    advisory_split_dim: bool,
}

impl WireRead {
    pub(crate) fn from_request(r: &ReadRequest) -> WireRead {
        WireRead {
            key: r.key.clone(),
            mode: match r.mode {
                ReadMode::AsStored => 0,
                ReadMode::Shard => 1,
                ReadMode::Full => 2,
            },
            parallelism: r.parallelism.as_ref().map(Parallelism::raw_axes),
            advisory_split_dim: r.advisory_split_dim,
        }
    }

    pub(crate) fn to_request(&self) -> Result<ReadRequest> {
        Ok(ReadRequest {
            key: self.key.clone(),
            mode: match self.mode {
                0 => ReadMode::AsStored,
                1 => ReadMode::Shard,
                2 => ReadMode::Full,
                m => return Err(Error::invalid(format!("unknown read mode {m}"))),
            },
            parallelism: self.parallelism.as_deref().map(axes_in).transpose()?,
            advisory_split_dim: self.advisory_split_dim,
        })
    }
}

/// What a tensor read produces (its dtype, shape, size and header).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireOutput {
    dtype: i32,
    shape: Vec<u64>,
    nbytes: u64,
    header: Vec<u8>,
}

impl WireOutput {
    pub(crate) fn from_output(o: &ReadOutput) -> WireOutput {
        WireOutput {
            dtype: o.dtype.code(),
            shape: o.shape.clone(),
            nbytes: o.nbytes,
            header: o.header.to_vec(),
        }
    }

    pub(crate) fn to_output(&self) -> Result<ReadOutput> {
        let dtype = DType::from_code(self.dtype)
            .ok_or_else(|| Error::internal(format!("unknown dtype code {}", self.dtype)))?;
        let header: [u8; HEADER_SIZE] = self
            .header
            .as_slice()
            .try_into()
            .map_err(|_| Error::internal("tensor header of the wrong size"))?;
        Ok(ReadOutput {
            dtype,
            shape: self.shape.clone(),
            nbytes: self.nbytes,
            header,
        })
    }
}

/// Where one tensor read goes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) enum WireDest {
    /// The payload alone, `nbytes` bytes.
    Payload(Buf),
    /// A caller buffer: header, then payload.
    Into(Buf),
}

/// A store call on a joined connection, one per method of the daemon's
/// client. The doc of each names its reply.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Call {
    /// `put`/`upsert` of the bytes in `src`. Reply: `Result<()>`.
    Put {
        key: String,
        src: Buf,
        cfg: ReplicateConfig,
        upsert: bool,
    },
    /// `put_parts`/`upsert_parts`. Reply: `Result<u64>`.
    PutParts {
        key: String,
        parts: Vec<Buf>,
        cfg: ReplicateConfig,
        upsert: bool,
    },
    /// `put_batch`/`upsert_batch`. Reply: `Result<()>`.
    PutBatch {
        keys: Vec<String>,
        values: Vec<Buf>,
        cfg: ReplicateConfig,
        upsert: bool,
    },
    /// Whole values (`get`, `get_batch`, `get_buffer`): the daemon answers
    /// the sizes (`Vec<Result<u64>>`), the dummy names a destination per key
    /// (`Vec<Option<Buf>>`), then the reply is `Vec<Result<u64>>`.
    GetValues { keys: Vec<String> },
    /// A plain-value operation of the store (see `queries`): its
    /// arguments as encoded by the dummy. Reply: the operation's result.
    Query { query: Query, args: Vec<u8> },
    /// A memory-moving operation of the store (see `moves`): its carried
    /// arguments as encoded by the dummy, which name `payload` bytes of
    /// shared memory. Reply: the operation's result.
    Move {
        mv: Move,
        args: Vec<u8>,
        payload: u64,
    },
    /// `get_into_ranges`; each buffer is the rest of its region from the
    /// caller's pointer. Reply: `Ranges` (`Vec<Vec<Vec<Result<u64>>>>`).
    GetRanges {
        buffers: Vec<Buf>,
        keys: Vec<Vec<String>>,
        dst_offsets: Vec<Vec<Vec<u64>>>,
        src_offsets: Vec<Vec<Vec<u64>>>,
        sizes: Vec<Vec<Vec<u64>>>,
    },
    /// Reply: `Result<Vec<Result<()>>>`.
    PutSessionStart {
        keys: Vec<String>,
        sizes: Vec<u64>,
        cfg: ReplicateConfig,
    },
    /// `batch_put_session_end` (or `_revoke`). Reply: `Vec<Result<()>>`.
    PutSessionEnd { keys: Vec<String>, revoke: bool },
    /// Reply: `Vec<Result<()>>`.
    GetSessionStart { keys: Vec<String> },
    /// Reply: `Result<()>`.
    GetSessionEnd { keys: Vec<String> },
    /// Reply: `Result<Vec<Result<()>>>`.
    WriteTensors {
        items: Vec<Result<WireWrite>>,
        cfg: ReplicateConfig,
        mode: WriteMode,
    },
    /// Two-phase: the daemon answers the planned outputs
    /// (`Vec<Result<WireOutput>>`), the dummy a destination per item
    /// (`Vec<Option<WireDest>>`), then the reply is `Vec<Result<WireOutput>>`.
    ReadTensors { reqs: Vec<Result<WireRead>> },
    /// Reply: `Vec<(String, u64)>` (the daemon client's counters).
    Stats,
}

impl Call {
    /// Bytes of shared memory the daemon reads or writes for this call, as
    /// far as the request says: 0 for calls that move no payload (lookups,
    /// removals, session starts and ends, counters); `None` where the
    /// request does not say (two-phase reads, ranges, tensors).
    pub(crate) fn payload(&self) -> Option<u64> {
        fn sum<'a>(bufs: impl IntoIterator<Item = &'a Buf>) -> u64 {
            bufs.into_iter().map(|b| b.len).sum()
        }
        Some(match self {
            Call::Put { src, .. } => src.len,
            Call::PutParts { parts, .. } => sum(parts),
            Call::PutBatch { values, .. } => sum(values),
            Call::Move { payload, .. } => *payload,
            Call::Query { .. }
            | Call::PutSessionStart { .. }
            | Call::PutSessionEnd { .. }
            | Call::GetSessionStart { .. }
            | Call::GetSessionEnd { .. }
            | Call::Stats => 0,
            Call::GetValues { .. }
            | Call::GetRanges { .. }
            | Call::WriteTensors { .. }
            | Call::ReadTensors { .. } => return None,
        })
    }
}

/// Write `value` as one frame.
pub(crate) fn send<T: Serialize>(s: &mut UnixStream, value: &T) -> io::Result<()> {
    s.write_all(&encode_frame(value)?)
}

/// Read one frame and decode it. The read polls the socket briefly before
/// blocking (`MC_RPC_SPIN_US`): the answer to a call, or a dummy's next
/// call, usually comes sooner than a parked thread wakes up.
pub(crate) fn recv<T: DeserializeOwned>(s: &mut UnixStream) -> io::Result<T> {
    decode(&read_frame(&mut SpinReader::new(s.as_fd()), MAX_FRAME)?)
}

/// [`recv`], polling for up to `spin` (at least `MC_RPC_SPIN_US`) before
/// blocking, while the core is not wanted by another thread
/// ([`poll_then_block`]).
pub(crate) fn recv_within<T: DeserializeOwned>(
    s: &mut UnixStream,
    spin: Duration,
) -> io::Result<T> {
    let mut r = PollFor {
        fd: s.as_raw_fd(),
        spin: spin.max(spin_budget()),
    };
    decode(&read_frame(&mut r, MAX_FRAME)?)
}

/// Reads of a socket through [`poll_then_block`].
struct PollFor {
    fd: RawFd,
    spin: Duration,
}

impl Read for PollFor {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        poll_then_block(self.fd, buf, self.spin)
    }
}

/// A yield that kept the core away longer than this means another thread
/// wanted it.
const YIELD_TAKEN: Duration = Duration::from_micros(20);

/// Read at least one byte into `buf`: poll with non-blocking `recv` for up
/// to `spin`, yielding the core between polls, then block (honouring the
/// socket's read timeout). Returns the byte count; 0 means the peer closed.
///
/// Polling pays off only on an idle core: there a parked thread costs a
/// wakeup of tens of microseconds on a VM, while a yield comes straight
/// back. On a busy core a yield hands the core to another thread for its
/// whole time slice, while a parked thread is run as soon as its data
/// comes; so the first yield that kept the core away longer than
/// [`YIELD_TAKEN`] ends the polling.
fn poll_then_block(fd: RawFd, buf: &mut [u8], spin: Duration) -> io::Result<usize> {
    if buf.is_empty() {
        return Ok(0);
    }
    let start = Instant::now();
    let mut flags = libc::MSG_DONTWAIT;
    loop {
        // SAFETY: `buf` is a writable slice of `buf.len()` bytes.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock if flags != 0 => {
                let before = Instant::now();
                if before.duration_since(start) >= spin {
                    flags = 0;
                    continue;
                }
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
                if before.elapsed() > YIELD_TAKEN {
                    flags = 0;
                }
            }
            _ => return Err(err),
        }
    }
}

/// Send `fd` (with one marker byte) after a frame.
pub(crate) fn send_fd(s: &UnixStream, fd: RawFd) -> io::Result<()> {
    send_with_fds(s, &[1u8], &[fd])
}

/// Receive the descriptor [`send_fd`] sent.
pub(crate) fn recv_fd(s: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let (_, mut fds) = recv_with_fds::<1>(s, &mut byte)?;
    let n = fds.len();
    match fds.pop() {
        Some(fd) if n == 1 => Ok(fd),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("expected one descriptor, got {n}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_requests_round_trip_and_are_validated_again() {
        let p = Parallelism::new(&[RawAxis::new("tp", 1, 4).split(0)]).unwrap();
        let r = ReadRequest {
            key: "k".into(),
            mode: ReadMode::Shard,
            parallelism: Some(p.clone()),
            advisory_split_dim: true,
        };
        assert_eq!(WireRead::from_request(&r).to_request().unwrap(), r);
        let route = WriteRoute::Parallelism(p);
        assert_eq!(WireRoute::from_route(&route).to_route().unwrap(), route);
        let bad = WireRoute::Writer(3, 2, 0);
        assert_eq!(
            bad.to_route().unwrap_err().code(),
            mooncake_common::ErrorCode::InvalidParams
        );
    }

    #[test]
    fn a_call_names_the_payload_it_moves() {
        let b = |len| Buf {
            region: 1,
            offset: 0,
            len,
        };
        let keys = vec!["a".to_string(), "b".to_string()];
        let put = Call::PutBatch {
            keys: keys.clone(),
            values: vec![b(3), b(4)],
            cfg: ReplicateConfig::default(),
            upsert: false,
        };
        assert_eq!(put.payload(), Some(7));
        let mv = Call::Move {
            mv: Move::batch_get_into,
            args: Vec::new(),
            payload: 8,
        };
        assert_eq!(mv.payload(), Some(8));
        let remove_all = Call::Query {
            query: Query::remove_all,
            args: mooncake_common::framing::encode(&(true,)).unwrap(),
        };
        assert_eq!(remove_all.payload(), Some(0));
        assert_eq!(Call::GetValues { keys }.payload(), None);
    }

    #[test]
    fn a_reply_polled_for_arrives_and_a_closed_peer_is_an_error() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        send(&mut a, &(7u32, "x".to_string())).unwrap();
        let got: (u32, String) = recv_within(&mut b, Duration::from_millis(5)).unwrap();
        assert_eq!(got, (7, "x".to_string()));
        drop(a);
        let e = recv_within::<u32>(&mut b, Duration::from_millis(5)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn descriptors_cross_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let f = std::fs::File::open("/proc/self/status").unwrap();
        send_fd(&a, f.as_raw_fd()).unwrap();
        let got = recv_fd(&b).unwrap();
        assert!(got.as_raw_fd() >= 0);
    }
}
