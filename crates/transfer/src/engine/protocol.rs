//! Which transport a requested protocol name runs on in this build.
//!
//! Upstream installs one transport per protocol name (`rdma`, `efa`,
//! `barex`, ...), each of which needs its devices. This build moves data by
//! cross-process copies on one host and TCP between hosts, whatever was
//! asked: a device protocol falls back to TCP and says so once in the log,
//! naming the protocol asked for and the one used. With `MC_FORCE_TCP` set
//! the fallback is what the user asked for, and nothing is said.
//!
//! The store refuses a name no upstream transport has (a typo must not run
//! silently); the engine takes any name, as before.

use std::path::Path;

/// The protocol every fallback runs on.
pub const TCP: &str = "tcp";

/// The protocol names upstream's store installs a transport for (`barex`
/// through its auto-discovery). All of them except `tcp` need devices this
/// build does not drive.
pub const STORE_PROTOCOLS: [&str; 11] = [
    "tcp",
    "rdma",
    "efa",
    "cxi",
    "barex",
    "ub",
    "ascend",
    "ubshmem",
    "sunrise_link",
    "cxl",
    "nvlink_intra",
];

/// Where the kernel lists RDMA devices.
const RDMA_SYSFS: &str = "/sys/class/infiniband";

/// How a requested protocol is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// `tcp` asked, or any name with `MC_FORCE_TCP`: nothing to say.
    Tcp,
    /// A device protocol asked for: TCP runs instead, with this warning.
    Fallback {
        /// The protocol asked for.
        asked: String,
        /// The one line to log once.
        warning: String,
    },
}

/// The RDMA devices the kernel lists (`/sys/class/infiniband/*`), sorted.
pub fn rdma_devices() -> Vec<String> {
    rdma_devices_in(Path::new(RDMA_SYSFS))
}

fn rdma_devices_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Whether upstream's store knows `protocol` (see [`STORE_PROTOCOLS`]).
pub fn is_store_protocol(protocol: &str) -> bool {
    STORE_PROTOCOLS.contains(&protocol)
}

/// How `asked` runs, given whether TCP was forced and the RDMA devices
/// this host has (see [`rdma_devices`]). `who` names the component for the
/// log line ("store", "transfer engine").
pub fn choose(who: &str, asked: &str, force_tcp: bool, devices: &[String]) -> Choice {
    if asked == TCP || force_tcp {
        return Choice::Tcp;
    }
    let warning = if devices.is_empty() {
        format!(
            "{who}: protocol {asked:?} asked for, but no device for it was found on this host \
             (no RDMA devices found); using \"tcp\" instead"
        )
    } else {
        format!(
            "{who}: protocol {asked:?} asked for; this host has RDMA devices ({}), but this build \
             moves data over \"tcp\" only (and cross-process copies on one host); using \"tcp\"",
            devices.join(", ")
        )
    };
    Choice::Fallback {
        asked: asked.to_string(),
        warning,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_and_forced_tcp_say_nothing() {
        assert_eq!(choose("store", "tcp", false, &[]), Choice::Tcp);
        assert_eq!(choose("store", "rdma", true, &[]), Choice::Tcp);
        assert_eq!(
            choose("store", "rdma", true, &["mlx5_0".into()]),
            Choice::Tcp
        );
    }

    #[test]
    fn device_protocols_fall_back_naming_both_protocols() {
        for p in ["rdma", "efa", "barex", "cxi"] {
            let Choice::Fallback { asked, warning } = choose("store", p, false, &[]) else {
                panic!("{p} must fall back");
            };
            assert_eq!(asked, p);
            assert!(warning.contains(&format!("{p:?}")), "{warning}");
            assert!(warning.contains("\"tcp\""), "{warning}");
            assert!(warning.contains("no RDMA devices found"), "{warning}");
        }
    }

    #[test]
    fn a_host_with_devices_is_told_this_build_uses_tcp() {
        let devs = vec!["mlx5_0".to_string(), "mlx5_1".to_string()];
        let Choice::Fallback { warning, .. } = choose("store", "rdma", false, &devs) else {
            panic!("rdma must fall back");
        };
        assert!(warning.contains("mlx5_0, mlx5_1"), "{warning}");
        assert!(
            warning.contains("this build moves data over \"tcp\""),
            "{warning}"
        );
    }

    #[test]
    fn store_protocols_are_upstreams() {
        for p in ["tcp", "rdma", "efa", "barex", "nvlink_intra"] {
            assert!(is_store_protocol(p), "{p}");
        }
        for p in ["", "RDMA", "rdma ", "udp", "nvlink"] {
            assert!(!is_store_protocol(p), "{p:?}");
        }
    }

    #[test]
    fn devices_are_listed_from_sysfs() {
        let dir = std::env::temp_dir().join(format!("mc-ib-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("mlx5_1")).expect("mkdir");
        std::fs::create_dir_all(dir.join("mlx5_0")).expect("mkdir");
        assert_eq!(rdma_devices_in(&dir), vec!["mlx5_0", "mlx5_1"]);
        std::fs::remove_dir_all(&dir).expect("rmdir");
        assert!(rdma_devices_in(&dir).is_empty());
    }
}
