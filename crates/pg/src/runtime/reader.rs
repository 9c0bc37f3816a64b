//! The reader thread of one peer link: drains the socket until EOF or error,
//! answers PINGs, queues collective pieces, feeds P2P frames to the matcher
//! and records control frames. When the stream ends the peer is declared
//! failed (a connection error is noticed at once).
//!
//! It also answers pulls (reader threads answer
//! the pull requests for retained inputs) and lands the answers to ours,
//! and records the peer's completed-seq watermarks (PONGs, and the seq of
//! every collective piece) so retained inputs are released. A held range is
//! written back by a short-lived helper thread ([`answer_pulls`]), so a
//! reader never blocks on its own socket while the peer's reader might be
//! blocked writing to us.

use crate::collectives::p2p::{Ack, RxMessage};
use crate::collectives::retain::{Request, Retention, Verdict};
use crate::fault;
use crate::runtime::shared::{Links, Shared};
use crate::transport::link::PeerLink;
use crate::transport::shm::PIECE;
use crate::transport::wire::{
    Hdr, KIND_ABORT, KIND_BYE, KIND_COLL, KIND_MAPPED, KIND_P2P, KIND_P2P_ACK, KIND_PING,
    KIND_PONG, KIND_PULL_REQ, KIND_PULL_RESP, PULL_NOT_HELD,
};
use std::io::{BufReader, Read};
use std::net::TcpStream;
use std::sync::Arc;

/// The reader's buffer. Small frames (acknowledgements, pings, headers)
/// are batched through it; a payload is read past it, straight into its
/// destination, except for what a header read already buffered (copied
/// twice). With a buffer as large as a piece (as once used), about half of
/// every 128 KiB piece was copied twice: a third of the reader's copying.
const READ_BUF: usize = 4096;

/// Largest payload of one pull answer frame.
pub(crate) const PULL_FRAME: usize = 1 << 20;

/// Answers peers' pull requests: with the held ranges (`serve`, written by
/// one helper thread per request) or with a refusal ("not held").
pub(crate) fn answer_pulls(
    retain: &Arc<Retention>,
    links: &Links,
    reqs: Vec<Request>,
    serve: bool,
) {
    for req in reqs {
        let Some(link) = links.get(req.src).cloned().flatten() else {
            continue;
        };
        if !serve {
            refuse(&link, &req);
            continue;
        }
        let (r, l) = (retain.clone(), link.clone());
        let spawned = std::thread::Builder::new()
            .name("mcpg-pull".into())
            .spawn(move || send_range(&r, &l, &req));
        if spawned.is_err() {
            refuse(&link, &req);
        }
    }
}

fn refuse(link: &PeerLink, req: &Request) {
    let hdr = Hdr {
        kind: KIND_PULL_RESP,
        phase: req.id,
        seq: req.seq,
        total: req.len,
        aux: PULL_NOT_HELD,
        ..Default::default()
    };
    let _ = link.write_frame(&hdr, &[]);
}

/// Writes the requested range in frames of at most [`PULL_FRAME`] bytes
/// (offsets relative to the request), or a refusal once it is not held.
fn send_range(retain: &Retention, link: &PeerLink, req: &Request) {
    let mut off = 0u64;
    while off < req.len {
        let n = (req.len - off).min(PULL_FRAME as u64);
        let Some(chunk) = retain.with_range(req.seq, req.offset + off, n, |d| d.to_vec()) else {
            refuse(link, req);
            return;
        };
        let hdr = Hdr {
            kind: KIND_PULL_RESP,
            phase: req.id,
            seq: req.seq,
            total: req.len,
            offset: off,
            len: n as u32,
            ..Default::default()
        };
        if link.write_frame(&hdr, &chunk).is_err() {
            return;
        }
        off += n;
    }
}

/// Reader thread body.
pub(crate) fn reader_loop(shared: Arc<Shared>, link: Arc<PeerLink>, stream: TcpStream) {
    let mut r = BufReader::with_capacity(READ_BUF, stream);
    let mut rx_msg: Option<RxMessage> = None;
    // Consumed P2P messages are acknowledged on this connection.
    let ack: Arc<dyn Ack> = link.clone();
    while let Ok(hdr) = Hdr::read_from(&mut r) {
        fault::park_if_frozen();
        link.touch_rx();
        let ok = match hdr.kind {
            KIND_PING => {
                link.try_write_ctrl(KIND_PONG, shared.retain.watermark());
                true
            }
            KIND_PONG => {
                shared.retain.ack(link.slot, hdr.seq);
                true
            }
            KIND_PULL_REQ => {
                let req = Request {
                    src: link.slot,
                    id: hdr.phase,
                    seq: hdr.seq,
                    offset: hdr.offset,
                    len: hdr.total,
                };
                match shared.retain.admit(req) {
                    Verdict::Serve => {
                        answer_pulls(&shared.retain, &shared.links(), vec![req], true)
                    }
                    Verdict::Refuse => refuse(&link, &req),
                    Verdict::Queued => {}
                }
                true
            }
            KIND_PULL_RESP if hdr.aux == PULL_NOT_HELD => {
                shared.retain.fail_pulls(link.slot, Some(hdr.phase));
                shared.bell().ring();
                true
            }
            KIND_PULL_RESP if hdr.len as usize <= PULL_FRAME => {
                let mut buf = vec![0u8; hdr.len as usize];
                let ok = r.read_exact(&mut buf).is_ok();
                if ok {
                    // An unknown id is a pull its op already gave up on.
                    let _ = shared.retain.land(hdr.phase, link.slot, hdr.offset, &buf);
                    shared.bell().ring();
                }
                ok
            }
            KIND_COLL if hdr.len as usize <= PIECE => {
                // A piece of op `seq`: the peer completed every earlier op.
                shared.retain.ack(link.slot, hdr.seq);
                // A piece landed in a lent output only completes a receive
                // (nothing else waits for it), so the executor is woken for
                // the message's last piece; a piece queued in a buffer may
                // feed a reduction at once, so it wakes the executor.
                let (ok, wake) = if let Some(to) = link.claim_landing(&hdr) {
                    // The output may be the op's retained input (in place):
                    // its copy of these bytes is made before they are written.
                    shared.retain.fill(hdr.seq, to as usize, hdr.len as usize);
                    // SAFETY: `claim_landing` checked that `len` bytes at
                    // `to` lie inside the range the executor lent, which
                    // stays valid and untouched by anyone else until
                    // `withdraw_landing`, and that waits for `landing_done`.
                    let out = unsafe { std::slice::from_raw_parts_mut(to, hdr.len as usize) };
                    let ok = r.read_exact(out).is_ok();
                    link.landing_done();
                    let last = hdr.offset + u64::from(hdr.len) >= hdr.total;
                    if ok {
                        link.push_landed(hdr);
                    }
                    (ok, last)
                } else {
                    let mut buf = link.take_buf(hdr.len as usize);
                    let ok = r.read_exact(&mut buf).is_ok();
                    if ok {
                        link.push_coll(hdr, buf);
                    }
                    (ok, true)
                };
                if ok && wake {
                    shared.bell().ring();
                }
                ok
            }
            KIND_P2P => shared
                .p2p
                .on_frame(link.slot, &ack, &hdr, &mut r, &mut rx_msg),
            KIND_P2P_ACK => {
                link.acked(hdr.seq);
                true
            }
            KIND_MAPPED => {
                link.set_mapped(hdr.aux == 1);
                if let Some(own) = &shared.seg {
                    link.try_attach_shm(own);
                }
                shared.notify_ctrl();
                true
            }
            KIND_ABORT => {
                link.set_aborted(hdr.seq);
                shared.bell().ring();
                true
            }
            KIND_BYE => {
                link.set_bye();
                true
            }
            _ => false,
        };
        if !ok {
            break;
        }
    }
    if crate::config::log_info() && !shared.is_shutdown() {
        eprintln!(
            "mooncake-pg: group {} rank {}: link to rank {} closed{}",
            shared.label,
            shared.rank,
            link.slot,
            if link.said_bye() { " (goodbye)" } else { "" }
        );
    }
    link.mark_dead();
    shared.retain.forget(1u64 << link.slot);
    shared.retain.fail_pulls(link.slot, None);
    let pending = shared.p2p.take_pending(link.slot, &mut rx_msg);
    shared.fail_recvs(link.slot, pending);
    shared.fail_sends(link.slot, link.take_sends());
    shared.bell().ring();
    shared.notify_ctrl();
}
