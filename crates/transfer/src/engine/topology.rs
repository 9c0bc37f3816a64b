//! The local topology in upstream's shape: one entry per memory location
//! (`cpu:N` for each NUMA node), each the pair `[preferred devices, other
//! devices]` of RDMA devices a transfer from that memory would use. This
//! engine moves data by cross-process copies and TCP and opens no RDMA
//! device, so both lists are empty: what upstream reports on a host without
//! a usable RDMA device.
//!
//! `MC_CUSTOM_TOPO_JSON` names a topology file (upstream's format): its
//! memory locations replace the discovered ones and its device lists keep
//! only devices this engine drives (none). A file that cannot be read or
//! parsed is ignored (discovery, as upstream).

use std::collections::BTreeMap;

/// The environment variable naming a custom topology file.
pub const CUSTOM_TOPO_ENV: &str = "MC_CUSTOM_TOPO_JSON";

/// Memory location -> (preferred devices, other devices).
pub type Topology = BTreeMap<String, (Vec<String>, Vec<String>)>;

/// The NUMA nodes of this host (`/sys/devices/system/node/nodeN`); node 0
/// when none is listed.
pub fn numa_nodes() -> Vec<u32> {
    let mut nodes: Vec<u32> = std::fs::read_dir("/sys/devices/system/node")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_prefix("node"))
                        .and_then(|n| n.parse().ok())
                })
                .collect()
        })
        .unwrap_or_default();
    nodes.sort_unstable();
    if nodes.is_empty() {
        nodes.push(0);
    }
    nodes
}

/// The devices a transfer can use: none (no RDMA device is opened).
fn usable(device: &str) -> bool {
    let _ = device;
    false
}

/// The device names of upstream's comma-separated filter (empty: all).
pub fn device_filter(device_name: &str) -> Vec<&str> {
    device_name
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect()
}

/// The discovered topology: `cpu:N` per NUMA node, no devices. `filter`
/// (upstream's device-name filter) can only narrow the device lists.
pub fn discover(filter: &[&str]) -> Topology {
    let _ = filter;
    numa_nodes()
        .into_iter()
        .map(|n| (format!("cpu:{n}"), (Vec::new(), Vec::new())))
        .collect()
}

/// A custom topology from upstream's JSON text, keeping only devices this
/// engine drives; `None` when the text is not such a topology.
pub fn parse_custom(text: &str) -> Option<Topology> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    let mut topo = Topology::new();
    for (location, entry) in value.as_object()? {
        let lists = entry.as_array()?;
        let list = |i: usize| -> Option<Vec<String>> {
            let names = match lists.get(i) {
                Some(v) => v.as_array()?,
                None => return Some(Vec::new()),
            };
            Some(
                names
                    .iter()
                    .filter_map(|n| n.as_str())
                    .filter(|n| usable(n))
                    .map(str::to_string)
                    .collect(),
            )
        };
        topo.insert(location.clone(), (list(0)?, list(1)?));
    }
    Some(topo)
}

/// The topology this engine reports: the custom one from
/// `MC_CUSTOM_TOPO_JSON` when that names a readable topology file, else the
/// discovered one, narrowed to the devices of `device_name`
/// (comma-separated; empty: all).
pub fn local(device_name: &str) -> Topology {
    std::env::var(CUSTOM_TOPO_ENV)
        .ok()
        .filter(|p| !p.trim().is_empty())
        .and_then(|p| std::fs::read_to_string(p.trim()).ok())
        .and_then(|text| parse_custom(&text))
        .unwrap_or_else(|| discover(&device_filter(device_name)))
}

/// `topo` as upstream prints it (jsoncpp's styled writer: tab indents,
/// `"key" : ` then the value on the next line, a trailing newline).
pub fn to_styled_json(topo: &Topology) -> String {
    fn list(names: &[String]) -> String {
        if names.is_empty() {
            return "[]".to_string();
        }
        let quoted: Vec<String> = names
            .iter()
            .map(|n| serde_json::Value::String(n.clone()).to_string())
            .collect();
        format!("[ {} ]", quoted.join(", "))
    }
    if topo.is_empty() {
        return "{}\n".to_string();
    }
    let entries: Vec<String> = topo
        .iter()
        .map(|(location, (preferred, other))| {
            format!(
                "\t{} : \n\t[\n\t\t{},\n\t\t{}\n\t]",
                serde_json::Value::String(location.clone()),
                list(preferred),
                list(other)
            )
        })
        .collect();
    format!("{{\n{}\n}}\n", entries.join(",\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn styled_like_upstream() {
        let topo = discover(&device_filter("mlx5_0, mlx5_1"));
        assert!(topo.contains_key("cpu:0"));
        assert_eq!(device_filter(" a,,b "), vec!["a", "b"]);
        let one: Topology = [("cpu:0".to_string(), (vec![], vec![]))].into();
        assert_eq!(
            to_styled_json(&one),
            "{\n\t\"cpu:0\" : \n\t[\n\t\t[],\n\t\t[]\n\t]\n}\n"
        );
        let two: Topology = [
            ("cuda:0".to_string(), (vec![], vec![])),
            ("cpu:0".to_string(), (vec!["a".to_string()], vec![])),
        ]
        .into();
        let text = to_styled_json(&two);
        assert!(
            text.starts_with("{\n\t\"cpu:0\" : \n\t[\n\t\t[ \"a\" ],\n\t\t[]\n\t],\n\t\"cuda:0\"")
        );
        let back: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        assert_eq!(back["cpu:0"][0][0], "a");
    }

    #[test]
    fn custom_topology_keeps_locations_and_drops_unusable_devices() {
        let t = parse_custom(r#"{"cpu:0": [["mlx5_0"], ["mlx5_1"]], "cuda:0": [["mlx5_1"], []]}"#)
            .expect("parsed");
        assert_eq!(t.len(), 2);
        assert_eq!(t["cuda:0"], (vec![], vec![]));
        assert_eq!(parse_custom("not json"), None);
        assert_eq!(parse_custom("[1, 2]"), None);
        assert_eq!(parse_custom(r#"{"cpu:0": 3}"#), None);
    }
}
