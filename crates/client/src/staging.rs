//! Local-buffer (staging) space accounting: staged puts and gets reserve
//! their value's size from `local_buffer_size`; the reservation is released
//! when the call returns or the resulting value is dropped.

use parking_lot::Mutex;
use std::sync::Arc;

/// Capacity accounting for the local buffer.
#[derive(Debug)]
pub(crate) struct StagingArea {
    capacity: u64,
    used: Mutex<u64>,
}

impl StagingArea {
    /// A staging area of `capacity` bytes.
    pub(crate) fn new(capacity: u64) -> Arc<Self> {
        Arc::new(StagingArea {
            capacity,
            used: Mutex::new(0),
        })
    }

    /// The local buffer's size.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Reserve `size` bytes, or None when they do not fit.
    pub(crate) fn reserve(self: &Arc<Self>, size: u64) -> Option<Reservation> {
        let mut u = self.used.lock();
        if size == 0 || size > self.capacity.saturating_sub(*u) {
            return None;
        }
        *u += size;
        Some(Reservation {
            area: Arc::clone(self),
            size,
        })
    }
}

/// A staging reservation, released on drop.
#[derive(Debug)]
pub(crate) struct Reservation {
    area: Arc<StagingArea>,
    size: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut u = self.area.used.lock();
        *u = u.saturating_sub(self.size);
    }
}
