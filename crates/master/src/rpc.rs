//! The master's RPC server: length-prefixed bincode frames over TCP, one
//! request/response at a time per connection, the version (and, with a
//! cluster token, authentication) handshake first.
//!
//! Connections are accepted on the tokio runtime but served on one blocking
//! thread each: a request wakes its thread directly out of `read`, without
//! a reactor hop, which keeps the round trip short on small machines.
//!
//! Every connection is admitted against the listener's caps (in total and
//! per peer address); a connection silent for the idle timeout is closed;
//! the handshake must complete within [`HANDSHAKE_TIMEOUT`]; a request frame
//! is read against [`MAX_REQUEST_FRAME`] and decoded without recursion.
//! When the process runs out of descriptors the accept loop
//! backs off instead of spinning.
//!
//! Requests are served by the gate's current term: a standby (or
//! a leader whose etcd lease clock ran out) answers
//! UNAVAILABLE_IN_CURRENT_STATUS and closes the connection, and a
//! connection never outlives its term. A `LedgerStream` request turns the
//! connection into the owner's ledger stream of its segment. A `Tenant`
//! request sets the tenant the connection's later requests act for (see
//! `tenants`): their keys are mapped into its namespace here, and keys in
//! answers mapped back.

use crate::conn_read::ConnReader;
use crate::gate::Gate;
use crate::memory;
use crate::recovery::Remount;
use crate::state::MasterState;
use crate::tenants::Scope;
use mooncake_common::framing::{self, server_handshake, Service, MAX_REQUEST_FRAME};
use mooncake_common::limits::{AcceptBackoff, ConnPermit, ConnTracker};
use mooncake_common::proto::{MasterRequest, MasterResponse, RequestFrame};
use mooncake_common::ErrorCode;
use std::io::{self, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Time a new connection has to complete the handshake (the idle timeout
/// when that is shorter).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the master waits for a ledger ack on a ledger stream.
const LEDGER_ACK_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Accept connections until the task is dropped, one serving thread per
/// admitted connection.
pub async fn serve(listener: TcpListener, state: Arc<Gate>) {
    let tracker = ConnTracker::new(state.config().rpc_limits());
    let mut backoff = AcceptBackoff::default();
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(c) => {
                backoff.on_success();
                c
            }
            Err(e) => {
                if let Some(pause) = backoff.on_error(&e) {
                    tracing::warn!(error = %e, pause_ms = pause.as_millis() as u64, "rpc accept failed; backing off");
                    tokio::time::sleep(pause).await;
                }
                continue;
            }
        };
        let permit = match tracker.try_acquire(peer.ip()) {
            Ok(p) => p,
            Err(why) => {
                tracing::warn!(%peer, reason = %why, "refusing rpc connection");
                drop(sock);
                continue;
            }
        };
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
        let idle = tracker.limits().idle_timeout;
        let spawned = std::thread::Builder::new()
            .name("mc-master-rpc".into())
            .spawn(move || {
                if let Err(e) = handle_conn(sock, st, idle, permit) {
                    match e.kind() {
                        io::ErrorKind::UnexpectedEof => {}
                        io::ErrorKind::PermissionDenied => {
                            tracing::warn!(%peer, error = %e, "rpc peer refused")
                        }
                        _ => tracing::warn!(%peer, error = %e, "rpc connection closed"),
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(%peer, error = %e, "cannot spawn rpc thread");
        }
    }
}

fn handle_conn(
    mut sock: TcpStream,
    gate: Arc<Gate>,
    idle: Option<Duration>,
    _permit: ConnPermit,
) -> io::Result<()> {
    let _ = sock.set_nodelay(gate.config().rpc_enable_tcp_no_delay);
    let hs = idle.map_or(HANDSHAKE_TIMEOUT, |d| d.min(HANDSHAKE_TIMEOUT));
    sock.set_read_timeout(Some(hs))?;
    sock.set_write_timeout(Some(hs))?;
    server_handshake(&mut sock, Service::Master, gate.config().auth.as_ref())?;
    sock.set_read_timeout(None)?;
    sock.set_write_timeout(None)?;
    let reader = ConnReader::new(
        sock.try_clone()?,
        idle,
        memory::IDLE_COLLECT_TICK,
        memory::collect_if_freed,
    );
    let mut rd = BufReader::with_capacity(64 << 10, reader);
    let mut conn_epoch: Option<u64> = None;
    let mut scope = Scope::Shared;
    loop {
        let body = match framing::read_frame(&mut rd, MAX_REQUEST_FRAME) {
            Ok(b) => b,
            // The idle timeout ran out.
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
        let frame: RequestFrame = framing::decode(&body)?;
        drop(body);
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
        term.state.reads_done(&frame.done);
        if let MasterRequest::LedgerStream {
            client_id,
            segment_name,
        } = frame.req
        {
            return serve_ledger(sock, rd, &term.state, &client_id, &segment_name);
        }
        if let MasterRequest::Tenant { tenant_id } = &frame.req {
            let resp = match term.state.tenant_scope(tenant_id) {
                Ok(s) => {
                    scope = s;
                    MasterResponse::Count(i64::from(scope != Scope::Shared))
                }
                Err(e) => MasterResponse::Err(e),
            };
            sock.write_all(&framing::encode_frame(&resp)?)?;
            continue;
        }
        let mutation = frame.req.changes_metadata();
        if mutation {
            gate.status().note_write();
        }
        let mut resp = dispatch_in(&term.state, frame.req, &scope);
        // A leader that lost its lease while serving a mutation (PutEnd
        // waits for the segment owners) must not acknowledge it.
        if mutation && gate.serving().is_none_or(|t| t.epoch != term.epoch) {
            resp = MasterResponse::Err(ErrorCode::UnavailableInCurrentStatus);
        }
        sock.write_all(&framing::encode_frame(&resp)?)?;
        memory::collect_if_freed();
    }
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
fn serve_ledger(
    mut sock: TcpStream,
    mut rd: BufReader<ConnReader>,
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
    rd.get_mut().set_timeout(Some(LEDGER_ACK_READ_TIMEOUT));
    let mut duplex = Duplex {
        rd: &mut rd,
        wr: &mut sock,
    };
    let st = Arc::clone(state);
    let (seg, id) = (segment.to_string(), uuid);
    let max_promotes = state.config().promotion_max_per_heartbeat.max(1) as usize;
    queue.serve(&mut duplex, max_promotes, &move |ranges, settle| {
        st.release_forgotten(&seg, &id, ranges, settle)
    })
}

/// Execute one request against the state.
pub fn dispatch(state: &MasterState, req: MasterRequest) -> MasterResponse {
    dispatch_in(state, req, &Scope::Shared)
}

/// Object keys (and group names) of `req` mapped into `scope`'s namespace.
fn scoped(req: MasterRequest, scope: &Scope) -> MasterRequest {
    use MasterRequest as R;
    match req {
        R::PutStart {
            keys,
            sizes,
            mut config,
            upsert,
            exclude,
        } => {
            config.groups = std::mem::take(&mut config.groups)
                .into_iter()
                .map(|(k, g)| (scope.stored(k), scope.stored(g)))
                .collect();
            R::PutStart {
                keys: scope.stored_all(keys),
                sizes,
                config,
                upsert,
                exclude,
            }
        }
        R::PutEnd { keys, versions } => R::PutEnd {
            keys: scope.stored_all(keys),
            versions,
        },
        R::CommitEnd {
            keys,
            versions,
            local_segments,
        } => R::CommitEnd {
            keys: scope.stored_all(keys),
            versions,
            local_segments,
        },
        R::PutRevoke { keys, versions } => R::PutRevoke {
            keys: scope.stored_all(keys),
            versions,
        },
        R::GetReplicaList { keys, track } => R::GetReplicaList {
            keys: scope.stored_all(keys),
            track,
        },
        R::Exist { keys } => R::Exist {
            keys: scope.stored_all(keys),
        },
        R::Remove { keys, force } => R::Remove {
            keys: scope.stored_all(keys),
            force,
        },
        R::BatchReplicaClear {
            client_id,
            keys,
            segment_name,
        } => R::BatchReplicaClear {
            client_id,
            keys: scope.stored_all(keys),
            segment_name,
        },
        R::CreateCopyTask { key, targets } => R::CreateCopyTask {
            key: scope.stored(key),
            targets,
        },
        R::CreateMoveTask {
            key,
            source,
            target,
        } => R::CreateMoveTask {
            key: scope.stored(key),
            source,
            target,
        },
        other => other,
    }
}

/// The answer to a request whose result is success or an error.
fn ok_or_err(r: Result<(), ErrorCode>) -> MasterResponse {
    reply(r, |()| MasterResponse::Ok)
}

/// The answer to a request: `ok` of its result, or its error.
fn reply<T>(r: Result<T, ErrorCode>, ok: impl FnOnce(T) -> MasterResponse) -> MasterResponse {
    r.map_or_else(MasterResponse::Err, ok)
}

/// Serve one request for a connection acting in `scope`.
pub(crate) fn dispatch_in(
    state: &MasterState,
    req: MasterRequest,
    scope: &Scope,
) -> MasterResponse {
    let req = match scope {
        Scope::Shared => req,
        _ => scoped(req, scope),
    };
    // A term that took over answers for a key only once it knows whether
    // the key exists (see `takeover`).
    match &req {
        MasterRequest::PutStart { keys, .. }
        | MasterRequest::GetReplicaList { keys, .. }
        | MasterRequest::Exist { keys }
        | MasterRequest::Remove { keys, .. } => state.await_known(Some(keys)),
        MasterRequest::CreateCopyTask { key, .. } | MasterRequest::CreateMoveTask { key, .. } => {
            state.await_known(Some(std::slice::from_ref(key)))
        }
        MasterRequest::RemoveByRegex { .. } | MasterRequest::RemoveAll { .. } => {
            state.await_known(None)
        }
        _ => {}
    }
    match req {
        MasterRequest::Ping { client_id } => MasterResponse::Pong {
            need_remount: state.ping(&client_id),
        },
        MasterRequest::MountSegment { client_id, segment } => {
            ok_or_err(state.mount_segment(&client_id, segment))
        }
        MasterRequest::UnmountSegment {
            client_id,
            segment_name,
        } => ok_or_err(state.unmount_segment(&client_id, &segment_name)),
        MasterRequest::Disconnect { client_id } => {
            state.disconnect(&client_id);
            MasterResponse::Ok
        }
        MasterRequest::PutStart {
            keys,
            sizes,
            config,
            upsert,
            exclude,
        } => MasterResponse::PutStart(
            state.put_start_excluding(&keys, &sizes, &config, upsert, &exclude),
        ),
        MasterRequest::PutEnd { keys, versions } => ok_or_err(state.put_end(&keys, &versions)),
        MasterRequest::CommitEnd {
            keys,
            versions,
            local_segments,
        } => reply(state.commit_end(&keys, &versions, &local_segments), |ops| {
            MasterResponse::Committed { ops }
        }),
        MasterRequest::PutRevoke { keys, versions } => {
            state.put_revoke(&keys, &versions);
            MasterResponse::Ok
        }
        MasterRequest::GetReplicaList { keys, track } => {
            MasterResponse::Objects(state.get_replica_list_owned(keys, track))
        }
        MasterRequest::ReadsDone { tickets } => {
            state.reads_done(&tickets);
            MasterResponse::Ok
        }
        MasterRequest::Exist { keys } => MasterResponse::Codes(state.exist(&keys)),
        MasterRequest::Remove { keys, force } => MasterResponse::Codes(state.remove(&keys, force)),
        MasterRequest::RemoveByRegex { pattern, force } => {
            MasterResponse::Count(state.remove_by_regex(&pattern, force, scope))
        }
        MasterRequest::RemoveAll { force } => MasterResponse::Count(state.remove_all(force, scope)),
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
        MasterRequest::DiskTier {
            client_id,
            segment_name,
            objects,
            done,
        } => reply(
            state.disk_tier(&client_id, &segment_name, objects, done),
            MasterResponse::Codes,
        ),
        MasterRequest::DiskDropped {
            client_id,
            segment_name,
            objects,
        } => ok_or_err(state.disk_dropped(&client_id, &segment_name, &objects)),
        MasterRequest::DiskTierDrain {
            client_id,
            segment_name,
        } => ok_or_err(state.drain_disk_tier(&client_id, &segment_name)),
        MasterRequest::Promoted {
            client_id,
            segment_name,
            done,
        } => ok_or_err(state.promoted(&client_id, &segment_name, &done)),
        MasterRequest::BatchReplicaClear {
            client_id,
            keys,
            segment_name,
        } => MasterResponse::Keys(
            state
                .batch_replica_clear(&client_id, &keys, &segment_name)
                .iter()
                .filter_map(|k| scope.user_key(k).map(str::to_string))
                .collect(),
        ),
        MasterRequest::CreateCopyTask { key, targets } => reply(
            state.create_copy_task(&key, &targets),
            MasterResponse::TaskId,
        ),
        MasterRequest::CreateMoveTask {
            key,
            source,
            target,
        } => reply(
            state.create_move_task(&key, &source, &target),
            MasterResponse::TaskId,
        ),
        MasterRequest::QueryTask { id } => reply(state.query_task(id), MasterResponse::Task),
        MasterRequest::Fetched {
            client_id,
            segment_name,
            done,
        } => ok_or_err(state.fetched(&client_id, &segment_name, &done)),
        MasterRequest::StorageConfig => MasterResponse::StorageConfig {
            fsdir: state.config().fsdir(),
            offload: state.config().offloads(),
            disk_eviction: state.config().enable_disk_eviction,
            quota_bytes: state.config().quota_bytes,
        },
        // Only meaningful as a connection's request (handled there).
        MasterRequest::LedgerStream { .. } | MasterRequest::Tenant { .. } => {
            MasterResponse::Err(ErrorCode::InvalidParams)
        }
    }
}
