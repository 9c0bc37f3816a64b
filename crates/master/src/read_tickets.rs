//! Open read tickets.
//!
//! A lookup that reads objects (`get_replica_list` with tracking) opens a
//! ticket: the objects it found count it as a read in flight (so an upsert
//! or removal retires their replicas instead of reusing them) until the
//! client reports the ticket done or its lease runs out.

use std::collections::HashMap;
use std::time::Instant;

/// An open read ticket: the keys its lookup marked as being read, where in
/// the object index each was found then (`usize::MAX`: not found), and
/// when the ticket expires.
#[derive(Debug)]
pub(crate) struct ReadTicket {
    pub keys: Vec<String>,
    pub at: Vec<usize>,
    pub expiry: Instant,
}

/// Open read tickets by id.
#[derive(Debug, Default)]
pub(crate) struct ReadTickets {
    open: HashMap<u64, ReadTicket>,
}

impl ReadTickets {
    /// Open ticket `id`.
    pub(crate) fn open(&mut self, id: u64, t: ReadTicket) {
        self.open.insert(id, t);
    }

    /// Close ticket `id` (its reads ended): the ticket, unless it expired
    /// or was closed already.
    pub(crate) fn close(&mut self, id: u64) -> Option<ReadTicket> {
        self.open.remove(&id)
    }

    /// Drop the tickets expired at `now` (their reads' leases ran out).
    pub(crate) fn expire(&mut self, now: Instant) {
        self.open.retain(|_, t| t.expiry > now);
    }

    /// Give unused capacity back after many removals.
    pub(crate) fn shrink_to_fit(&mut self) {
        self.open.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_ticket_closes_once_and_expires_with_its_lease() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let ticket = |expiry| ReadTicket {
            keys: vec!["k".into()],
            at: vec![0],
            expiry,
        };
        let mut t = ReadTickets::default();
        t.open(1, ticket(t0 + s));
        t.open(2, ticket(t0 + 3 * s));
        t.open(3, ticket(t0 + 3 * s));
        let one = t.close(1).expect("open");
        assert_eq!((one.keys.len(), one.at[0]), (1, 0));
        assert!(t.close(1).is_none(), "closed once");
        t.expire(t0 + 3 * s);
        assert!(
            t.close(2).is_none() && t.close(3).is_none(),
            "expired at their lease"
        );
        t.open(4, ticket(t0 + 3 * s));
        t.expire(t0 + 2 * s);
        assert!(t.close(4).is_some(), "not expired yet");
    }
}
