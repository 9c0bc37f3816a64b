//! Shared-memory segments (`memfd`, mapped `MAP_SHARED`) and the
//! process-wide registry of segments owned by this process.

use memmap2::{MmapOptions, MmapRaw};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, OnceLock};

/// A segment of memory that other processes on this host can map.
pub struct Segment {
    uuid: String,
    file: File,
    map: MmapRaw,
}

impl Segment {
    /// Allocate a zero-filled segment of `size` bytes backed by a memfd.
    pub fn create(size: u64) -> std::io::Result<Arc<Segment>> {
        let uuid = uuid::Uuid::new_v4().to_string();
        let fd = memfd_create(
            &std::ffi::CString::new(format!("mooncake-seg-{uuid}"))
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
            MemFdCreateFlag::MFD_CLOEXEC,
        )?;
        let file = File::from(fd);
        file.set_len(size)?;
        let map = MmapOptions::new().len(size as usize).map_raw(&file)?;
        Ok(Arc::new(Segment { uuid, file, map }))
    }

    /// Map a segment received from its owner (same host).
    pub fn from_fd(uuid: String, file: File, size: u64) -> std::io::Result<Arc<Segment>> {
        let actual = file.metadata()?.len();
        if actual < size {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("segment size mismatch: fd has {actual} bytes, expected {size}"),
            ));
        }
        let map = MmapOptions::new().len(size as usize).map_raw(&file)?;
        Ok(Arc::new(Segment { uuid, file, map }))
    }

    /// The segment's id.
    pub fn uuid(&self) -> &str {
        &self.uuid
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.map.len() as u64
    }

    /// Base address in this process.
    pub fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// The backing file descriptor (sent to same-host readers).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Check that `[offset, offset+len)` lies in the segment.
    pub fn check_range(&self, offset: u64, len: u64) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= self.size())
    }
}

// SAFETY: the mapping is plain shared memory; concurrent access is coordinated
// by the store protocol (the master hands out disjoint ranges).
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

fn registry() -> &'static RwLock<HashMap<String, Arc<Segment>>> {
    static REG: OnceLock<RwLock<HashMap<String, Arc<Segment>>>> = OnceLock::new();
    REG.get_or_init(|| RwLock::new(HashMap::new()))
}

/// Make a segment owned by this process visible to the in-process path.
pub fn register_local(seg: &Arc<Segment>) {
    registry()
        .write()
        .insert(seg.uuid().to_string(), Arc::clone(seg));
}

/// Remove a segment from the in-process registry.
pub fn unregister_local(uuid: &str) {
    registry().write().remove(uuid);
}

/// Look up a segment owned by this process.
pub fn local_segment(uuid: &str) -> Option<Arc<Segment>> {
    registry().read().get(uuid).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_and_register() {
        let s = Segment::create(1 << 16).unwrap();
        assert_eq!(s.size(), 1 << 16);
        assert!(s.check_range(0, 1 << 16));
        assert!(!s.check_range(1, 1 << 16));
        assert!(!s.check_range(u64::MAX, 2));
        register_local(&s);
        assert!(local_segment(s.uuid()).is_some());
        unregister_local(s.uuid());
        assert!(local_segment(s.uuid()).is_none());
    }
}
