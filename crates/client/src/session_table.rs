//! The session tables of one client (see `sessions` for the API they
//! serve): the open put sessions (key → the replicas PutStart reserved and
//! the object's size) and the open get sessions (key → the cached lookup,
//! its lease deadline and the read ticket it holds). A read ticket is shared
//! by the keys of one `batch_get_session_start`; it is reported finished
//! once the last of them ends. Kept apart from the methods so that `Client`
//! can own the tables without a module cycle.

use mooncake_common::proto::{ObjectInfo, ReplicaLoc};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// A put session: the replicas PutStart reserved for the object.
pub(crate) struct PutSession {
    pub(crate) size: u64,
    pub(crate) locs: Vec<ReplicaLoc>,
    /// The version the master granted the write (it names the write).
    pub(crate) version: u64,
}

/// A get session: the object's cached lookup and when its lease runs out.
pub(crate) struct GetSession {
    pub(crate) info: ObjectInfo,
    pub(crate) deadline: Instant,
    /// Read ticket shared by the keys of one `batch_get_session_start`.
    pub(crate) ticket: u64,
}

/// Open get sessions, and how many keys still hold each read ticket.
#[derive(Default)]
pub(crate) struct GetTable {
    pub(crate) keys: HashMap<String, Arc<GetSession>>,
    pub(crate) tickets: HashMap<u64, usize>,
}

impl GetTable {
    /// Drop `key`'s session; the ticket it held when no key holds it any more.
    pub(crate) fn remove(&mut self, key: &str) -> Option<u64> {
        let s = self.keys.remove(key)?;
        self.release(s.ticket)
    }

    fn release(&mut self, ticket: u64) -> Option<u64> {
        let n = self.tickets.get_mut(&ticket)?;
        *n -= 1;
        if *n == 0 {
            self.tickets.remove(&ticket);
            (ticket != 0).then_some(ticket)
        } else {
            None
        }
    }

    /// Open `key`'s session, replacing any; the ticket the replaced one
    /// held when no key holds it any more.
    pub(crate) fn insert(&mut self, key: String, s: GetSession) -> Option<u64> {
        *self.tickets.entry(s.ticket).or_insert(0) += 1;
        let old = self.keys.insert(key, Arc::new(s))?;
        self.release(old.ticket)
    }
}

/// The open sessions of one client.
#[derive(Default)]
pub(crate) struct Sessions {
    pub(crate) puts: Mutex<HashMap<String, Arc<PutSession>>>,
    pub(crate) gets: Mutex<GetTable>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_is_released_when_its_last_key_ends() {
        let info = ObjectInfo {
            size: 1,
            replicas: Vec::new(),
            disk: None,
            lease_ttl_ms: 0,
            read_ticket: 7,
        };
        let s = |t| GetSession {
            info: info.clone(),
            deadline: Instant::now(),
            ticket: t,
        };
        let mut t = GetTable::default();
        assert_eq!(t.insert("a".into(), s(7)), None);
        assert_eq!(t.insert("b".into(), s(7)), None);
        // A fresh session of "a" moves it to ticket 8.
        assert_eq!(t.insert("a".into(), s(8)), None);
        assert_eq!(t.remove("b"), Some(7));
        assert_eq!(t.remove("b"), None);
        assert_eq!(t.remove("a"), Some(8));
        assert!(t.tickets.is_empty());
        // Ticket 0 (nothing tracked) is never reported.
        assert_eq!(t.insert("c".into(), s(0)), None);
        assert_eq!(t.remove("c"), None);
    }
}
