//! A set of ranks (slots) of one group: a group holds at most
//! [`RankSet::CAPACITY`] members, so a set is one 64-bit mask. On the wire
//! the mask travels as its bits.

use std::fmt;
use std::ops::{BitAnd, BitAndAssign, BitOr, BitOrAssign, Not, Sub, SubAssign};

/// A set of ranks below [`RankSet::CAPACITY`].
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct RankSet(u64);

impl RankSet {
    /// Most ranks a group has.
    pub(crate) const CAPACITY: usize = 64;
    /// No rank.
    pub(crate) const EMPTY: RankSet = RankSet(0);

    /// The set whose mask is `bits` (bit `r` set: rank `r` is in it).
    pub(crate) fn from_bits(bits: u64) -> RankSet {
        RankSet(bits)
    }

    /// The mask (bit `r` set: rank `r` is in the set).
    pub(crate) fn bits(self) -> u64 {
        self.0
    }

    /// Rank `r` alone; empty when `r` is not below the capacity (a rank
    /// read from a message is never trusted to be).
    pub(crate) fn one(r: usize) -> RankSet {
        if r < Self::CAPACITY {
            RankSet(1u64 << r)
        } else {
            RankSet::EMPTY
        }
    }

    /// Ranks `0..n` (all of them from the capacity on).
    pub(crate) fn first(n: usize) -> RankSet {
        if n >= Self::CAPACITY {
            RankSet(u64::MAX)
        } else {
            RankSet((1u64 << n) - 1)
        }
    }

    /// Whether rank `r` is in the set.
    pub(crate) fn contains(self, r: usize) -> bool {
        r < Self::CAPACITY && self.0 >> r & 1 == 1
    }

    /// How many ranks the set holds.
    pub(crate) fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Whether the set holds no rank.
    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether every rank of `self` is in `other`.
    pub(crate) fn is_subset(self, other: RankSet) -> bool {
        self.0 & !other.0 == 0
    }

    /// Add rank `r` (ignored when not below the capacity).
    pub(crate) fn insert(&mut self, r: usize) {
        *self |= RankSet::one(r);
    }

    /// Remove rank `r`.
    pub(crate) fn remove(&mut self, r: usize) {
        *self -= RankSet::one(r);
    }

    /// The lowest rank of the set.
    pub(crate) fn lowest(self) -> Option<usize> {
        (!self.is_empty()).then(|| self.0.trailing_zeros() as usize)
    }

    /// The ranks, lowest first.
    pub(crate) fn iter(self) -> impl Iterator<Item = usize> {
        (0..Self::CAPACITY).filter(move |&r| self.contains(r))
    }

    /// The ranks, lowest first.
    pub(crate) fn to_vec(self) -> Vec<usize> {
        self.iter().collect()
    }
}

impl FromIterator<usize> for RankSet {
    fn from_iter<I: IntoIterator<Item = usize>>(it: I) -> RankSet {
        it.into_iter()
            .fold(RankSet::EMPTY, |s, r| s | RankSet::one(r))
    }
}

impl fmt::Debug for RankSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl BitOr for RankSet {
    type Output = RankSet;
    fn bitor(self, o: RankSet) -> RankSet {
        RankSet(self.0 | o.0)
    }
}

impl BitOrAssign for RankSet {
    fn bitor_assign(&mut self, o: RankSet) {
        self.0 |= o.0;
    }
}

impl BitAnd for RankSet {
    type Output = RankSet;
    fn bitand(self, o: RankSet) -> RankSet {
        RankSet(self.0 & o.0)
    }
}

impl BitAndAssign for RankSet {
    fn bitand_assign(&mut self, o: RankSet) {
        self.0 &= o.0;
    }
}

/// The complement within the capacity.
impl Not for RankSet {
    type Output = RankSet;
    fn not(self) -> RankSet {
        RankSet(!self.0)
    }
}

/// The ranks of `self` that are not in `o`.
impl Sub for RankSet {
    type Output = RankSet;
    fn sub(self, o: RankSet) -> RankSet {
        RankSet(self.0 & !o.0)
    }
}

impl SubAssign for RankSet {
    fn sub_assign(&mut self, o: RankSet) {
        self.0 &= !o.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_of_ranks() {
        assert_eq!(RankSet::first(3).bits(), 0b111);
        assert_eq!(RankSet::first(64).bits(), u64::MAX);
        assert_eq!(RankSet::first(0), RankSet::EMPTY);
        assert_eq!(RankSet::from_bits(0b1010).to_vec(), vec![1, 3]);
        assert_eq!(RankSet::one(64), RankSet::EMPTY);
        assert!(!RankSet::from_bits(u64::MAX).contains(64));
        let mut s: RankSet = [0, 5, 9].into_iter().collect();
        assert_eq!(s.len(), 3);
        s.remove(5);
        s.insert(70);
        assert_eq!(s.to_vec(), vec![0, 9]);
        assert_eq!(s.lowest(), Some(0));
        assert_eq!(RankSet::EMPTY.lowest(), None);
        assert!(RankSet::one(9).is_subset(s));
        assert!(!RankSet::one(1).is_subset(s));
        assert_eq!(s - RankSet::one(0), RankSet::one(9));
        assert_eq!(format!("{s:?}"), "{0, 9}");
    }
}
