//! The reader thread of one peer link: drains the socket until EOF or error,
//! answers PINGs, queues collective pieces, feeds P2P frames to the matcher
//! and records control frames. When the stream ends the peer is declared
//! failed (pg spec, failure model: a connection error is noticed at once).

use crate::fault;
use crate::link::PeerLink;
use crate::p2p::RxMessage;
use crate::shared::Shared;
use crate::shm::PIECE;
use crate::wire::{
    Hdr, KIND_ABORT, KIND_BYE, KIND_COLL, KIND_MAPPED, KIND_P2P, KIND_PING, KIND_PONG,
};
use std::io::{BufReader, Read};
use std::net::TcpStream;
use std::sync::Arc;

/// Reader thread body.
pub(crate) fn reader_loop(shared: Arc<Shared>, link: Arc<PeerLink>, stream: TcpStream) {
    let mut r = BufReader::with_capacity(64 * 1024, stream);
    let mut rx_msg: Option<RxMessage> = None;
    while let Ok(hdr) = Hdr::read_from(&mut r) {
        fault::park_if_frozen();
        link.touch_rx();
        let ok = match hdr.kind {
            KIND_PING => {
                link.try_write_ctrl(KIND_PONG);
                true
            }
            KIND_PONG => true,
            KIND_COLL if hdr.len as usize <= PIECE => {
                let mut buf = link.take_buf(hdr.len as usize);
                let ok = r.read_exact(&mut buf).is_ok();
                if ok {
                    link.push_coll(hdr, buf);
                    shared.bell().ring();
                }
                ok
            }
            KIND_P2P => shared.p2p.on_frame(link.slot, &hdr, &mut r, &mut rx_msg),
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
    let pending = shared.p2p.take_pending(link.slot, &mut rx_msg);
    shared.fail_recvs(link.slot, pending);
    shared.bell().ring();
    shared.notify_ctrl();
}
