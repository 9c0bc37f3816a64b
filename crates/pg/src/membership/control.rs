//! Messages of the membership control plane (agent <-> coordinator) and
//! their framing: a little-endian `u32` length, then the message as JSON.
//! Membership changes are rare and small, so a self-describing encoding is
//! worth more than its bytes. Connection set-up (who may talk) lives in
//! `handshake`.

use mooncake_common::framing;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};

/// Largest control message accepted (a longer length prefix is a protocol
/// error that closes the session).
const MAX_MESSAGE: usize = 1 << 20;

/// What a member published about itself (the coordinator distributes it
/// to the group).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MemberRec {
    /// In-group rank.
    pub(crate) slot: usize,
    /// Random id of this member (one backend instance).
    pub(crate) member_id: u64,
    /// `host:port` of the member's engine.
    pub(crate) endpoint: String,
    /// Host identity (hostname and boot id): equal means shm can work.
    pub(crate) host: String,
    /// The member's shm segment name ("" when none).
    pub(crate) shm: String,
    /// Registration order within the group: the later member of a pair dials.
    pub(crate) order: u64,
}

/// Outcome of a proposal, with upstream's `ProposalStatus` codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProposalStatus {
    /// Not applied; see the reason.
    Rejected = 0,
    /// Applied as requested (or already in effect).
    Applied = 1,
    /// Applied, without some requested or member ranks (listed).
    AppliedWithDroppedRanks = 2,
}

/// Outcome of `sync_after_failure`, with upstream's codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SyncStatus {
    /// Evidence was reconciled and the resulting view applied.
    Reconciled = 0,
    /// Nothing was pending; the current view is applied.
    NoPending = 1,
    /// The caller cannot sync (not a member, fenced, no coordinator).
    Rejected = 2,
}

/// Agent -> coordinator.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum ToCoord {
    /// Registers a member of a group; answered by `Registered` or `Failed`.
    Register {
        /// Request id.
        req: u64,
        /// Group key hash.
        group: u64,
        /// Torch group id, for messages.
        label: String,
        /// The member.
        rec: MemberRec,
        /// Reserved capacity the member declares.
        capacity: usize,
        /// Declared group size (founding size for founding members).
        size: usize,
        /// A joining/replacement member.
        extension: bool,
        /// The group's failure mode: the coordinator deactivates failed ranks.
        auto_deactivate: bool,
    },
    /// The member leaves (orderly shutdown); no answer.
    Leave {
        /// Group key hash.
        group: u64,
        /// Its slot.
        slot: usize,
        /// Its member id.
        member_id: u64,
    },
    /// The member is ready for activation (`join_group`); answered by `Done`.
    Join {
        /// Request id.
        req: u64,
        /// Group key hash.
        group: u64,
        /// Its slot.
        slot: usize,
        /// Its member id.
        member_id: u64,
    },
    /// `join_group` gave up; the member is no longer awaiting activation.
    Unjoin {
        /// Group key hash.
        group: u64,
        /// Its slot.
        slot: usize,
        /// Its member id.
        member_id: u64,
    },
    /// Proposes a membership change; answered by `Proposed`.
    Propose {
        /// Request id.
        req: u64,
        /// Group key hash.
        group: u64,
        /// The proposer's slot.
        slot: usize,
        /// Activate (else deactivate) `ranks`.
        activate: bool,
        /// Target in-group ranks.
        ranks: Vec<usize>,
        /// How long an activation may wait for its targets, in ms.
        admission_ms: u64,
    },
    /// Failure evidence (links found dead), and with `req != 0` a wait for
    /// the reconciled view (answered by `Synced`).
    Sync {
        /// Request id (0: report only, no answer).
        req: u64,
        /// Group key hash.
        group: u64,
        /// The reporter's slot.
        slot: usize,
        /// The reporter's member id.
        member_id: u64,
        /// Slots whose links the reporter found dead.
        dead: u64,
    },
    /// Answer to `Query`: the member's current dead links.
    Links {
        /// Group key hash.
        group: u64,
        /// The reporter's slot.
        slot: usize,
        /// Slots whose links are dead.
        dead: u64,
    },
    /// Answer to `Prepare`.
    PrepareAck {
        /// Group key hash.
        group: u64,
        /// Transaction.
        txn: u64,
        /// The member's slot.
        slot: usize,
        /// Collectives it has issued (the first seq the new view may govern).
        next_seq: u64,
        /// Links to every member of the new view are up.
        ready: bool,
    },
    /// Answer to `Commit`.
    CommitAck {
        /// Group key hash.
        group: u64,
        /// Transaction.
        txn: u64,
        /// The member's slot.
        slot: usize,
    },
    /// `extend_group_size_to`: the group's capacity is at least this.
    Extend {
        /// Group key hash.
        group: u64,
        /// New capacity.
        capacity: usize,
    },
}

/// Phase two of a view change, as a member applies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ViewCommit {
    /// Transaction.
    pub(crate) txn: u64,
    /// New epoch.
    pub(crate) epoch: u64,
    /// New active mask.
    pub(crate) active: u64,
    /// First collective the view governs.
    pub(crate) from_seq: u64,
    /// The group's capacity.
    pub(crate) capacity: usize,
    /// Members dropped for failure: fence their links.
    pub(crate) fence: u64,
}

/// Coordinator -> agent.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum ToAgent {
    /// Answer to `Register`.
    Registered {
        /// Request id.
        req: u64,
        /// The group's capacity.
        capacity: usize,
        /// Current epoch.
        epoch: u64,
        /// Current active mask.
        active: u64,
        /// Every live registered member (the registrant included).
        members: Vec<MemberRec>,
        /// The group was destroyed by its members: stay local-only.
        closed: bool,
    },
    /// A request failed.
    Failed {
        /// Request id.
        req: u64,
        /// Why.
        reason: String,
    },
    /// A request succeeded with nothing to report.
    Done {
        /// Request id.
        req: u64,
    },
    /// Answer to `Propose`.
    Proposed {
        /// Request id.
        req: u64,
        /// Outcome.
        status: ProposalStatus,
        /// The group's epoch afterwards.
        epoch: u64,
        /// Ranks left out.
        dropped: Vec<usize>,
        /// Why it was rejected ("" otherwise).
        reason: String,
    },
    /// Answer to `Sync`.
    Synced {
        /// Request id.
        req: u64,
        /// Outcome.
        status: SyncStatus,
        /// The group's epoch afterwards.
        epoch: u64,
        /// Why it was rejected ("" otherwise).
        reason: String,
    },
    /// A member registered (admit its connection; later members dial).
    Member {
        /// Group key hash.
        group: u64,
        /// The member.
        rec: MemberRec,
    },
    /// A member left or its process ended.
    MemberGone {
        /// Group key hash.
        group: u64,
        /// Its slot.
        slot: usize,
        /// Its member id.
        member_id: u64,
    },
    /// Phase one of a view change: report `next_seq` and readiness, and
    /// start no collective with a seq at or past it until `Commit`/`Abort`.
    Prepare {
        /// Group key hash.
        group: u64,
        /// Transaction.
        txn: u64,
        /// Active mask of the new view.
        active: u64,
        /// Records of every member of the new view.
        members: Vec<MemberRec>,
    },
    /// Phase two: the new view governs collectives with seq >= `from_seq`.
    Commit {
        /// Group key hash.
        group: u64,
        /// The committed view (its fields sit beside `group` on the wire).
        #[serde(flatten)]
        view: ViewCommit,
    },
    /// The transaction was abandoned: lift the gate.
    Abort {
        /// Group key hash.
        group: u64,
        /// Transaction.
        txn: u64,
    },
    /// Asks for the member's current dead links (answered by `Links`).
    Query {
        /// Group key hash.
        group: u64,
    },
    /// The member was dropped from the group for failure.
    Fenced {
        /// Group key hash.
        group: u64,
        /// The epoch that dropped it.
        epoch: u64,
    },
}

/// Writes one framed message (the shared length-prefixed framing, JSON body).
pub(crate) fn write_msg<T: Serialize>(w: &mut impl Write, msg: &T) -> std::io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    framing::write_frame(w, &body)
}

/// Reads one framed message of at most [`MAX_MESSAGE`] bytes (an error ends
/// the session).
pub(crate) fn read_msg<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> std::io::Result<T> {
    let body = framing::read_frame(r, MAX_MESSAGE)?;
    serde_json::from_slice(&body)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_rejected() {
        let m = ToAgent::Commit {
            group: 7,
            view: ViewCommit {
                txn: 3,
                epoch: 2,
                active: 0b1011,
                from_seq: 41,
                capacity: 4,
                fence: 0b0100,
            },
        };
        let mut buf = Vec::new();
        write_msg(&mut buf, &m).expect("write");
        // The view's fields sit beside `group`, as one flat object.
        assert_eq!(
            &buf[4..],
            br#"{"Commit":{"group":7,"txn":3,"epoch":2,"active":11,"from_seq":41,"capacity":4,"fence":4}}"#
        );
        let back: ToAgent = read_msg(&mut buf.as_slice()).expect("read");
        assert!(matches!(
            back,
            ToAgent::Commit {
                view: ViewCommit {
                    from_seq: 41,
                    fence: 4,
                    ..
                },
                ..
            }
        ));
        let mut bad = 5u32.to_le_bytes().to_vec();
        bad.extend_from_slice(b"hello");
        assert!(read_msg::<ToAgent>(&mut bad.as_slice()).is_err());
        let huge = (u32::MAX).to_le_bytes();
        assert!(read_msg::<ToAgent>(&mut huge.as_slice()).is_err());
        assert!(read_msg::<ToAgent>(&mut [1u8, 0].as_slice()).is_err());
    }
}
