//! The client's end of its ledger stream: one connection to the (current)
//! master on which the master pushes ledger ops for this client's segment
//! and the client applies them to its [`Ledger`] and acknowledges. The
//! master acknowledges writes and removals only after these acks, so what
//! the ledger holds is what this client reports when it remounts on a master
//! that lost its metadata.
//!
//! The thread reconnects whenever the stream breaks (master restart, leader
//! change, network fault), every [`RETRY`] until the segment is mounted on
//! the master again.

use crate::durability::ledger::Ledger;
use crate::master::master_conn::MasterConn;
use mooncake_common::framing::{self, MAX_CONTROL_FRAME};
use mooncake_common::ledger::{LedgerAck, LedgerPush};
use mooncake_common::proto::{encode_request, MasterRequest, MasterResponse};
use std::io::{self, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Pause between reconnection attempts.
const RETRY: Duration = Duration::from_millis(100);
/// The master pushes at least every second; silence this long means the
/// stream is dead.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What the stream thread needs.
pub(crate) struct StreamCtx {
    /// The master pool (for connecting to the current master).
    pub master: Arc<MasterConn>,
    /// The ledger to apply pushes to.
    pub ledger: Arc<Ledger>,
    /// This client's id.
    pub client_id: String,
    /// This client's segment.
    pub segment: String,
    /// Set by `close`.
    pub closed: Arc<AtomicBool>,
    /// Woken when the stream breaks: the heartbeat checks on the master at
    /// once (a restarted master sees the remount sooner).
    pub wake: Arc<crate::wake::Wake>,
    /// The disk tier: offloaded replicas are copied there before the ack.
    pub disk: Option<Arc<crate::durability::disk::Disk>>,
    /// The copying thread (copies for copy and move tasks).
    pub fetch: Option<crate::durability::fetch::Fetcher>,
}

/// Start the stream thread; it ends when `ctx.closed` is set.
pub(crate) fn start(ctx: StreamCtx) -> io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("mc-ledger".into())
        .spawn(move || run(ctx))
}

fn run(ctx: StreamCtx) {
    // Failed attempts since the last established stream.
    let mut failures = 0u32;
    while !ctx.closed.load(Ordering::Acquire) {
        let r = serve_once(&ctx, &mut failures);
        if ctx.closed.load(Ordering::Acquire) {
            return;
        }
        if failures == 0 {
            // An established stream broke: have the heartbeat look now.
            ctx.wake.notify();
        }
        failures = failures.saturating_add(1);
        if failures == 30 {
            if let Err(e) = r {
                tracing::warn!(error = %e, "ledger stream to the master keeps failing; retrying");
            }
        }
        std::thread::sleep(RETRY);
    }
}

/// Open a stream, then apply and acknowledge pushes until it breaks
/// (`failures` is reset once the master accepted the stream).
fn serve_once(ctx: &StreamCtx, failures: &mut u32) -> io::Result<()> {
    let mut sock = ctx.master.connect()?;
    sock.set_read_timeout(Some(READ_TIMEOUT))?;
    // A leader change shuts the stream down: reconnect to the new leader.
    let _tracked = ctx.master.track(&sock);
    let req = MasterRequest::LedgerStream {
        client_id: ctx.client_id.clone(),
        segment_name: ctx.segment.clone(),
    };
    sock.write_all(&encode_request(&req, &[])?)?;
    let mut rd = BufReader::new(sock.try_clone()?);
    match framing::decode::<MasterResponse>(&framing::read_frame(&mut rd, MAX_CONTROL_FRAME)?)? {
        MasterResponse::Ok => *failures = 0,
        other => {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!("master refused the ledger stream: {other:?}"),
            ))
        }
    }
    pump(&mut rd, &mut sock, ctx)
}

fn pump(rd: &mut BufReader<TcpStream>, sock: &mut TcpStream, ctx: &StreamCtx) -> io::Result<()> {
    loop {
        if ctx.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        let push: LedgerPush = framing::decode(&framing::read_frame(rd, MAX_CONTROL_FRAME)?)?;
        let seq = push.seq;
        let mut failed = Vec::new();
        let mut failed_fetches = Vec::new();
        if !push.ops.is_empty() {
            if let Some(d) = &ctx.disk {
                let promoted;
                (failed, promoted) = d.apply(&push.ops);
                if !promoted.is_empty() {
                    // Before the ack: the master installs the replicas.
                    d.report_promoted(promoted);
                }
            }
            for job in push
                .ops
                .iter()
                .filter_map(crate::durability::fetch::Job::of)
            {
                match &ctx.fetch {
                    Some(f) => f.push(job),
                    None => failed_fetches.push((job.key, job.version, job.offset, false)),
                }
            }
            ctx.ledger.apply(push.ops);
        }
        sock.write_all(&framing::encode_frame(&LedgerAck { seq })?)?;
        if let (Some(d), false) = (&ctx.disk, failed.is_empty()) {
            // Those objects are dropped, as an eviction without offload would.
            d.report_dropped(failed);
        }
        if !failed_fetches.is_empty() {
            let r = ctx.master.call(&MasterRequest::Fetched {
                client_id: ctx.client_id.clone(),
                segment_name: ctx.segment.clone(),
                done: failed_fetches,
            });
            if !matches!(r, Ok(MasterResponse::Ok)) {
                tracing::warn!(result = ?r, "cannot tell the master about copies this client cannot make");
            }
        }
    }
}
