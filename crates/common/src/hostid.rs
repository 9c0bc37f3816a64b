//! Identity of the host a process runs on, used to decide whether two
//! processes can share memory (same kernel boot and same hostname).

use sha2::{Digest, Sha256};

/// SHA-256 (hex) of `/proc/sys/kernel/random/boot_id` plus the hostname.
pub fn host_id() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut h = Sha256::new();
    h.update(boot.trim().as_bytes());
    h.update(b"/");
    h.update(host.trim().as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}
