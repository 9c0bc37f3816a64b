//! The queue of puts waiting for room.
//!
//! A put that finds no room takes a ticket and waits; room freed while any
//! put waits goes to the first in line: no other put (and no promotion from
//! disk) takes room meanwhile, so a large put is not starved by a stream of
//! small ones. Tickets are handed out in arrival order and leave the queue
//! when their put stops waiting (it got room, gave up, or failed).

use std::collections::VecDeque;

/// Puts waiting for room, by ticket, in arrival order.
#[derive(Debug, Default)]
pub(crate) struct SpaceQueue {
    waiting: VecDeque<u64>,
    /// The last ticket handed out (0: none yet).
    last: u64,
}

impl SpaceQueue {
    /// A put starts waiting: its ticket, last in line.
    pub(crate) fn join(&mut self) -> u64 {
        self.last = self.last.wrapping_add(1);
        self.waiting.push_back(self.last);
        self.last
    }

    /// The put of `ticket` stopped waiting (a ticket not in line is ignored).
    pub(crate) fn leave(&mut self, ticket: u64) {
        self.waiting.retain(|&t| t != ticket);
    }

    /// Whether `ticket` is first in line.
    pub(crate) fn is_first(&self, ticket: u64) -> bool {
        self.waiting.front() == Some(&ticket)
    }

    /// Whether a put holding `ticket` (`None`: a put that is not waiting)
    /// must leave freed room to a put ahead of it.
    pub(crate) fn behind(&self, ticket: Option<u64>) -> bool {
        self.waiting.front().is_some_and(|&h| Some(h) != ticket)
    }

    /// Whether any put waits for room.
    pub(crate) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::SpaceQueue;

    #[test]
    fn room_goes_to_the_puts_in_arrival_order() {
        let mut q = SpaceQueue::default();
        assert!(q.is_empty());
        assert!(!q.behind(None), "with nobody waiting, any put takes room");
        let (a, b, c) = (q.join(), q.join(), q.join());
        assert!(a != b && b != c && a != c, "tickets are distinct");
        assert!(!q.is_empty());
        assert!(q.is_first(a) && !q.is_first(b));
        assert!(!q.behind(Some(a)), "the first in line takes room");
        assert!(q.behind(Some(b)) && q.behind(None), "everyone else waits");
        // The second leaves early: the order of the others holds.
        q.leave(b);
        q.leave(a);
        assert!(q.is_first(c) && !q.behind(Some(c)));
        q.leave(c);
        q.leave(c);
        q.leave(12345);
        assert!(q.is_empty() && !q.behind(None));
        // A late joiner gets a ticket no earlier put held.
        let d = q.join();
        assert!(d != a && d != b && d != c && q.is_first(d));
    }
}
