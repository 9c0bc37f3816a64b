//! Shared-memory segments (`memfd`, mapped `MAP_SHARED`) and the
//! process-wide registry of segments owned by this process.

use memmap2::{MmapOptions, MmapRaw};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::{Arc, OnceLock};

/// Copies at least this large into a segment go through `pwrite`.
const PWRITE_MIN: u64 = 1 << 20;

/// `false` when `MC_STORE_PWRITE=off` (read once).
fn pwrite_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        !std::env::var("MC_STORE_PWRITE")
            .map(|v| v.eq_ignore_ascii_case("off"))
            .unwrap_or(false)
    })
}

/// `true` when `MC_STORE_PREFAULT` is a true boolean (`on`, `1`, `true`,
/// `yes`; read once): new segments are committed to memory when created.
fn prefault_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("MC_STORE_PREFAULT")
            .ok()
            .and_then(|v| mooncake_common::size::parse_bool(&v))
            .unwrap_or(false)
    })
}

/// Commit every page of `len` bytes at `base` (a fresh, zero-filled shared
/// mapping), several threads at a time: `MADV_POPULATE_WRITE`, or a zero
/// store per page where the kernel lacks it (before 5.14).
///
/// # Safety
/// `base..base+len` must be a writable mapping nobody else uses yet.
unsafe fn commit_pages(base: *mut u8, len: usize) {
    let page = page_size();
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 4);
    let chunk = len.div_ceil(threads).div_ceil(page) * page;
    let base = base as usize;
    std::thread::scope(|sc| {
        for i in 0..threads {
            let start = i * chunk;
            if start >= len {
                break;
            }
            let n = chunk.min(len - start);
            sc.spawn(move || {
                let at = (base + start) as *mut u8;
                // SAFETY: a page-aligned piece of the caller's mapping.
                let r = unsafe { libc::madvise(at.cast(), n, libc::MADV_POPULATE_WRITE) };
                if r != 0 {
                    let mut off = 0;
                    while off < n {
                        // SAFETY: inside the mapping; the page is still all zero.
                        unsafe { std::ptr::write_volatile(at.add(off), 0) };
                        off += page;
                    }
                }
            });
        }
    });
}

/// The page size (queried once).
fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    })
}

/// `pwrite` `src..+len` at `offset`, retrying on `EINTR` and short writes;
/// returns the number of bytes written (less than `len` after an error).
///
/// # Safety
/// `src..src+len` must be readable.
unsafe fn pwrite_all(fd: RawFd, src: *const u8, len: u64, offset: u64) -> u64 {
    let mut done = 0u64;
    while done < len {
        // SAFETY: `src + done .. src + len` is inside the caller's readable range.
        let r = unsafe {
            libc::pwrite(
                fd,
                src.add(done as usize) as *const libc::c_void,
                (len - done) as usize,
                (offset + done) as libc::off_t,
            )
        };
        if r > 0 {
            done += r as u64;
        } else if r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {
            continue;
        } else {
            break;
        }
    }
    done
}

/// A segment of memory that other processes on this host can map.
pub struct Segment {
    uuid: String,
    file: File,
    map: MmapRaw,
}

impl Segment {
    /// Allocate a zero-filled segment of `size` bytes backed by a memfd.
    ///
    /// Pages are committed lazily, on first write, unless
    /// `MC_STORE_PREFAULT=on`: then they are all committed here. That costs
    /// the whole segment in RAM from the start (and setup time), and makes
    /// every later first write into the segment a plain memory copy; on a VM
    /// whose first touch of a page is slow, bulk uploads (EngramStore's
    /// `populate`) run several times faster.
    pub fn create(size: u64) -> std::io::Result<Arc<Segment>> {
        Self::create_with(size, prefault_enabled())
    }

    /// [`Segment::create`], committing the pages up front when `prefault`.
    pub fn create_with(size: u64, prefault: bool) -> std::io::Result<Arc<Segment>> {
        let uuid = uuid::Uuid::new_v4().to_string();
        let fd = memfd_create(
            &std::ffi::CString::new(format!("mooncake-seg-{uuid}"))
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
            MemFdCreateFlag::MFD_CLOEXEC,
        )?;
        let file = File::from(fd);
        file.set_len(size)?;
        let map = MmapOptions::new().len(size as usize).map_raw(&file)?;
        if prefault {
            // SAFETY: the mapping was just created and is ours alone.
            unsafe { commit_pages(map.as_mut_ptr(), map.len()) };
        }
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

    /// Write `len` bytes from `src` into the segment at `offset` (a range
    /// that `check_range` accepted) with `pwrite` through the memfd, when
    /// the range is large and its pages have never been written (sampled
    /// at the first, middle and last page); returns `false`, having written
    /// nothing, otherwise: the caller then copies through the mapping.
    ///
    /// For never-touched pages the kernel allocates each page and fills it
    /// in one step, without the page fault, page-table update and zero-fill
    /// that a first store through the mapping costs (about 1.7x faster on a
    /// 2-core VM, where page-table updates are expensive); the pages are
    /// mapped later, on first read, 16 at a time. Pages already in memory
    /// are faster to fill through the mapping, with several threads. On a
    /// `pwrite` error the rest is copied through the mapping.
    /// `MC_STORE_PWRITE=off` disables this path.
    ///
    /// # Safety
    /// `src..src+len` must be readable, and the range must lie in the segment.
    pub unsafe fn write_fresh(&self, offset: u64, src: *const u8, len: u64) -> bool {
        if len < PWRITE_MIN || !pwrite_enabled() || self.any_resident(offset, len) {
            return false;
        }
        // SAFETY: the caller guarantees `src..+len` is readable.
        let done = unsafe { pwrite_all(self.file.as_raw_fd(), src, len, offset) };
        if done < len {
            // SAFETY: the rest of the caller's readable source, into the
            // rest of a range the caller guarantees lies in the segment.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.add(done as usize),
                    self.base().add((offset + done) as usize),
                    (len - done) as usize,
                )
            };
        }
        true
    }

    /// Whether the first, middle or last page of a (non-empty) range is in
    /// memory.
    fn any_resident(&self, offset: u64, len: u64) -> bool {
        let page = page_size();
        let base = self.base() as usize;
        [offset, offset + len / 2, offset + len - 1]
            .iter()
            .any(|&at| {
                let addr = (base + at as usize) & !(page - 1);
                let mut v = 0u8;
                // SAFETY: one page inside this mapping; `v` receives one byte.
                let r = unsafe { libc::mincore(addr as *mut libc::c_void, 1, &mut v) };
                r != 0 || v & 1 != 0
            })
    }
}

// SAFETY: the mapping is plain shared memory; concurrent access is coordinated
// by the store protocol (the master hands out disjoint ranges).
unsafe impl Send for Segment {}
// SAFETY: as for Send: `&Segment` only hands out the base address and the
// descriptor; who writes where is decided by the master's allocations.
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

    #[test]
    fn prefault_commits_every_page() {
        let len: usize = (3 << 20) + 4096 * 5;
        let s = Segment::create_with(len as u64, true).unwrap();
        let page = page_size();
        let mut resident = vec![0u8; len.div_ceil(page)];
        // SAFETY: the mapping is `len` bytes; one status byte per page.
        let r = unsafe { libc::mincore(s.base().cast(), len, resident.as_mut_ptr()) };
        assert_eq!(r, 0);
        assert!(resident.iter().all(|&v| v & 1 == 1));
        // SAFETY: the mapping is `len` bytes and nobody writes it meanwhile.
        let mem = unsafe { std::slice::from_raw_parts(s.base(), len) };
        assert!(mem.iter().all(|&b| b == 0));
        // Committed pages are filled through the mapping, not pwrite.
        let src = vec![9u8; (PWRITE_MIN * 2) as usize];
        // SAFETY: `src` is readable and the range lies in the segment.
        assert!(!unsafe { s.write_fresh(0, src.as_ptr(), src.len() as u64) });
        let lazy = Segment::create_with(len as u64, false).unwrap();
        assert!(!lazy.any_resident(0, len as u64));
    }

    #[test]
    fn fresh_write_is_exact() {
        // Odd offset and length (partial first and last pages); bytes
        // around the range stay zero.
        let len = (PWRITE_MIN * 5 + 12_345) as usize;
        let s = Segment::create((len + (1 << 20)) as u64).unwrap();
        let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4099) as u8).collect();
        let off = 4096 * 3 + 17;
        assert!(s.check_range(off as u64, len as u64));
        assert!(!s.any_resident(off as u64, len as u64));
        let fresh = |at: usize, n: u64| {
            // SAFETY: `src` is readable for the lengths used below and the
            // ranges lie in the segment.
            unsafe { s.write_fresh(at as u64, src.as_ptr(), n) }
        };
        assert!(!fresh(0, PWRITE_MIN - 1));
        assert!(fresh(off, len as u64));
        // SAFETY: the whole mapping, not written meanwhile.
        let mem = unsafe { std::slice::from_raw_parts(s.base(), s.size() as usize) };
        assert!(mem[..off].iter().all(|&b| b == 0));
        assert!(mem[off..off + len] == src[..]);
        assert!(mem[off + len..].iter().all(|&b| b == 0));
        // Now resident: left to the caller.
        assert!(s.any_resident(off as u64, len as u64));
        assert!(!fresh(off, len as u64));
    }
}
