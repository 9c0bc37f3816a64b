//! The master's RPC server: length-prefixed bincode frames over TCP, one
//! request/response at a time per connection, a version handshake first.
//!
//! Connections are accepted on the tokio runtime but served on one blocking
//! thread each: a request wakes its thread directly out of `read`, without
//! a reactor hop, which keeps the round trip short on small machines.

use crate::gate::Gate;
use crate::recovery::Remount;
use crate::state::MasterState;
use mooncake_common::framing::{self, Hello, Service, MAX_CONTROL_FRAME};
use mooncake_common::proto::{MasterRequest, MasterResponse};
use mooncake_common::spin_read::SpinReader;
use mooncake_common::ErrorCode;
use std::io::{self, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// How long the master waits for a ledger ack on a ledger stream.
const LEDGER_ACK_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Accept connections forever, one serving thread per connection; each
/// request is served by the gate's current term (none: UNAVAILABLE).
pub async fn serve(listener: TcpListener, state: Arc<Gate>) {
    loop {
        match listener.accept().await {
            Ok((sock, peer)) => {
                let sock = match sock.into_std().and_then(|s| {
                    s.set_nonblocking(false)?;
                    Ok(s)
                }) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(%peer, error = %e, "cannot take over rpc connection");
                        continue;
                    }
                };
                let st = Arc::clone(&state);
                let spawned = std::thread::Builder::new()
                    .name("mc-master-rpc".into())
                    .spawn(move || {
                        if let Err(e) = handle_conn(sock, st) {
                            if e.kind() != io::ErrorKind::UnexpectedEof {
                                tracing::warn!(%peer, error = %e, "rpc connection closed");
                            }
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!(%peer, error = %e, "cannot spawn rpc thread");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// Write one frame (length prefix + body) with a single `write`.
fn write_frame(sock: &mut TcpStream, out: &mut Vec<u8>, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "response too large"))?;
    out.clear();
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(body);
    sock.write_all(out)
}

fn handle_conn(mut sock: TcpStream, gate: Arc<Gate>) -> io::Result<()> {
    let cfg = match gate.serving() {
        Some(t) => t.state.config().clone(),
        None => crate::config::MasterConfig::default(),
    };
    let _ = sock.set_nodelay(cfg.rpc_enable_tcp_no_delay);
    let idle = cfg.rpc_conn_timeout_seconds;
    if idle > 0 {
        sock.set_read_timeout(Some(std::time::Duration::from_secs(idle as u64)))?;
    }
    let mut rd = BufReader::with_capacity(64 << 10, SpinReader::new(sock.try_clone()?));
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    let hello_body = framing::read_frame(&mut rd, 1024)?;
    let hello: Hello = framing::decode(&hello_body)?;
    let ours = framing::encode(&Hello::new(Service::Master))?;
    if let Err(e) = hello.check(Service::Master) {
        tracing::warn!(error = %e, "refusing rpc connection");
        let _ = write_frame(&mut sock, &mut out, &ours);
        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
    }
    write_frame(&mut sock, &mut out, &ours)?;
    let mut conn_epoch: Option<u64> = None;
    loop {
        let body = match framing::read_frame(&mut rd, MAX_CONTROL_FRAME) {
            Ok(b) => b,
            // The idle timeout (`rpc_conn_timeout_seconds`) ran out.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(())
            }
            Err(e) => return Err(e),
        };
        let req: MasterRequest = framing::decode(&body)?;
        // A request is served by the term that is serving now; a connection
        // never outlives its term (the client reconnects and, being unknown
        // to the new term, remounts).
        let term = match gate.serving() {
            Some(t) if conn_epoch.is_none_or(|e| e == t.epoch) => t,
            _ => {
                let resp = MasterResponse::Err(ErrorCode::UnavailableInCurrentStatus);
                sock.write_all(&framing::encode_frame(&resp)?)?;
                return Ok(());
            }
        };
        conn_epoch = Some(term.epoch);
        if let MasterRequest::LedgerStream {
            client_id,
            segment_name,
        } = req
        {
            return serve_ledger(sock, rd, &term.state, &client_id, &segment_name);
        }
        if is_mutation(&req) {
            gate.status().note_write();
        }
        let resp = dispatch(&term.state, req);
        sock.write_all(&framing::encode_frame(&resp)?)?;
    }
}

/// Requests that change metadata (what a deposed leader must stop accepting).
fn is_mutation(req: &MasterRequest) -> bool {
    matches!(
        req,
        MasterRequest::PutStart { .. }
            | MasterRequest::PutEnd { .. }
            | MasterRequest::CommitEnd { .. }
            | MasterRequest::PutRevoke { .. }
            | MasterRequest::Remove { .. }
            | MasterRequest::RemoveByRegex { .. }
            | MasterRequest::RemoveAll { .. }
            | MasterRequest::MountSegment { .. }
            | MasterRequest::RemountSegment { .. }
            | MasterRequest::UnmountSegment { .. }
    ) || matches!(req, MasterRequest::WithDone { req, .. } if is_mutation(req))
}

/// Reads from the buffered reader, writes to the socket.
struct Duplex<'a, R> {
    rd: &'a mut R,
    wr: &'a mut TcpStream,
}

impl<R: Read> Read for Duplex<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.rd.read(buf)
    }
}

impl<R> Write for Duplex<'_, R> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.wr.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.wr.flush()
    }
}

/// Serve the owner's ledger stream of `segment` on this connection.
fn serve_ledger<R: Read>(
    mut sock: TcpStream,
    mut rd: R,
    state: &Arc<MasterState>,
    client_id: &str,
    segment: &str,
) -> io::Result<()> {
    let Some((queue, uuid)) = state.ledger_queue(client_id, segment) else {
        let resp = MasterResponse::Err(ErrorCode::SegmentNotFound);
        sock.write_all(&framing::encode_frame(&resp)?)?;
        return Ok(());
    };
    sock.write_all(&framing::encode_frame(&MasterResponse::Ok)?)?;
    sock.set_read_timeout(Some(LEDGER_ACK_READ_TIMEOUT))?;
    let mut duplex = Duplex {
        rd: &mut rd,
        wr: &mut sock,
    };
    let st = Arc::clone(state);
    let (seg, id) = (segment.to_string(), uuid);
    queue.serve(&mut duplex, &move |ranges| {
        st.release_forgotten(&seg, &id, ranges)
    })
}

/// Execute one request against the state.
pub fn dispatch(state: &MasterState, req: MasterRequest) -> MasterResponse {
    match req {
        MasterRequest::Ping { client_id } => MasterResponse::Pong {
            need_remount: state.ping(&client_id),
        },
        MasterRequest::MountSegment { client_id, segment } => {
            match state.mount_segment(&client_id, segment) {
                Ok(()) => MasterResponse::Ok,
                Err(e) => MasterResponse::Err(e),
            }
        }
        MasterRequest::UnmountSegment {
            client_id,
            segment_name,
        } => match state.unmount_segment(&client_id, &segment_name) {
            Ok(()) => MasterResponse::Ok,
            Err(e) => MasterResponse::Err(e),
        },
        MasterRequest::Disconnect { client_id } => {
            state.disconnect(&client_id);
            MasterResponse::Ok
        }
        MasterRequest::PutStart {
            keys,
            sizes,
            config,
            upsert,
        } => MasterResponse::PutStart(state.put_start(&keys, &sizes, &config, upsert)),
        MasterRequest::PutEnd { keys } => match state.put_end(&keys) {
            Ok(()) => MasterResponse::Ok,
            Err(e) => MasterResponse::Err(e),
        },
        MasterRequest::CommitEnd {
            keys,
            local_segments,
        } => match state.commit_end(&keys, &local_segments) {
            Ok(ops) => MasterResponse::Committed { ops },
            Err(e) => MasterResponse::Err(e),
        },
        MasterRequest::PutRevoke { keys } => {
            state.put_revoke(&keys);
            MasterResponse::Ok
        }
        MasterRequest::GetReplicaList { keys, track } => {
            MasterResponse::Objects(state.get_replica_list_owned(keys, track))
        }
        MasterRequest::ReadsDone { tickets } => {
            state.reads_done(&tickets);
            MasterResponse::Ok
        }
        MasterRequest::WithDone { done, req } => {
            state.reads_done(&done);
            match *req {
                // No nesting: one envelope per request.
                MasterRequest::WithDone { .. } => MasterResponse::Err(ErrorCode::InvalidParams),
                inner => dispatch(state, inner),
            }
        }
        MasterRequest::Exist { keys } => MasterResponse::Codes(state.exist(&keys)),
        MasterRequest::Remove { keys, force } => MasterResponse::Codes(state.remove(&keys, force)),
        MasterRequest::RemoveByRegex { pattern, force } => {
            MasterResponse::Count(state.remove_by_regex(&pattern, force))
        }
        MasterRequest::RemoveAll { force } => MasterResponse::Count(state.remove_all(force)),
        MasterRequest::RemountSegment {
            client_id,
            segment,
            entries,
            done,
        } => match state.remount_segment(&client_id, segment, entries, done) {
            Ok(Remount::Partial) => MasterResponse::Ok,
            Ok(Remount::Done { stale, discard_all }) => {
                MasterResponse::Remounted { stale, discard_all }
            }
            Err(e) => MasterResponse::Err(e),
        },
        // Only meaningful as the first request of a connection (handled there).
        MasterRequest::LedgerStream { .. } => MasterResponse::Err(ErrorCode::InvalidParams),
    }
}
