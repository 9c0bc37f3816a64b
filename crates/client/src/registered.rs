//! Registered memory regions (`register_buffer`); `get_into_ranges`
//! destinations must lie inside one.

use parking_lot::RwLock;
use std::collections::BTreeMap;

/// Non-overlapping registered regions: start -> length.
#[derive(Debug, Default)]
pub(crate) struct Regions {
    map: RwLock<BTreeMap<usize, usize>>,
}

impl Regions {
    /// Register; false when empty or overlapping an existing region.
    pub(crate) fn register(&self, ptr: usize, size: usize) -> bool {
        let Some(end) = ptr.checked_add(size) else {
            return false;
        };
        if size == 0 {
            return false;
        }
        let mut m = self.map.write();
        if let Some((&s, &l)) = m.range(..end).next_back() {
            if s + l > ptr {
                return false;
            }
        }
        m.insert(ptr, size);
        true
    }

    /// Unregister the region starting at `ptr`.
    pub(crate) fn unregister(&self, ptr: usize) -> bool {
        self.map.write().remove(&ptr).is_some()
    }

    /// Bytes available from `ptr` to the end of the region containing it.
    pub(crate) fn room_from(&self, ptr: usize) -> Option<usize> {
        let m = self.map.read();
        let (&s, &l) = m.range(..=ptr).next_back()?;
        (ptr < s + l).then(|| s + l - ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_rules() {
        let r = Regions::default();
        assert!(r.register(1000, 100));
        assert!(!r.register(1050, 10));
        assert!(!r.register(950, 51));
        assert!(r.register(1100, 10));
        assert!(r.register(900, 100));
        assert_eq!(r.room_from(1000), Some(100));
        assert_eq!(r.room_from(1031), Some(69));
        assert_eq!(r.room_from(1110), None);
        assert!(r.unregister(1000));
        assert!(!r.unregister(1000));
        assert_eq!(r.room_from(1000), None);
    }
}
