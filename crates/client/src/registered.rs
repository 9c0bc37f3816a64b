//! Registered memory regions (`register_buffer`); `get_into_ranges`
//! destinations must lie inside one. The regions live in a
//! [`Registry`] of the transfer engine: the client's own, or, when
//! the store was set up on a `mooncake.engine` transfer engine, that
//! engine's, so both see one set of registered memory.

use mooncake_transfer::engine::Registry;
use std::sync::Arc;

/// Non-overlapping registered regions.
#[derive(Debug)]
pub(crate) struct Regions {
    registry: Arc<Registry>,
}

impl Default for Regions {
    fn default() -> Self {
        Regions {
            registry: Registry::new(),
        }
    }
}

impl Regions {
    /// The regions of `registry` (shared with a transfer engine).
    pub(crate) fn shared(registry: Arc<Registry>) -> Regions {
        Regions { registry }
    }

    /// Register; false when empty or overlapping an existing region.
    pub(crate) fn register(&self, ptr: usize, size: usize) -> bool {
        self.registry
            .register(ptr as u64, size as u64, "cpu:0")
            .is_ok()
    }

    /// Unregister the region starting at `ptr`.
    pub(crate) fn unregister(&self, ptr: usize) -> bool {
        self.registry.unregister(ptr as u64).is_ok()
    }

    /// Bytes available from `ptr` to the end of the region containing it.
    pub(crate) fn room_from(&self, ptr: usize) -> Option<usize> {
        self.registry.room_from(ptr as u64).map(|n| n as usize)
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

    #[test]
    fn a_shared_registry_is_one_set_of_regions() {
        let reg = Registry::new();
        let r = Regions::shared(Arc::clone(&reg));
        reg.register(1000, 100, "*").unwrap();
        assert_eq!(r.room_from(1010), Some(90));
        assert!(!r.register(1050, 10));
        assert!(r.register(2000, 10));
        assert!(reg.contains(2000, 10));
    }
}
