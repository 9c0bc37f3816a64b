//! Identity of the host a process runs on, used to decide whether two
//! processes can share memory: the same kernel boot, the same hostname and
//! the same network namespace. The namespace matters because the mapping
//! handshake uses an abstract Unix socket, which only exists inside one
//! network namespace, and because processes in different network namespaces
//! stand for different hosts (containers, the multi-host tests): they must
//! talk over the network, not be mistaken for neighbours.

use sha2::{Digest, Sha256};

/// This process's network namespace (`net:[inode]`; empty if unreadable).
pub fn net_namespace() -> String {
    std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// SHA-256 (hex) of `/proc/sys/kernel/random/boot_id`, the hostname and the
/// network namespace.
pub fn host_id() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut h = Sha256::new();
    h.update(boot.trim().as_bytes());
    h.update(b"/");
    h.update(host.trim().as_bytes());
    h.update(b"/");
    h.update(net_namespace().as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_within_a_process_and_names_the_namespace() {
        assert_eq!(host_id(), host_id());
        assert_eq!(host_id().len(), 64);
        assert!(net_namespace().starts_with("net:["), "{}", net_namespace());
    }
}
