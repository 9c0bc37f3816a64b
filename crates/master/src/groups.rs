//! Object groups (`ReplicateConfig.group_ids`): a key written with a group
//! id joins that group for its life (an upsert naming another group is
//! refused). Reading any member leases every member, and eviction takes a
//! group whole: only when no member is leased, and then every member it
//! may evict. This module keeps the membership; an object records its
//! group's number (`Object::group`, 0 for none), so a member list may name
//! keys that have since gone or been written again without the group: they
//! are pruned whenever a list is walked, and a periodic sweep prunes a
//! chunk of groups at a time, dropping the empty ones.

use indexmap::IndexMap;
use std::collections::HashMap;

/// A group: its name and the keys that joined it.
#[derive(Debug, Default)]
struct Group {
    name: Box<str>,
    members: Vec<Box<str>>,
}

/// Every group with members, numbered from 1.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    numbers: HashMap<Box<str>, u32>,
    groups: IndexMap<u32, Group>,
    next: u32,
    /// Where the next sweep resumes in `groups`.
    cursor: usize,
}

impl Groups {
    /// The number of group `name`, if it has members.
    pub(crate) fn number(&self, name: &str) -> Option<u32> {
        self.numbers.get(name).copied()
    }

    /// `key` joins group `name`; its number.
    pub(crate) fn join(&mut self, name: &str, key: &str) -> u32 {
        let n = match self.numbers.get(name) {
            Some(n) => *n,
            None => {
                self.next = self.next.wrapping_add(1).max(1);
                while self.groups.contains_key(&self.next) {
                    self.next = self.next.wrapping_add(1).max(1);
                }
                let n = self.next;
                self.numbers.insert(name.into(), n);
                self.groups.insert(
                    n,
                    Group {
                        name: name.into(),
                        members: Vec::new(),
                    },
                );
                n
            }
        };
        if let Some(g) = self.groups.get_mut(&n) {
            if !g.members.iter().any(|m| **m == *key) {
                g.members.push(key.into());
            }
        }
        n
    }

    /// The members of group `n` for which `live` holds; the others leave it
    /// (and an empty group goes).
    pub(crate) fn live_members(&mut self, n: u32, live: impl Fn(&str) -> bool) -> Vec<Box<str>> {
        let Some(g) = self.groups.get_mut(&n) else {
            return Vec::new();
        };
        g.members.retain(|m| live(m));
        let out = g.members.clone();
        if out.is_empty() {
            self.drop_group(n);
        }
        out
    }

    /// Prune up to `chunk` groups from where the last sweep stopped.
    pub(crate) fn sweep(&mut self, chunk: usize, live: impl Fn(u32, &str) -> bool) {
        let mut seen = 0;
        while seen < chunk && !self.groups.is_empty() {
            if self.cursor >= self.groups.len() {
                self.cursor = 0;
            }
            seen += 1;
            let Some((&n, g)) = self.groups.get_index_mut(self.cursor) else {
                break;
            };
            g.members.retain(|m| live(n, m));
            if g.members.is_empty() {
                // The last entry moves into this slot: look at it next.
                self.drop_group(n);
            } else {
                self.cursor += 1;
            }
        }
    }

    fn drop_group(&mut self, n: u32) {
        if let Some(g) = self.groups.swap_remove(&n) {
            self.numbers.remove(&g.name);
        }
    }

    /// Groups with members.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.groups.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_join_once_and_dead_ones_are_pruned() {
        let mut g = Groups::default();
        let a = g.join("ga", "k1");
        assert_eq!(g.join("ga", "k2"), a);
        assert_eq!(g.join("ga", "k1"), a);
        let b = g.join("gb", "k3");
        assert_ne!(a, b);
        assert_eq!(g.number("ga"), Some(a));
        let live = g.live_members(a, |k| k != "k1");
        assert_eq!(live, vec![Box::<str>::from("k2")]);
        assert!(g.live_members(b, |_| false).is_empty());
        assert_eq!(g.number("gb"), None, "an empty group goes");
        assert_eq!(g.len(), 1);
    }

    #[test]
    fn the_sweep_walks_a_chunk_at_a_time_and_drops_empty_groups() {
        let mut g = Groups::default();
        for i in 0..10 {
            g.join(&format!("g{i}"), &format!("k{i}"));
        }
        // Keys of even groups are gone.
        let dead = |_: u32, k: &str| k[1..].parse::<u32>().is_ok_and(|i| i % 2 == 1);
        g.sweep(3, dead);
        assert!(g.len() < 10 && g.len() >= 7, "{}", g.len());
        for _ in 0..5 {
            g.sweep(3, dead);
        }
        assert_eq!(g.len(), 5);
        assert!(g.number("g1").is_some());
        assert!(g.number("g2").is_none());
    }
}
