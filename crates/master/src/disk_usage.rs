//! The bytes the owners' disk tiers hold, against the capacity the master
//! may fill (`--global_file_segment_size`).
//!
//! Every disk copy an object records (see `Object::disk`) counts its size
//! here from the moment it is queued until the copy is forgotten, lost or
//! its segment goes. Eviction asks whether one more copy fits; when a pass
//! keeps objects in memory for want of room on disk it says so once, and
//! again only after an offload succeeded in between.

/// Disk-tier usage (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct DiskUsage {
    bytes: u64,
    /// A pass kept objects in memory for want of disk and said so.
    full_warned: bool,
}

/// What an eviction pass should report about disk room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DiskNote {
    /// Nothing new.
    Quiet,
    /// Objects were kept in memory for want of disk: warn (once).
    Full,
}

impl DiskUsage {
    /// Bytes of all disk copies.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// A disk copy of `size` bytes was recorded.
    pub(crate) fn add(&mut self, size: u64) {
        self.bytes = self.bytes.saturating_add(size);
    }

    /// Disk copies of `size` bytes in all went away.
    pub(crate) fn release(&mut self, size: u64) {
        self.bytes = self.bytes.saturating_sub(size);
    }

    /// Whether one more copy of `size` bytes stays within `cap`.
    pub(crate) fn fits(&self, size: u64, cap: u64) -> bool {
        self.bytes.saturating_add(size) <= cap
    }

    /// An eviction pass offloaded `offloaded` objects and kept `kept` in
    /// memory for want of disk: whether to warn now. A warning is given
    /// once, and again only after a pass that offloaded and kept nothing.
    pub(crate) fn after_pass(&mut self, kept: u64, offloaded: u64) -> DiskNote {
        if kept > 0 && !self.full_warned {
            self.full_warned = true;
            DiskNote::Full
        } else {
            if offloaded > 0 && kept == 0 {
                self.full_warned = false;
            }
            DiskNote::Quiet
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{DiskNote, DiskUsage};

    #[test]
    fn copies_count_until_they_go_and_the_cap_is_inclusive() {
        let mut d = DiskUsage::default();
        assert!(d.fits(100, 100));
        d.add(60);
        d.add(40);
        assert_eq!(d.bytes(), 100);
        assert!(d.fits(0, 100) && !d.fits(1, 100));
        d.release(40);
        assert!(d.fits(40, 100) && !d.fits(41, 100));
        d.release(1000);
        assert_eq!(d.bytes(), 0, "never below zero");
        d.add(u64::MAX);
        d.add(1);
        assert_eq!(d.bytes(), u64::MAX, "never wraps");
    }

    #[test]
    fn a_full_disk_is_reported_once_until_an_offload_succeeds() {
        let mut d = DiskUsage::default();
        assert_eq!(d.after_pass(0, 3), DiskNote::Quiet);
        assert_eq!(d.after_pass(2, 0), DiskNote::Full);
        assert_eq!(d.after_pass(5, 1), DiskNote::Quiet, "said once");
        assert_eq!(d.after_pass(0, 0), DiskNote::Quiet);
        assert_eq!(
            d.after_pass(1, 0),
            DiskNote::Quiet,
            "nothing offloaded since"
        );
        // A pass that offloaded and kept nothing: the next full pass warns.
        assert_eq!(d.after_pass(0, 2), DiskNote::Quiet);
        assert_eq!(d.after_pass(1, 0), DiskNote::Full);
    }
}
