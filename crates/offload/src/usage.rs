//! Disk usage of a directory as allocated on disk.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Bytes allocated on disk to the files directly in `dir` (`st_blocks` x
/// 512, what `du` counts: block rounding included, sparse holes not).
pub fn disk_usage(dir: &Path) -> std::io::Result<u64> {
    let mut total = 0u64;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        match e.metadata() {
            Ok(m) => total = total.saturating_add(m.blocks().saturating_mul(512)),
            // Deleted between the listing and the stat.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(err),
        }
    }
    Ok(total)
}

/// Size of the file system holding `dir`, in bytes.
pub(crate) fn fs_size(dir: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    Some((s.blocks() as u64).saturating_mul(s.fragment_size() as u64))
}
