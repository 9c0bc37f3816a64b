//! Shared-memory segments (`memfd`, mapped `MAP_SHARED`) and the
//! process-wide registry of segments owned by this process.

use crate::cpu_load;
use crate::fresh_gate;
use memmap2::{MmapOptions, MmapRaw};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Granularity of the record of which parts of a segment are mapped in this
/// process's page table ([`Segment::map_range`]).
const MAP_CHUNK: u64 = 64 << 10;

/// Copies at least this large into never-written segment pages go through
/// `pwrite` (below it, the few pages a copy touches fault in about as fast).
const PWRITE_MIN: u64 = 16 << 10;

/// Most pieces one `pwritev` call takes (Linux's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// `false` when `MC_STORE_PWRITE=off` (read once).
fn pwrite_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        !std::env::var("MC_STORE_PWRITE")
            .map(|v| v.eq_ignore_ascii_case("off"))
            .unwrap_or(false)
    })
}

/// When a new segment's pages are committed to memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefault {
    /// On first write (the kernel allocates each page when it is first
    /// stored to).
    Lazy,
    /// All of them when the segment is created, before `create` returns.
    Setup,
    /// On a thread of the segment's own at idle priority, from the lowest
    /// address up, after `create` returns (see
    /// [`Segment::commit_in_background`]).
    Background,
}

impl Prefault {
    /// The mode `MC_STORE_PREFAULT` names (read once): a false boolean
    /// (`off`, `0`, `false`, `no`) is [`Prefault::Lazy`], a true one
    /// [`Prefault::Setup`], `background` or unset [`Prefault::Background`]
    /// (anything else warns and uses the default).
    pub fn from_env() -> Prefault {
        static MODE: OnceLock<Prefault> = OnceLock::new();
        *MODE.get_or_init(|| match std::env::var("MC_STORE_PREFAULT") {
            Err(_) => Prefault::Background,
            Ok(v) if v.trim().eq_ignore_ascii_case("background") => Prefault::Background,
            Ok(v) => match mooncake_common::size::parse_bool(&v) {
                Some(true) => Prefault::Setup,
                Some(false) => Prefault::Lazy,
                None => {
                    tracing::warn!(value = %v, "MC_STORE_PREFAULT is not on, off or background; using background");
                    Prefault::Background
                }
            },
        })
    }
}

/// How long this process must have moved no store data before a background
/// committer goes on: page allocation competes with the copies of
/// latency-sensitive requests for memory bandwidth and cores, so it waits
/// for a pause in traffic.
const QUIET_NS: u64 = 20_000_000;

/// When this process last moved store data (a transfer of this process's
/// engine, or a request its data server took), on [`fresh_gate::now_ns`]'s
/// clock; 0 before the first.
static LAST_USE_NS: AtomicU64 = AtomicU64::new(0);

/// Record that this process is moving store data now (background
/// committers pause until [`QUIET_NS`] have passed without such a call).
pub(crate) fn note_use() {
    LAST_USE_NS.store(fresh_gate::now_ns().max(1), Ordering::Relaxed);
}

/// Wait until this process has moved no store data for [`QUIET_NS`];
/// returns at once when it has not moved any in that time.
fn wait_for_quiet() {
    loop {
        let last = LAST_USE_NS.load(Ordering::Relaxed);
        let idle = fresh_gate::now_ns().saturating_sub(last);
        if last == 0 || idle >= QUIET_NS {
            return;
        }
        std::thread::sleep(std::time::Duration::from_nanos(QUIET_NS - idle));
    }
}

/// How long the background committer sleeps when the machine is busy
/// before it looks again.
const BUSY_RECHECK: std::time::Duration = std::time::Duration::from_millis(2);

/// Whether the machine is mostly idle ([`cpu_load::Load::mostly_idle`]:
/// the runnable threads, the committer among them, fill at most half the
/// CPUs); true where the load cannot be read. The background committer's
/// gate: it commits a step only when this holds.
///
/// Idle priority alone does not keep the committer out of other work's
/// way: the scheduler places a woken thread on a CPU that runs only
/// idle-priority work as if that CPU were idle, and there the thread waits
/// while the committer's page allocation holds the CPU. Measured on a
/// 2-vCPU VM: of another process's 1,000 `is_exist` calls to the master,
/// the 10th to 15th slowest took 48-107 µs (and single calls 2-4 ms) while
/// a segment committed in the background, against 14-56 µs without the
/// committer and 14-60 µs with this gate.
fn machine_mostly_idle() -> bool {
    cpu_load::now().is_none_or(|l| l.mostly_idle())
}

/// Wait until `may_run` says yes, asking every [`BUSY_RECHECK`].
fn wait_until(may_run: fn() -> bool) {
    while !may_run() {
        std::thread::sleep(BUSY_RECHECK);
    }
}

/// Chunks the background committer commits between two checks of the
/// machine's available memory (64 MiB).
const MEMORY_CHECK_CHUNKS: u64 = 1024;

/// Whether the machine has memory to spare for committing more of a
/// segment ahead of its writes: more than a quarter of its memory still
/// available (`/proc/meminfo`; `false` when that cannot be read).
fn memory_to_spare() -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/meminfo") else {
        return false;
    };
    let field = |name: &str| -> Option<u64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
    };
    match (field("MemAvailable:"), field("MemTotal:")) {
        (Some(avail), Some(total)) => avail > total / 4,
        _ => false,
    }
}

/// The body of the background committer of one segment: lower the
/// thread to idle priority, then, whenever this process has moved no store
/// data for [`QUIET_NS`], commit each [`MAP_CHUNK`] of the segment not yet
/// mapped whole with one `MADV_POPULATE_WRITE` call (which allocates missing
/// pages and maps present ones without changing any byte, so it is safe
/// beside writers; about 30 µs of page allocation on the reference VM),
/// marking the chunk mapped. Stops when the segment is dropped, when the
/// machine's memory runs low, or when the kernel refuses the advice (before
/// 5.14: the segment then stays lazy).
///
/// The thread yields the core after every call: a thread that spins by
/// yielding (waiting for a reply) may have handed the core to the
/// committer, and would otherwise get it back only at the next scheduler
/// tick (milliseconds). One call per chunk also bounds how long the
/// process's memory-map lock is held for reading, which an `mmap` or
/// `munmap` of another thread waits for.
fn commit_steps(seg: std::sync::Weak<Segment>, may_run: fn() -> bool) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sets the calling thread's scheduling policy; `param` is a
    // valid, initialised struct.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    let chunks = match seg.upgrade() {
        Some(s) => s.size().div_ceil(MAP_CHUNK),
        None => return,
    };
    for chunk in 0..chunks {
        if chunk % MEMORY_CHECK_CHUNKS == 0 && !memory_to_spare() {
            return;
        }
        let Some(s) = seg.upgrade() else { return };
        if s.chunk_mapped(chunk) {
            continue;
        }
        wait_for_quiet();
        wait_until(may_run);
        let at = chunk * MAP_CHUNK;
        let n = MAP_CHUNK.min(s.size() - at);
        // SAFETY: `at..at+n` lies in the segment's mapping, which `s` keeps
        // alive; `at` is page-aligned (a multiple of the chunk size). The
        // advice changes no byte of the range.
        let r = unsafe {
            libc::madvise(
                s.base().add(at as usize).cast(),
                n as usize,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r != 0 {
            return;
        }
        s.mark_mapped(chunk);
        drop(s);
        std::thread::yield_now();
    }
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
    use nix::unistd::{sysconf, SysconfVar};
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| match sysconf(SysconfVar::PAGE_SIZE) {
        Ok(Some(n)) if n > 0 => n as usize,
        _ => 4096,
    })
}

#[cfg(test)]
/// `pwrite` `src..+len` at `offset`, retrying on `EINTR` and short writes;
/// returns the number of bytes written (less than `len` after an error).
///
/// # Safety
/// `src..src+len` must be readable.
unsafe fn pwrite_all(fd: std::os::fd::RawFd, src: *const u8, len: u64, offset: u64) -> u64 {
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

/// What [`Segment::write_fresh_run`] did with a run, and how the caller
/// copies it when it wrote nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreshWrite {
    /// Written through the memfd and mapped here: nothing left to do.
    Written,
    /// Nothing written; the run's pages have never been written: copy
    /// through the mapping directly, the stores faulting the new pages in
    /// (on as many workers as copy at once, unlike `pwrite`, which takes the
    /// file's lock for the whole call).
    CopyFresh,
    /// Nothing written; pages may already be in memory (or the run is
    /// small): [`Segment::map_range`] first, then copy through the mapping.
    CopyMapped,
}

/// A segment of memory that other processes on this host can map.
pub struct Segment {
    uuid: String,
    file: File,
    map: MmapRaw,
    /// One bit per [`MAP_CHUNK`] of the segment: set once every page of the
    /// chunk is mapped in this process (by [`Segment::map_range`] or a
    /// prefault). Pages of a memfd are never unmapped or dropped here (no
    /// hole punching, no `MADV_DONTNEED`), so a set bit stays true; were a
    /// page unmapped anyway, a later copy would only fault on it again.
    mapped: Box<[AtomicU64]>,
    /// Held by the one worker whose `pwritev` into never-written pages is in
    /// flight: shmem's write path holds the file's lock for the whole call,
    /// so a second writer would only wait; it copies through the mapping
    /// instead (page faults run in parallel).
    pwriter: AtomicBool,
}

/// An all-clear chunk record for a segment of `size` bytes.
fn chunk_bits(size: u64) -> Box<[AtomicU64]> {
    let chunks = size.div_ceil(MAP_CHUNK);
    (0..chunks.div_ceil(64))
        .map(|_| AtomicU64::new(0))
        .collect()
}

impl Segment {
    /// Allocate a zero-filled segment of `size` bytes backed by a memfd,
    /// its pages committed as `MC_STORE_PREFAULT` says ([`Prefault::from_env`]):
    /// by default in the background after this returns, so that writes
    /// into the segment soon copy into pages already in memory instead of
    /// paying a page allocation and zero fill per 4 KiB page (on a VM,
    /// about as much as the copy itself), while a machine short of memory
    /// is left alone. `off` commits pages on first write; `on` commits them
    /// all here (the segment's size in RAM, and setup time).
    pub fn create(size: u64) -> std::io::Result<Arc<Segment>> {
        Self::create_with(size, Prefault::from_env())
    }

    /// [`Segment::create`] with the commit mode given.
    pub fn create_with(size: u64, prefault: Prefault) -> std::io::Result<Arc<Segment>> {
        let uuid = uuid::Uuid::new_v4().to_string();
        let fd = memfd_create(
            &std::ffi::CString::new(format!("mooncake-seg-{uuid}"))
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
            MemFdCreateFlag::MFD_CLOEXEC,
        )?;
        let file = File::from(fd);
        file.set_len(size)?;
        let map = MmapOptions::new().len(size as usize).map_raw(&file)?;
        let mapped = chunk_bits(size);
        if prefault == Prefault::Setup {
            // SAFETY: the mapping was just created and is ours alone.
            unsafe { commit_pages(map.as_mut_ptr(), map.len()) };
            mapped
                .iter()
                .for_each(|w| w.store(u64::MAX, Ordering::Relaxed));
        }
        let seg = Arc::new(Segment {
            uuid,
            file,
            map,
            mapped,
            pwriter: AtomicBool::new(false),
        });
        if prefault == Prefault::Background {
            seg.commit_in_background();
        }
        Ok(seg)
    }

    /// Start committing the segment's pages on a thread of its own, at idle
    /// priority, only while the machine is mostly idle (the runnable
    /// threads fill at most half the CPUs) and while this process is not
    /// moving store data (it pauses from any transfer or served request
    /// until 20 ms have passed without one), from the lowest address up,
    /// which is where an empty segment's allocator places objects first.
    /// Parts already mapped whole are skipped; the thread stops when the
    /// segment is dropped or while less than a quarter of the machine's
    /// memory is available. A thread that cannot be started leaves the
    /// segment lazy.
    pub fn commit_in_background(self: &Arc<Self>) {
        self.commit_when(machine_mostly_idle);
    }

    /// [`Segment::commit_in_background`], committing each step once
    /// `may_run` says yes (asked before each step) instead of once the
    /// machine is mostly idle.
    pub(crate) fn commit_when(self: &Arc<Self>, may_run: fn() -> bool) {
        let seg = Arc::downgrade(self);
        if let Err(e) = std::thread::Builder::new()
            .name("mc-seg-commit".into())
            .spawn(move || commit_steps(seg, may_run))
        {
            tracing::debug!(error = %e, "no background commit thread; the segment stays lazy");
        }
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
        Ok(Arc::new(Segment {
            uuid,
            file,
            map,
            mapped: chunk_bits(size),
            pwriter: AtomicBool::new(false),
        }))
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
    /// the range is at least [`PWRITE_MIN`] bytes and its pages have never
    /// been written: [`Segment::write_fresh_run`] with one piece.
    ///
    /// # Safety
    /// `src..src+len` must be readable, and the range must lie in the segment.
    pub unsafe fn write_fresh(&self, offset: u64, src: *const u8, len: u64) -> FreshWrite {
        // SAFETY: the caller's contract, for the one piece.
        unsafe { self.write_fresh_run(offset, &[(src, len)]) }
    }

    /// Write a run of sources, laid end to end in the segment from `offset`
    /// (a range that `check_range` accepted), with vectored `pwritev` calls
    /// through the memfd (at most `IOV_MAX` pieces per call), when the run
    /// is at least [`PWRITE_MIN`] bytes and its pages have never been
    /// written (sampled at the first, middle and last page, once for the
    /// whole run); otherwise it writes nothing and tells the caller how to
    /// copy ([`FreshWrite`]). A value written from many buffers (a
    /// layer-first KV page is 61 of them) costs one residency check and one
    /// system call instead of one or more per buffer.
    ///
    /// For never-touched pages the kernel allocates each page and fills it
    /// in one step, without the page fault, page-table update and zero-fill
    /// that a first store through the mapping costs per 4 KiB page (about
    /// 2x faster on a 2-core VM, where page-table updates are expensive).
    /// The written range is then mapped here ([`Segment::map_range`]), so
    /// that reading it back in this process runs at memory speed instead of
    /// faulting on the way. On a `pwritev` error or short write the rest is
    /// copied through the mapping. `MC_STORE_PWRITE=off` disables this path
    /// ([`FreshWrite::CopyMapped`]).
    ///
    /// One worker at a time writes this way: a run that finds another
    /// worker's `pwritev` in flight is left to the caller as
    /// [`FreshWrite::CopyFresh`], because shmem's write path holds the
    /// file's lock for the whole call while first stores through the mapping
    /// fault in parallel (two workers, one of each: about 4.1 GB/s on the
    /// reference VM, against 3.0 for two taking turns at `pwrite` and 3.5
    /// for two storing through the mapping). Fresh runs are also left as
    /// `CopyFresh` for a while after recent calls were slow (see
    /// `fresh_gate`: when new pages need the host's help, stores through
    /// the mapping from several workers are faster).
    ///
    /// # Safety
    /// Every `src..src+len` of `pieces` must be readable, and
    /// `offset..offset+sum(len)` must lie in the segment.
    pub unsafe fn write_fresh_run(&self, offset: u64, pieces: &[(*const u8, u64)]) -> FreshWrite {
        let total: u64 = pieces.iter().map(|p| p.1).sum();
        if total < PWRITE_MIN || !pwrite_enabled() || self.any_resident(offset, total) {
            return FreshWrite::CopyMapped;
        }
        let gate = fresh_gate::gate();
        let started = fresh_gate::now_ns();
        if !gate.allow(started) {
            return FreshWrite::CopyFresh;
        }
        if self
            .pwriter
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return FreshWrite::CopyFresh;
        }
        // SAFETY: the caller's contract, passed on; we hold the pwriter flag.
        unsafe { self.pwrite_run(offset, pieces, total, started) };
        self.pwriter.store(false, Ordering::Release);
        self.map_range(offset, total);
        FreshWrite::Written
    }

    /// The `pwritev` calls of [`Segment::write_fresh_run`] (the caller holds
    /// the pwriter flag); a failed or short call's pieces and the rest are
    /// copied through the mapping.
    ///
    /// # Safety
    /// As for [`Segment::write_fresh_run`].
    unsafe fn pwrite_run(
        &self,
        offset: u64,
        pieces: &[(*const u8, u64)],
        total: u64,
        started: u64,
    ) {
        let gate = fresh_gate::gate();
        let fd = self.file.as_raw_fd();
        // Bytes of the run written so far; pieces below `next` are done.
        let mut done = 0u64;
        let mut next = 0usize;
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(pieces.len().min(IOV_MAX));
        'calls: while next < pieces.len() {
            iov.clear();
            let mut want = 0u64;
            for &(src, len) in pieces[next..].iter().take(IOV_MAX) {
                iov.push(libc::iovec {
                    iov_base: src as *mut libc::c_void,
                    iov_len: len as usize,
                });
                want += len;
            }
            let r = loop {
                // SAFETY: every iovec names a readable source (the caller's
                // contract); the file range lies in the segment.
                let r = unsafe {
                    libc::pwritev(
                        fd,
                        iov.as_ptr(),
                        iov.len() as libc::c_int,
                        (offset + done) as libc::off_t,
                    )
                };
                if r < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                break r;
            };
            if r < 0 || (r as u64) < want {
                break 'calls;
            }
            done += want;
            next += iov.len();
        }
        if next == pieces.len() {
            let now = fresh_gate::now_ns();
            gate.record(now, total, now.saturating_sub(started));
        }
        if next < pieces.len() {
            // A failed or short call: copy this call's pieces and the rest
            // through the mapping (rewriting what the short call wrote).
            let mut at = offset + done;
            for &(src, len) in &pieces[next..] {
                // SAFETY: the caller's readable source, into a range the
                // caller guarantees lies in the segment.
                unsafe {
                    std::ptr::copy_nonoverlapping(src, self.base().add(at as usize), len as usize)
                };
                at += len;
            }
        }
    }

    /// Map the pages of `[offset, offset+len)` (a range that `check_range`
    /// accepted) into this process's page table, reading one byte per page.
    ///
    /// Pages already in memory but not mapped here (written with `pwrite`,
    /// or by another process) are then mapped by one read fault per
    /// fault-around window (16 pages by default), where a store through the
    /// mapping would fault once per page. Read faults on a shared writable
    /// mapping map the pages writable, so later stores do not fault.
    /// Chunks of [`MAP_CHUNK`] bytes this process has mapped whole before
    /// are skipped: touching a page already mapped costs a TLB and a cache
    /// miss, about a tenth of the copy of a 4 KiB page on the reference VM.
    pub fn map_range(&self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let page = page_size() as u64;
        let size = self.size();
        let end = offset.saturating_add(len).min(size);
        let mut at = offset;
        while at < end {
            let chunk = at / MAP_CHUNK;
            let chunk_start = chunk * MAP_CHUNK;
            let chunk_end = (chunk_start + MAP_CHUNK).min(size);
            let stop = chunk_end.min(end);
            if !self.chunk_mapped(chunk) {
                let mut p = at & !(page - 1);
                while p < stop {
                    // SAFETY: `p` is inside the mapping (below `end` <= size);
                    // a one-byte volatile load of shared memory changes nothing.
                    unsafe { std::ptr::read_volatile(self.base().add(p as usize)) };
                    p += page;
                }
                if at <= chunk_start && stop == chunk_end {
                    self.mark_mapped(chunk);
                }
            }
            at = stop;
        }
    }

    /// Whether chunk `chunk` was mapped whole in this process.
    fn chunk_mapped(&self, chunk: u64) -> bool {
        let (word, bit) = ((chunk / 64) as usize, chunk % 64);
        self.mapped
            .get(word)
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << bit) != 0)
    }

    /// Record that chunk `chunk` is mapped whole in this process.
    fn mark_mapped(&self, chunk: u64) {
        let (word, bit) = ((chunk / 64) as usize, chunk % 64);
        if let Some(w) = self.mapped.get(word) {
            w.fetch_or(1 << bit, Ordering::Relaxed);
        }
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
        let s = Segment::create_with(1 << 16, Prefault::Lazy).unwrap();
        assert_eq!(s.size(), 1 << 16);
        assert!(s.check_range(0, 1 << 16));
        assert!(!s.check_range(1, 1 << 16));
        assert!(!s.check_range(u64::MAX, 2));
        register_local(&s);
        assert!(local_segment(s.uuid()).is_some());
        unregister_local(s.uuid());
        assert!(local_segment(s.uuid()).is_none());
    }

    /// Whether every page of `s` is in memory (`mincore`).
    fn every_page_resident(s: &Segment) -> bool {
        let len = s.size() as usize;
        let mut resident = vec![0u8; len.div_ceil(page_size())];
        // SAFETY: the mapping is `len` bytes; one status byte per page.
        let r = unsafe { libc::mincore(s.base().cast(), len, resident.as_mut_ptr()) };
        r == 0 && resident.iter().all(|&v| v & 1 == 1)
    }

    #[test]
    fn prefault_commits_every_page() {
        let len: usize = (3 << 20) + 4096 * 5;
        let s = Segment::create_with(len as u64, Prefault::Setup).unwrap();
        assert!(every_page_resident(&s));
        // SAFETY: the mapping is `len` bytes and nobody writes it meanwhile.
        let mem = unsafe { std::slice::from_raw_parts(s.base(), len) };
        assert!(mem.iter().all(|&b| b == 0));
        // Committed pages are filled through the mapping, not pwrite.
        let src = vec![9u8; (PWRITE_MIN * 2) as usize];
        // SAFETY: `src` is readable and the range lies in the segment.
        let r = unsafe { s.write_fresh(0, src.as_ptr(), src.len() as u64) };
        assert_eq!(r, FreshWrite::CopyMapped);
        let lazy = Segment::create_with(len as u64, Prefault::Lazy).unwrap();
        assert!(!lazy.any_resident(0, len as u64));
    }

    /// Waits until a committer has mapped every chunk of `s` (at most 30 s)
    /// and checks that every page is resident; false when the machine is
    /// short of memory, where a committer stops.
    fn wait_committed(s: &Segment) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !(0..s.size().div_ceil(MAP_CHUNK)).all(|c| s.chunk_mapped(c)) {
            if !memory_to_spare() {
                return false;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "commit did not finish"
            );
            std::thread::yield_now();
        }
        assert!(every_page_resident(s));
        true
    }

    #[test]
    fn background_commit_maps_every_chunk_and_keeps_concurrent_writes() {
        // An odd size: the last word of the chunk record and the last
        // chunk are partial.
        let len = ((3 * 64 + 5) * MAP_CHUNK + 4096) as usize;
        let s = Segment::create_with(len as u64, Prefault::Lazy).unwrap();
        // Committing whatever the machine's load (tests run side by side).
        s.commit_when(|| true);
        // Writes while the committer runs are kept: the advice changes no
        // byte, whether it reaches a page before or after the write.
        let src: Vec<u8> = (0..len).map(|i| (i * 13 + i / 4093) as u8).collect();
        for at in (0..len).step_by(1 << 20) {
            let n = (1usize << 20).min(len - at);
            // SAFETY: `at..at+n` lies in the segment; nobody else writes it.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(at), s.base().add(at), n) };
        }
        if !wait_committed(&s) {
            return;
        }
        // SAFETY: the mapping is `len` bytes and nobody writes it now.
        let mem = unsafe { std::slice::from_raw_parts(s.base(), len) };
        assert!(mem == &src[..]);
        // The committer holds no strong reference: dropping the segment
        // frees it.
        let weak = Arc::downgrade(&s);
        drop(s);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while weak.upgrade().is_some() {
            assert!(std::time::Instant::now() < deadline, "segment still alive");
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_committer_commits_nothing_until_its_gate_opens() {
        static OPEN: AtomicBool = AtomicBool::new(false);
        static ASKED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        fn gate() -> bool {
            ASKED.fetch_add(1, Ordering::SeqCst);
            OPEN.load(Ordering::SeqCst)
        }
        let len = 4 * MAP_CHUNK;
        let s = Segment::create_with(len, Prefault::Lazy).unwrap();
        s.commit_when(gate);
        // The gate is asked before every step: refused three times, the
        // committer has committed nothing.
        while ASKED.load(Ordering::SeqCst) < 3 {
            std::thread::yield_now();
        }
        assert!((0..4).all(|c| !s.chunk_mapped(c)));
        assert!(!s.any_resident(0, len));
        OPEN.store(true, Ordering::SeqCst);
        wait_committed(&s);
    }

    #[test]
    fn committers_wait_for_a_pause_in_store_traffic() {
        note_use();
        let t = std::time::Instant::now();
        wait_for_quiet();
        assert!(t.elapsed() >= std::time::Duration::from_nanos(QUIET_NS * 9 / 10));
        // Quiet now: no wait.
        let t = std::time::Instant::now();
        wait_for_quiet();
        assert!(t.elapsed() < std::time::Duration::from_nanos(QUIET_NS));
    }

    #[test]
    fn fresh_write_is_exact() {
        // Odd offset and length (partial first and last pages); bytes
        // around the range stay zero.
        let len = (PWRITE_MIN * 5 + 12_345) as usize;
        let s = Segment::create_with((len + (1 << 20)) as u64, Prefault::Lazy).unwrap();
        let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4099) as u8).collect();
        let off = 4096 * 3 + 17;
        assert!(s.check_range(off as u64, len as u64));
        assert!(!s.any_resident(off as u64, len as u64));
        let fresh = |at: usize, n: u64| {
            // SAFETY: `src` is readable for the lengths used below and the
            // ranges lie in the segment.
            unsafe { s.write_fresh(at as u64, src.as_ptr(), n) }
        };
        assert_eq!(fresh(0, PWRITE_MIN - 1), FreshWrite::CopyMapped);
        assert_eq!(fresh(off, len as u64), FreshWrite::Written);
        // SAFETY: the whole mapping, not written meanwhile.
        let mem = unsafe { std::slice::from_raw_parts(s.base(), s.size() as usize) };
        assert!(mem[..off].iter().all(|&b| b == 0));
        assert!(mem[off..off + len] == src[..]);
        assert!(mem[off + len..].iter().all(|&b| b == 0));
        // Now resident: left to the caller.
        assert!(s.any_resident(off as u64, len as u64));
        assert_eq!(fresh(off, len as u64), FreshWrite::CopyMapped);
    }

    #[test]
    fn fresh_run_is_exact_across_iov_max() {
        // 1100 pieces (more than one pwritev call takes) of mixed sizes,
        // laid end to end from an odd offset; bytes around the run stay zero.
        let sizes: Vec<usize> = (0..1100).map(|i| 1 + (i * 37) % 61).collect();
        let total: usize = sizes.iter().sum();
        assert!(total as u64 >= PWRITE_MIN && sizes.len() > IOV_MAX);
        let bufs: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|j| (i * 13 + j) as u8 | 1).collect())
            .collect();
        let pieces: Vec<(*const u8, u64)> =
            bufs.iter().map(|b| (b.as_ptr(), b.len() as u64)).collect();
        let s = Segment::create_with(1 << 20, Prefault::Lazy).unwrap();
        let off = 4096 + 3;
        // SAFETY: every piece is a live Vec; the run lies in the segment.
        let r = unsafe { s.write_fresh_run(off as u64, &pieces) };
        assert_eq!(r, FreshWrite::Written);
        // SAFETY: the whole mapping, not written meanwhile.
        let mem = unsafe { std::slice::from_raw_parts(s.base(), s.size() as usize) };
        assert_eq!(&mem[off..off + total], &bufs.concat()[..]);
        assert!(mem[..off].iter().all(|&b| b == 0));
        assert!(mem[off + total..].iter().all(|&b| b == 0));
        // Now resident (and mapped): left to the caller, nothing written.
        // SAFETY: as above.
        let r = unsafe { s.write_fresh_run(off as u64, &pieces) };
        assert_eq!(r, FreshWrite::CopyMapped);
        assert_eq!(read_faults(&s, off, total), 0);
        // A run below PWRITE_MIN is left to the caller too.
        let small = Segment::create_with(1 << 20, Prefault::Lazy).unwrap();
        // SAFETY: as above.
        let r = unsafe { small.write_fresh_run(0, &pieces[..3]) };
        assert_eq!(r, FreshWrite::CopyMapped);
        assert!(!small.any_resident(0, 4096));
    }

    #[test]
    fn one_pwriter_at_a_time() {
        let len = (PWRITE_MIN * 4) as usize;
        let s = Segment::create_with(1 << 20, Prefault::Lazy).unwrap();
        let src = vec![3u8; len];
        // Another worker's pwritev in flight: a fresh run is left to the
        // caller as CopyFresh, and nothing is written.
        s.pwriter.store(true, Ordering::Relaxed);
        // SAFETY: `src` is readable and the range lies in the segment.
        let r = unsafe { s.write_fresh(0, src.as_ptr(), len as u64) };
        assert_eq!(r, FreshWrite::CopyFresh);
        assert!(!s.any_resident(0, len as u64));
        // Released: the same run is written, and the flag is free again.
        s.pwriter.store(false, Ordering::Relaxed);
        // SAFETY: as above.
        let r = unsafe { s.write_fresh(0, src.as_ptr(), len as u64) };
        assert_eq!(r, FreshWrite::Written);
        assert!(!s.pwriter.load(Ordering::Relaxed));
        // SAFETY: written above, nobody writes it now.
        let mem = unsafe { std::slice::from_raw_parts(s.base(), len) };
        assert!(mem.iter().all(|&b| b == 3));
    }

    #[test]
    fn parallel_fresh_runs_are_exact() {
        // Four workers fill disjoint fresh runs of one segment as the engine
        // does: pwrite when they get the flag, stores through the mapping
        // when another worker holds it. Every byte lands, whichever way.
        let run = 256 << 10;
        let runs = 64;
        let s = Segment::create_with((run * runs) as u64, Prefault::Lazy).unwrap();
        let written = AtomicU64::new(0);
        std::thread::scope(|sc| {
            for w in 0..4usize {
                let (s, written) = (&s, &written);
                sc.spawn(move || {
                    for k in (w..runs).step_by(4) {
                        let src: Vec<u8> = (0..run).map(|i| (k * 31 + i / 4096) as u8).collect();
                        let at = (k * run) as u64;
                        // SAFETY: `src` is readable; the run lies in the segment.
                        match unsafe { s.write_fresh(at, src.as_ptr(), run as u64) } {
                            FreshWrite::Written => {
                                written.fetch_add(1, Ordering::Relaxed);
                            }
                            // SAFETY: a disjoint run of the mapping, ours alone.
                            _ => unsafe {
                                std::ptr::copy_nonoverlapping(
                                    src.as_ptr(),
                                    s.base().add(at as usize),
                                    run,
                                )
                            },
                        }
                    }
                });
            }
        });
        assert!(written.load(Ordering::Relaxed) >= 1);
        // SAFETY: the whole mapping, no writer left.
        let mem = unsafe { std::slice::from_raw_parts(s.base(), run * runs) };
        for k in 0..runs {
            let part = &mem[k * run..(k + 1) * run];
            assert!(
                part.iter()
                    .enumerate()
                    .all(|(i, &b)| b == (k * 31 + i / 4096) as u8),
                "run {k}"
            );
        }
    }

    /// Minor page faults taken by the calling thread so far.
    fn thread_faults() -> i64 {
        // SAFETY: getrusage fills the zeroed struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: RUSAGE_THREAD with a valid out pointer.
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
        u.ru_minflt
    }

    /// Read one byte of every page of `base[off..off+len]`.
    ///
    /// # Safety
    /// `base[off..off+len]` must be readable.
    unsafe fn read_pages(base: *const u8, off: usize, len: usize) {
        let mut sum = 0u64;
        for at in (off..off + len).step_by(page_size()) {
            // SAFETY: inside the readable range (the caller's contract).
            sum += u64::from(unsafe { std::ptr::read_volatile(base.add(at)) });
        }
        std::hint::black_box(sum);
    }

    /// Fault count of reading every page of `s[off..off+len]`.
    ///
    /// The reading code runs once first over memory already mapped, so
    /// that the count holds only faults on the segment's pages: the first
    /// run of a function whose code sits on a page this process has not
    /// run yet (an unoptimized build's iterator steps) faults too.
    fn read_faults(s: &Segment, off: usize, len: usize) -> i64 {
        let warm = vec![1u8; 2 * page_size()];
        // SAFETY: `warm` is a live, initialized buffer of that length.
        unsafe { read_pages(warm.as_ptr(), 0, warm.len()) };
        let f0 = thread_faults();
        // SAFETY: inside the mapping.
        unsafe { read_pages(s.base(), off, len) };
        thread_faults() - f0
    }

    #[test]
    fn fresh_write_leaves_pages_mapped() {
        let len = 1 << 20;
        let src = vec![5u8; len];
        // Control: pages filled by a bare pwrite are in memory but not
        // mapped here, so reading them faults.
        let bare = Segment::create_with(4 << 20, Prefault::Lazy).unwrap();
        let fd = bare.file.as_raw_fd();
        // SAFETY: `src` is readable for `len` bytes.
        let n = unsafe { pwrite_all(fd, src.as_ptr(), len as u64, 0) };
        assert_eq!(n, len as u64);
        assert!(read_faults(&bare, 0, len) > 0);
        // write_fresh maps what it wrote: reading it back takes no fault.
        let s = Segment::create_with(4 << 20, Prefault::Lazy).unwrap();
        // SAFETY: `src` is readable and the range lies in the segment.
        let r = unsafe { s.write_fresh(8192, src.as_ptr(), len as u64) };
        assert_eq!(r, FreshWrite::Written);
        assert_eq!(read_faults(&s, 8192, len), 0);
        // map_range maps pages another writer filled, without changing them.
        // SAFETY: `src` is readable for `len` bytes.
        let n = unsafe { pwrite_all(fd, src.as_ptr(), len as u64, 2 << 20) };
        assert_eq!(n, len as u64);
        bare.map_range(2 << 20, len as u64);
        assert_eq!(read_faults(&bare, 2 << 20, len), 0);
        // SAFETY: the range was written above and nobody writes it now.
        let mem = unsafe { std::slice::from_raw_parts(bare.base().add(2 << 20), len) };
        assert!(mem.iter().all(|&b| b == 5));
        // An empty range and one running past the end are harmless.
        bare.map_range(0, 0);
        bare.map_range(bare.size() - 1, 4096);
    }

    #[test]
    fn map_range_records_whole_chunks_only() {
        let c = MAP_CHUNK;
        let s = Segment::create_with(8 * c + 4096, Prefault::Lazy).unwrap();
        // A range from the middle of chunk 1 to the middle of chunk 4
        // covers chunks 2 and 3 whole.
        s.map_range(c + c / 2, 3 * c);
        let marked: Vec<bool> = (0..9).map(|k| s.chunk_mapped(k)).collect();
        assert_eq!(
            marked,
            [false, false, true, true, false, false, false, false, false]
        );
        // Every page of the range is mapped, recorded or not.
        assert_eq!(read_faults(&s, (c + c / 2) as usize, (3 * c) as usize), 0);
        // The short last chunk counts as whole when the range reaches the end.
        s.map_range(8 * c, 4096);
        assert!(s.chunk_mapped(8));
        // A recorded chunk whose pages were refilled by another writer
        // (pwrite through the memfd) still reads the new bytes.
        let src = vec![9u8; c as usize];
        // SAFETY: `src` is readable for `c` bytes.
        let n = unsafe { pwrite_all(s.file.as_raw_fd(), src.as_ptr(), c, 2 * c) };
        assert_eq!(n, c);
        s.map_range(2 * c, c);
        // SAFETY: the chunk was written above and nobody writes it now.
        let mem = unsafe { std::slice::from_raw_parts(s.base().add(2 * c as usize), c as usize) };
        assert!(mem.iter().all(|&b| b == 9));
        // A prefaulted segment starts with every chunk recorded.
        let p = Segment::create_with(3 * c, Prefault::Setup).unwrap();
        assert!((0..3).all(|k| p.chunk_mapped(k)));
    }
}
