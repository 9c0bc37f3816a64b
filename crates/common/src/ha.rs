//! Names and address forms shared by the HA masters and the clients that
//! follow them: how an etcd connection string is split into endpoints, how a
//! client's `master_server_addr` selects direct or etcd-discovered mode, and
//! the etcd keys both sides agree on. Upstream's forms are kept: the master's
//! `--ha_backend_connstring` is the backend-native `h1:2379;h2:2379`, and a
//! client names an HA cluster as `etcd://h1:2379;h2:2379`.
//!
//! Only parsing and naming live here (no etcd client), so that the master and
//! the client crates share one definition of the key layout.

use thiserror::Error;

/// Upstream's default `--cluster_id`.
pub const DEFAULT_CLUSTER_ID: &str = "mooncake_cluster";

/// Client-side variable naming the HA cluster to follow (upstream's
/// `MC_STORE_CLUSTER_ID`); it must match the masters' `--cluster_id`.
pub const CLUSTER_ID_ENV: &str = "MC_STORE_CLUSTER_ID";

/// Why an address or connection string was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HaAddrError {
    /// No endpoint in the string.
    #[error("no etcd endpoint in '{0}'")]
    Empty(String),
    /// An endpoint that is not `host:port` (optionally `http://host:port`).
    #[error("etcd endpoint '{0}' is not host:port")]
    BadEndpoint(String),
    /// `https://` endpoints need TLS, which this build does not have.
    #[error("etcd endpoint '{0}' uses TLS, which this build does not support")]
    Tls(String),
    /// A backend URI this build does not implement (`redis://`, `k8s://`).
    #[error("master address '{0}': the {1} HA backend is not supported by this build (only etcd)")]
    UnsupportedBackend(String, String),
    /// A direct master address that is not `host:port`.
    #[error("master address '{0}' is not host:port or etcd://h1:port;h2:port")]
    BadMasterAddr(String),
}

/// What a client's `master_server_addr` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MasterAddr {
    /// One master at `host:port`.
    Direct(String),
    /// Follow the leader elected among HA masters through these etcd
    /// endpoints (each `http://host:port`).
    Etcd(Vec<String>),
}

/// Split an etcd connection string (`h1:2379;h2:2379`, commas accepted too)
/// into endpoint URLs (`http://h1:2379`, …).
pub fn parse_etcd_endpoints(connstring: &str) -> Result<Vec<String>, HaAddrError> {
    let mut out = Vec::new();
    for raw in connstring.split([';', ',']) {
        let ep = raw.trim();
        if ep.is_empty() {
            continue;
        }
        if ep.starts_with("https://") {
            return Err(HaAddrError::Tls(ep.to_string()));
        }
        let hostport = ep
            .strip_prefix("http://")
            .unwrap_or(ep)
            .trim_end_matches('/');
        if !is_host_port(hostport) {
            return Err(HaAddrError::BadEndpoint(ep.to_string()));
        }
        out.push(format!("http://{hostport}"));
    }
    if out.is_empty() {
        return Err(HaAddrError::Empty(connstring.to_string()));
    }
    Ok(out)
}

/// Whether `s` is `host:port` (port 1..=65535; IPv6 hosts in brackets).
pub fn is_host_port(s: &str) -> bool {
    let Some((host, port)) = s.rsplit_once(':') else {
        return false;
    };
    let host_ok = if let Some(inner) = host.strip_prefix('[') {
        inner.ends_with(']') && inner.len() > 1
    } else {
        !host.is_empty() && !host.contains(':') && !host.contains('/')
    };
    host_ok && matches!(port.parse::<u16>(), Ok(p) if p > 0)
}

/// Interpret a client's `master_server_addr`.
pub fn parse_master_addr(addr: &str) -> Result<MasterAddr, HaAddrError> {
    let addr = addr.trim();
    if let Some((scheme, rest)) = addr.split_once("://") {
        return match scheme.to_ascii_lowercase().as_str() {
            "etcd" => Ok(MasterAddr::Etcd(parse_etcd_endpoints(rest)?)),
            other => Err(HaAddrError::UnsupportedBackend(
                addr.to_string(),
                other.to_string(),
            )),
        };
    }
    if is_host_port(addr) {
        Ok(MasterAddr::Direct(addr.to_string()))
    } else {
        Err(HaAddrError::BadMasterAddr(addr.to_string()))
    }
}

/// The etcd election name the masters of `cluster_id` campaign on; the
/// leader's value is its RPC address `host:port`.
pub fn election_name(cluster_id: &str) -> String {
    format!("mooncake-store/{cluster_id}/master_view")
}

/// Key under which a master of `cluster_id` registers its RPC address (held
/// by its lease) so that two masters cannot advertise the same address.
pub fn member_key(cluster_id: &str, rpc_addr: &str) -> String {
    format!("mooncake-store/{cluster_id}/masters/{rpc_addr}")
}

/// Key under which the leader of `cluster_id` publishes the names of its
/// mounted segments (a JSON array of strings), so that the next leader
/// knows whose remounts to wait for.
pub fn owners_key(cluster_id: &str) -> String {
    format!("mooncake-store/{cluster_id}/owners")
}

/// The cluster id a client follows: `MC_STORE_CLUSTER_ID`, else upstream's default.
pub fn client_cluster_id() -> String {
    std::env::var(CLUSTER_ID_ENV)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| DEFAULT_CLUSTER_ID.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_split_on_semicolons_and_commas() {
        assert_eq!(
            parse_etcd_endpoints("h1:2379; h2:2380,http://h3:1/").unwrap(),
            vec!["http://h1:2379", "http://h2:2380", "http://h3:1"]
        );
        assert_eq!(
            parse_etcd_endpoints("[::1]:2379").unwrap(),
            vec!["http://[::1]:2379"]
        );
    }

    #[test]
    fn bad_endpoints_are_refused_with_the_reason() {
        assert_eq!(
            parse_etcd_endpoints(" ; "),
            Err(HaAddrError::Empty(" ; ".into()))
        );
        for bad in ["h1", "h1:0", "h1:99999"] {
            assert!(
                matches!(parse_etcd_endpoints(bad), Err(HaAddrError::BadEndpoint(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_etcd_endpoints("https://h:1"),
            Err(HaAddrError::Tls(_))
        ));
    }

    #[test]
    fn master_addresses() {
        assert_eq!(
            parse_master_addr("127.0.0.1:50051"),
            Ok(MasterAddr::Direct("127.0.0.1:50051".into()))
        );
        assert_eq!(
            parse_master_addr("etcd://10.0.0.1:2379;10.0.0.2:2379"),
            Ok(MasterAddr::Etcd(vec![
                "http://10.0.0.1:2379".into(),
                "http://10.0.0.2:2379".into()
            ]))
        );
        assert!(matches!(
            parse_master_addr("redis://r:6379"),
            Err(HaAddrError::UnsupportedBackend(_, b)) if b == "redis"
        ));
        assert!(matches!(
            parse_master_addr("etcd://"),
            Err(HaAddrError::Empty(_))
        ));
        assert!(matches!(
            parse_master_addr("nohost"),
            Err(HaAddrError::BadMasterAddr(_))
        ));
    }

    #[test]
    fn key_layout() {
        assert_eq!(election_name("c"), "mooncake-store/c/master_view");
        assert_eq!(member_key("c", "h:1"), "mooncake-store/c/masters/h:1");
    }
}
