//! What a client is configured with, and the rules for it, in one place
//! (the Python binding only converts argument types):
//!
//! * [`ClientConfig`]: the arguments of `setup`.
//!   [`ClientConfig::from_entries`] reads the `setup(config: dict)` form
//!   (every value a string; sizes human-readable; 16 MiB size defaults;
//!   unknown keys are noted and ignored), and [`ClientConfig::check`] makes
//!   the checks `setup` does before it contacts the master, in upstream's
//!   order: a custom transfer engine (-600), `MOONCAKE_OFFLOAD_*` settings
//!   that do not parse when SSD offload is on (-600), a `tenant_id` no
//!   tenant may have (-600), an empty `local_hostname` or a bad port
//!   (-600), a segment below 1024 bytes or above what a client can map
//!   ([`MAX_SEGMENT_SIZE`], 2^47 bytes: the master refuses larger mounts
//!   too, but the client must not try to map one first) or a local buffer
//!   outside [1024, 1 TiB] (-600), a protocol upstream's store does not
//!   know unless `MC_FORCE_TCP=1`, a metadata server whose scheme is
//!   neither `http://` nor `etcd://` (both -600 when `local_hostname`
//!   names a port, else -1, as upstream). A device protocol (`rdma`,
//!   `efa`, `barex`, ...) runs over TCP, with a warning naming both.
//! * [`ReplicateConfig`]: the replication, placement and pinning options of
//!   a write, turned into the wire [`WriteConfig`] by
//!   [`ReplicateConfig::write_config`], which rejects what upstream
//!   rejects with -600.

use crate::error::{Error, Result};
use mooncake_common::proto::{SoftPin, WriteConfig, MAX_SEGMENT_SIZE};
use mooncake_common::size::{parse_bool, parse_size};
use mooncake_transfer::engine::protocol::{self, Choice};

/// The metadata server schemes a client publishes to (besides
/// `P2PHANDSHAKE`, and a bare `host:port`, which means etcd).
const METADATA_SCHEMES: [&str; 2] = ["http", "etcd"];

/// The tenant a client has unless it names another (an empty `tenant_id`
/// means it too).
pub const DEFAULT_TENANT: &str = "default";
/// `global_segment_size` and `local_buffer_size` of the dict form when absent.
pub const DEFAULT_DICT_SIZE: u64 = 16 << 20;
/// `master_server_addr` of the dict form when absent.
pub const DEFAULT_MASTER: &str = "127.0.0.1:50051";
/// Smallest non-zero segment or local buffer.
pub const MIN_SIZE: u64 = 1024;
/// Largest local buffer (1 TiB).
pub const MAX_LOCAL_BUFFER: u64 = 1 << 40;
/// `client_http_port` default (upstream's).
pub const DEFAULT_CLIENT_HTTP_PORT: u64 = 9300;

/// Keys the dict form of `setup` understands.
const DICT_KEYS: [&str; 13] = [
    "local_hostname",
    "metadata_server",
    "global_segment_size",
    "local_buffer_size",
    "protocol",
    "rdma_devices",
    "master_server_addr",
    "ipc_socket_path",
    "enable_ssd_offload",
    "ssd_offload_path",
    "tenant_id",
    "enable_client_http_server",
    "client_http_port",
];

/// The arguments of `setup`, whichever form they came in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// `host` or `host:port`; without a port one is picked from
    /// `MC_STORE_CLIENT_MIN_PORT..=MC_STORE_CLIENT_MAX_PORT`.
    pub local_hostname: String,
    /// `http://h:p/path`, `etcd://h1:p;h2:p` (or a bare `host:port`, which
    /// means etcd) or `P2PHANDSHAKE`.
    pub metadata_server: String,
    /// Bytes this client lends to the pool (0: a pure client).
    pub global_segment_size: u64,
    /// Staging space for `put`/`get` (0: no staged calls).
    pub local_buffer_size: u64,
    /// One of upstream's store protocols (`mooncake_transfer::engine::protocol`):
    /// `tcp`, or a device protocol (`rdma`, `efa`, ...), which runs over
    /// TCP with one warning. Any value with `MC_FORCE_TCP=1`.
    pub protocol: String,
    /// RDMA device names; named in the TCP fallback's warning only (this
    /// build drives no RDMA device).
    pub rdma_devices: String,
    /// `host:port` of the master's RPC service.
    pub master_server_addr: String,
    /// A caller-supplied object that is not a `mooncake.engine` transfer
    /// engine was passed as `engine`: not supported (-600).
    pub custom_engine: bool,
    /// The transfer engine (`TransferEngine.get_engine()`) the store shares:
    /// its registered memory becomes the store's, the protocol is the
    /// engine's, and the segment takes `local_hostname` as its name (the
    /// engine's `host:rpc_port`, as SGLang passes it) while its data server
    /// binds a free port of that host.
    pub engine: Option<SharedEngine>,
    /// SSD offload: objects evicted from this client's segment move to its
    /// disk tier (when the master offloads), and are read back from there.
    pub enable_ssd_offload: bool,
    /// The disk tier's directory; empty = `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`
    /// (default `/data/file_storage`). It must exist and be writable.
    pub ssd_offload_path: String,
    /// Serve this client's disk tier to other processes' reads (the
    /// standalone daemon's `--start_offload_rpc_server`; true otherwise).
    pub serve_disk_reads: bool,
    /// The tenant whose namespace and quota the client's objects use on a
    /// master with `--enable_multi_tenants` (see the master's `tenants`).
    pub tenant_id: String,
    /// Serve `/health`, `/metrics` and `/metrics/summary` over HTTP on
    /// `client_http_port` (see the client's `http_server` module).
    pub enable_client_http_server: bool,
    /// Port of the client HTTP server (1-65535 when it is enabled).
    pub client_http_port: u64,
}

/// Local buffer of the deprecated `init_all` entry point (upstream's 1 GiB).
const INIT_ALL_LOCAL_BUFFER: u64 = 1 << 30;

impl ClientConfig {
    /// What the deprecated `init_all(protocol, device_name,
    /// mount_segment_size)` sets up (upstream's fixed arguments):
    /// `localhost:12345`, the metadata server `127.0.0.1:2379`, a segment of
    /// `mount_segment_size` bytes, a 1 GiB local buffer, and the default
    /// master. That metadata server is etcd's address: setup fails unless an
    /// etcd answers there, as upstream's does.
    pub fn init_all(protocol: &str, device_name: &str, mount_segment_size: u64) -> ClientConfig {
        ClientConfig {
            local_hostname: "localhost:12345".into(),
            metadata_server: "127.0.0.1:2379".into(),
            global_segment_size: mount_segment_size,
            local_buffer_size: INIT_ALL_LOCAL_BUFFER,
            protocol: protocol.into(),
            rdma_devices: device_name.into(),
            master_server_addr: DEFAULT_MASTER.into(),
            ..ClientConfig::default()
        }
    }

    /// A client on this host (`127.0.0.1`) that finds its peers without a
    /// metadata server (`P2PHANDSHAKE`), lends `global_segment_size` bytes
    /// and keeps a 16 MiB local buffer, against the master at `master`.
    pub fn loopback(master: &str, global_segment_size: u64) -> ClientConfig {
        ClientConfig {
            local_hostname: "127.0.0.1".into(),
            metadata_server: "P2PHANDSHAKE".into(),
            global_segment_size,
            local_buffer_size: 16 << 20,
            master_server_addr: master.into(),
            ..ClientConfig::default()
        }
    }
}

impl ClientConfig {
    /// The disk tier's settings (`ssd_offload_path` over the
    /// `MOONCAKE_OFFLOAD_*` environment); INVALID_PARAMS naming the
    /// variable that does not parse.
    pub fn tier_config(&self) -> Result<mooncake_offload::TierConfig> {
        mooncake_offload::TierConfig::from_env(&self.ssd_offload_path)
            .map_err(|e| Error::invalid(format!("SSD offload: {e}")))
    }
}

impl Default for ClientConfig {
    /// Upstream's defaults of the optional arguments, the dict form's for
    /// sizes, protocol and master; no host and no metadata server.
    fn default() -> Self {
        ClientConfig {
            local_hostname: String::new(),
            metadata_server: String::new(),
            global_segment_size: DEFAULT_DICT_SIZE,
            local_buffer_size: DEFAULT_DICT_SIZE,
            protocol: "tcp".into(),
            rdma_devices: String::new(),
            master_server_addr: DEFAULT_MASTER.into(),
            custom_engine: false,
            engine: None,
            enable_ssd_offload: false,
            ssd_offload_path: String::new(),
            serve_disk_reads: true,
            tenant_id: DEFAULT_TENANT.into(),
            enable_client_http_server: false,
            client_http_port: DEFAULT_CLIENT_HTTP_PORT,
        }
    }
}

/// A `mooncake.engine` transfer engine shared with a store (compared by
/// identity).
#[derive(Clone)]
pub struct SharedEngine(pub std::sync::Arc<mooncake_transfer::engine::TransferEngine>);

impl std::fmt::Debug for SharedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedEngine")
    }
}

impl PartialEq for SharedEngine {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedEngine {}

/// Whether `MC_FORCE_TCP` asks for TCP whatever the protocol: its value,
/// trimmed, is `1` (README, "Environment knobs").
pub fn force_tcp() -> bool {
    force_tcp_value(std::env::var("MC_FORCE_TCP").ok().as_deref())
}

fn force_tcp_value(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.trim() == "1")
}

impl ClientConfig {
    /// The `setup(config: dict)` form: `entries` are the dict's items, each
    /// converted with `str()`. Absent sizes are 16 MiB, the protocol `tcp`,
    /// the master `127.0.0.1:50051`; sizes take human-readable values
    /// (`"16 MB"`), booleans `true/false/1/0/yes/no/on/off`. Unknown keys
    /// are ignored with a line pushed onto `notes` for the caller to log.
    /// A missing or empty `local_hostname`/`metadata_server`, or a value
    /// that does not parse, is INVALID_PARAMS.
    pub fn from_entries(entries: &[(String, String)], notes: &mut Vec<String>) -> Result<Self> {
        for (key, _) in entries {
            if !DICT_KEYS.contains(&key.as_str()) {
                notes.push(format!("ignoring unknown config key {key:?}"));
            }
        }
        let get = |name: &str| {
            entries
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let required = |name: &str| match get(name) {
            Some(v) if !v.is_empty() => Ok(v.to_string()),
            _ => Err(Error::invalid(format!("config key '{name}' is required"))),
        };
        let size = |name: &str| match get(name) {
            None => Ok(DEFAULT_DICT_SIZE),
            Some(v) => {
                parse_size(v).ok_or_else(|| Error::invalid(format!("{name}: invalid size {v:?}")))
            }
        };
        let flag = |name: &str| match get(name) {
            None => Ok(false),
            Some(v) => parse_bool(v)
                .ok_or_else(|| Error::invalid(format!("{name}: invalid boolean {v:?}"))),
        };
        let text = |name: &str, default: &str| get(name).unwrap_or(default).to_string();
        let client_http_port = match get("client_http_port") {
            None => DEFAULT_CLIENT_HTTP_PORT,
            Some(v) => v
                .trim()
                .parse::<u16>()
                .map(u64::from)
                .map_err(|_| Error::invalid(format!("client_http_port: invalid port {v:?}")))?,
        };
        Ok(ClientConfig {
            local_hostname: required("local_hostname")?,
            metadata_server: required("metadata_server")?,
            global_segment_size: size("global_segment_size")?,
            local_buffer_size: size("local_buffer_size")?,
            protocol: text("protocol", "tcp"),
            rdma_devices: text("rdma_devices", ""),
            master_server_addr: text("master_server_addr", DEFAULT_MASTER),
            custom_engine: false,
            engine: None,
            enable_ssd_offload: flag("enable_ssd_offload")?,
            ssd_offload_path: text("ssd_offload_path", ""),
            serve_disk_reads: true,
            tenant_id: text("tenant_id", DEFAULT_TENANT),
            enable_client_http_server: flag("enable_client_http_server")?,
            client_http_port,
        })
    }

    /// The checks `setup` makes before contacting the master, in order
    /// (see the module doc). Settings that are accepted but ignored push a
    /// line onto `notes` for the caller to log as a warning.
    pub fn check(&self, notes: &mut Vec<String>) -> Result<()> {
        self.check_with(force_tcp(), notes)
    }

    /// [`ClientConfig::check`] with `MC_FORCE_TCP` given.
    pub(crate) fn check_with(&self, force_tcp: bool, notes: &mut Vec<String>) -> Result<()> {
        if self.custom_engine {
            return Err(Error::invalid(
                "engine must be None or a mooncake.engine transfer engine (TransferEngine.get_engine())",
            ));
        }
        if let Some(e) = &self.engine {
            if !e.0.is_initialized() {
                return Err(Error::invalid(
                    "the transfer engine given to setup is not initialized: call its initialize() first",
                ));
            }
        }
        if self.enable_ssd_offload {
            self.tier_config()?;
        }
        if !mooncake_common::proto::valid_tenant(&self.tenant_id) && !self.tenant_id.is_empty() {
            return Err(Error::invalid(format!(
                "tenant_id {:?} is not a tenant name (not empty, no leading '_', no control \
                 characters)",
                self.tenant_id
            )));
        }
        if self.enable_client_http_server
            && !(1..=u64::from(u16::MAX)).contains(&self.client_http_port)
        {
            return Err(Error::invalid(format!(
                "client_http_port {} is not a port (1-65535)",
                self.client_http_port
            )));
        }
        self.host_and_port()?;
        let gs = self.global_segment_size;
        if gs != 0 && gs < MIN_SIZE {
            return Err(Error::invalid(format!(
                "global_segment_size {gs} is below {MIN_SIZE}"
            )));
        }
        if gs > MAX_SEGMENT_SIZE {
            return Err(Error::invalid(format!(
                "global_segment_size {gs} is above {MAX_SEGMENT_SIZE}, the most a client can map"
            )));
        }
        let lb = self.local_buffer_size;
        if lb != 0 && !(MIN_SIZE..=MAX_LOCAL_BUFFER).contains(&lb) {
            return Err(Error::invalid(format!(
                "local_buffer_size {lb} is outside [1024, 1 TiB]"
            )));
        }
        if !force_tcp && self.engine.is_none() {
            if !protocol::is_store_protocol(&self.protocol) {
                return Err(self.create_failure(format!(
                    "protocol {:?} is not a transport upstream's store knows (one of {})",
                    self.protocol,
                    protocol::STORE_PROTOCOLS.join(", ")
                )));
            }
            let devices = protocol::rdma_devices();
            if let Choice::Fallback { warning, .. } =
                protocol::choose("store", &self.protocol, force_tcp, &devices)
            {
                if self.rdma_devices.is_empty() {
                    notes.push(warning);
                } else {
                    notes.push(format!(
                        "{warning} (rdma_devices {:?} not opened)",
                        self.rdma_devices
                    ));
                }
            }
        }
        let md = self.metadata_server.as_str();
        if let Some((scheme, _)) = md.split_once("://") {
            if !METADATA_SCHEMES.contains(&scheme) {
                return Err(self.create_failure(format!(
                    "metadata server {md:?}: the {scheme:?} backend is not supported \
                     (use P2PHANDSHAKE, http://host:port/path, etcd://host:port or a bare host:port for etcd)"
                )));
            }
        }
        Ok(())
    }

    /// The code upstream's `setup` returns when its client cannot be
    /// created (an unknown protocol or metadata backend): INVALID_PARAMS
    /// when `local_hostname` names its port, else INTERNAL_ERROR (the
    /// automatic port search gives up with that code).
    fn create_failure(&self, reason: String) -> Error {
        match self.host_and_port() {
            Ok((_, Some(_))) => Error::invalid(reason),
            _ => Error::internal(reason),
        }
    }

    /// `local_hostname` split into host and optional port; an empty host or
    /// a port that is not a `u16` is INVALID_PARAMS.
    pub(crate) fn host_and_port(&self) -> Result<(String, Option<u16>)> {
        let name = self.local_hostname.as_str();
        let (host, port) = match name.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() => match p.parse::<u16>() {
                Ok(p) => (h, Some(p)),
                Err(_) => {
                    return Err(Error::invalid(format!(
                        "local_hostname {name:?} has an invalid port"
                    )))
                }
            },
            _ => (name, None),
        };
        if host.is_empty() {
            return Err(Error::invalid("local_hostname is empty"));
        }
        Ok((host.to_string(), port))
    }
}

/// What kind of write a [`ReplicateConfig`] is turned into a
/// [`WriteConfig`] for; the rules differ per kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    /// Byte and from-buffer writes (`put*`, `upsert*`, `*_from`, Engram
    /// `populate`): `prefer_alloc_in_same_node` is rejected (upstream).
    Bytes,
    /// Tensor writes: `prefer_alloc_in_same_node` is a
    /// placement hint, the writer's own segment first.
    Tensor,
    /// Multi-buffer writes (`batch_put_from_multi_buffers`):
    /// `prefer_alloc_in_same_node` is a placement hint, the writer's own
    /// segment first, and needs `replica_num` 1 (upstream).
    MultiBuffers,
}

/// Replication, placement and pinning options of a write (upstream's
/// `ReplicateConfig`; defaults are upstream's).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplicateConfig {
    /// Replicas on distinct segments; 0 is rejected.
    pub replica_num: u64,
    /// Soft-pin action.
    pub soft_pin: SoftPin,
    /// Soft-pin TTL; only valid with [`SoftPin::Enable`] (the master checks the maximum).
    pub soft_pin_ttl_ms: Option<u64>,
    /// Never evicted.
    pub with_hard_pin: bool,
    /// Segment names tried first, in order.
    pub preferred_segments: Vec<String>,
    /// Deprecated single preference: when non-empty it replaces `preferred_segments`.
    pub preferred_segment: String,
    /// Rejected for byte writes (upstream).
    pub prefer_alloc_in_same_node: bool,
    /// The group of each key written (empty: none), in key order; its
    /// length must match the keys written. See the master's `groups`.
    pub group_ids: Option<Vec<String>>,
    /// Upstream `ObjectDataType` value, recorded per object.
    pub data_type: u32,
    /// NVMe-oF replicas: this build has none, so non-zero is rejected
    /// (INVALID_PARAMS).
    pub nof_replica_num: u64,
    /// Replicas on a shared distributed file system: this build has none,
    /// so non-zero is rejected (INVALID_PARAMS).
    pub dfs_replica_num: u64,
    /// Where NVMe-oF replicas go; as upstream, it acts only on NVMe-oF
    /// replicas, which `nof_replica_num` cannot ask for here.
    pub preferred_nof_segments: Vec<String>,
}

impl Default for ReplicateConfig {
    fn default() -> Self {
        ReplicateConfig {
            replica_num: 1,
            soft_pin: SoftPin::Preserve,
            soft_pin_ttl_ms: None,
            with_hard_pin: false,
            preferred_segments: Vec::new(),
            preferred_segment: String::new(),
            prefer_alloc_in_same_node: false,
            group_ids: None,
            data_type: 0,
            nof_replica_num: 0,
            dfs_replica_num: 0,
            preferred_nof_segments: Vec::new(),
        }
    }
}

impl ReplicateConfig {
    /// The wire config of a `kind` write of `keys`, or the
    /// INVALID_PARAMS upstream gives: `replica_num` 0, nof/dfs replicas, a
    /// soft-pin TTL without `SoftPin::Enable`, `prefer_alloc_in_same_node`
    /// on a byte write (or on a multi-buffer write with more than one
    /// replica), `group_ids` whose length is not that of `keys`. A
    /// non-empty `preferred_segment` replaces `preferred_segments`.
    pub fn write_config<K: AsRef<str>>(&self, kind: WriteKind, keys: &[K]) -> Result<WriteConfig> {
        let n_keys = keys.len();
        if self.replica_num == 0 {
            return Err(Error::invalid("replica_num is 0"));
        }
        let replica_num = u32::try_from(self.replica_num)
            .map_err(|_| Error::invalid("replica_num is too large"))?;
        if self.nof_replica_num != 0 || self.dfs_replica_num != 0 {
            return Err(Error::invalid("nof/dfs replicas are not supported"));
        }
        if self.soft_pin_ttl_ms.is_some() && self.soft_pin != SoftPin::Enable {
            return Err(Error::invalid(
                "soft_pin_ttl_ms is only valid with SoftPinAction.ENABLE",
            ));
        }
        if kind == WriteKind::Bytes && self.prefer_alloc_in_same_node {
            return Err(Error::invalid(
                "prefer_alloc_in_same_node is not supported for byte writes",
            ));
        }
        if kind == WriteKind::MultiBuffers && self.prefer_alloc_in_same_node && replica_num != 1 {
            return Err(Error::invalid(
                "prefer_alloc_in_same_node needs replica_num 1",
            ));
        }
        if let Some(ids) = &self.group_ids {
            if ids.len() != n_keys {
                return Err(Error::invalid(
                    "group_ids length does not match the number of keys",
                ));
            }
        }
        let groups = match &self.group_ids {
            Some(ids) => keys
                .iter()
                .zip(ids)
                .filter(|(k, g)| !k.as_ref().is_empty() && !g.is_empty())
                .map(|(k, g)| (k.as_ref().to_string(), g.clone()))
                .collect(),
            None => Vec::new(),
        };
        let preferred_segments = if self.preferred_segment.is_empty() {
            self.preferred_segments.clone()
        } else {
            vec![self.preferred_segment.clone()]
        };
        Ok(WriteConfig {
            replica_num,
            soft_pin: self.soft_pin,
            soft_pin_ttl_ms: self.soft_pin_ttl_ms,
            hard_pin: self.with_hard_pin,
            preferred_segments,
            data_type: self.data_type,
            groups,
            ..WriteConfig::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooncake_common::ErrorCode;

    fn base() -> ClientConfig {
        ClientConfig {
            local_hostname: "127.0.0.1".into(),
            metadata_server: "P2PHANDSHAKE".into(),
            ..ClientConfig::default()
        }
    }

    fn code(cfg: &ClientConfig, force_tcp: bool) -> i32 {
        match cfg.check_with(force_tcp, &mut Vec::new()) {
            Ok(()) => 0,
            Err(e) => e.code().code(),
        }
    }

    #[test]
    fn check_order_and_codes() {
        assert_eq!(code(&base(), false), 0);
        let with = |f: &dyn Fn(&mut ClientConfig)| {
            let mut c = base();
            f(&mut c);
            c
        };
        assert_eq!(code(&with(&|c| c.custom_engine = true), false), -600);
        assert_eq!(code(&with(&|c| c.enable_ssd_offload = true), false), 0);
        assert_eq!(code(&with(&|c| c.tenant_id = "t".into()), false), 0);
        assert_eq!(code(&with(&|c| c.tenant_id = String::new()), false), 0);
        for bad in ["_t", "a\tb", "a\0b"] {
            assert_eq!(
                code(&with(&|c| c.tenant_id = bad.into()), false),
                -600,
                "{bad:?}"
            );
        }
        assert_eq!(code(&with(&|c| c.local_hostname.clear()), false), -600);
        assert_eq!(
            code(&with(&|c| c.local_hostname = "h:x".into()), false),
            -600
        );
        assert_eq!(code(&with(&|c| c.global_segment_size = 100), false), -600);
        assert_eq!(code(&with(&|c| c.global_segment_size = 0), false), 0);
        assert_eq!(
            code(&with(&|c| c.global_segment_size = MAX_SEGMENT_SIZE), false),
            0
        );
        assert_eq!(
            code(
                &with(&|c| c.global_segment_size = MAX_SEGMENT_SIZE + 1),
                false
            ),
            -600
        );
        assert_eq!(
            code(&with(&|c| c.global_segment_size = u64::MAX), false),
            -600
        );
        assert_eq!(code(&with(&|c| c.local_buffer_size = 1023), false), -600);
        assert_eq!(
            code(
                &with(&|c| c.local_buffer_size = MAX_LOCAL_BUFFER + 1),
                false
            ),
            -600
        );
        for md in ["etcd://x:2379", "x:2379", "http://x:1/metadata"] {
            assert_eq!(
                code(&with(&|c| c.metadata_server = md.into()), false),
                0,
                "{md}"
            );
        }
        assert_eq!(
            code(
                &with(&|c| c.metadata_server = "redis://x:6379".into()),
                false
            ),
            -1
        );
        let with_port = |md: &str| {
            with(&|c| {
                c.local_hostname = "127.0.0.1:17000".into();
                c.metadata_server = md.into();
            })
        };
        assert_eq!(code(&with_port("redis://x:6379"), false), -600);
        // The engine check comes before the tenant check (upstream order).
        let both = with(&|c| {
            c.custom_engine = true;
            c.tenant_id = "_t".into();
        });
        assert_eq!(code(&both, false), -600);
    }

    #[test]
    fn unknown_protocols_are_refused_unless_forced() {
        assert_eq!(code(&base(), false), 0);
        for p in ["TCP", "Tcp", "udp", " tcp", ""] {
            let c = ClientConfig {
                protocol: p.into(),
                ..base()
            };
            assert_eq!(code(&c, false), -1, "protocol {p:?}");
            let named = ClientConfig {
                local_hostname: "127.0.0.1:17000".into(),
                ..c.clone()
            };
            assert_eq!(code(&named, false), -600, "protocol {p:?} with a port");
            assert_eq!(code(&c, true), 0, "protocol {p:?} with MC_FORCE_TCP");
        }
    }

    #[test]
    fn device_protocols_run_over_tcp_with_one_warning() {
        for p in mooncake_transfer::engine::protocol::STORE_PROTOCOLS {
            let c = ClientConfig {
                protocol: p.into(),
                rdma_devices: "mlx5_0".into(),
                ..base()
            };
            let mut notes = Vec::new();
            assert!(c.check_with(false, &mut notes).is_ok(), "{p}");
            if p == "tcp" {
                assert!(notes.is_empty(), "{notes:?}");
                continue;
            }
            assert_eq!(notes.len(), 1, "{p}: {notes:?}");
            assert!(
                notes[0].contains(&format!("protocol {p:?}")),
                "{}",
                notes[0]
            );
            assert!(notes[0].contains("using \"tcp\""), "{}", notes[0]);
            assert!(notes[0].contains("mlx5_0"), "{}", notes[0]);
            let mut forced = Vec::new();
            assert!(c.check_with(true, &mut forced).is_ok(), "{p}");
            assert!(forced.is_empty(), "{p} with MC_FORCE_TCP: {forced:?}");
        }
    }

    #[test]
    fn force_tcp_value_is_trimmed() {
        assert!(force_tcp_value(Some("1")));
        assert!(force_tcp_value(Some(" 1\n")));
        assert!(!force_tcp_value(Some("0")));
        assert!(!force_tcp_value(Some("true")));
        assert!(!force_tcp_value(Some("")));
        assert!(!force_tcp_value(None));
    }

    #[test]
    fn http_server_port_is_checked() {
        let c = ClientConfig {
            enable_client_http_server: true,
            client_http_port: 9300,
            ..base()
        };
        let mut notes = Vec::new();
        assert!(c.check_with(false, &mut notes).is_ok());
        assert!(notes.is_empty(), "{notes:?}");
        for port in [0, 70000] {
            let bad = ClientConfig {
                client_http_port: port,
                ..c.clone()
            };
            assert_eq!(code(&bad, false), -600, "port {port}");
            let off = ClientConfig {
                enable_client_http_server: false,
                ..bad
            };
            assert_eq!(code(&off, false), 0, "port {port} with the server off");
        }
    }

    fn entries(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn dict_form_defaults_and_parsing() {
        let mut notes = Vec::new();
        let c = ClientConfig::from_entries(
            &entries(&[
                ("local_hostname", "h"),
                ("metadata_server", "P2PHANDSHAKE"),
                ("local_buffer_size", "16 MB"),
                ("enable_client_http_server", "on"),
                ("bogus", "1"),
            ]),
            &mut notes,
        )
        .expect("valid");
        assert_eq!(c.global_segment_size, DEFAULT_DICT_SIZE);
        assert_eq!(c.local_buffer_size, 16 << 20);
        assert_eq!(c.protocol, "tcp");
        assert_eq!(c.master_server_addr, DEFAULT_MASTER);
        assert!(c.enable_client_http_server);
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("bogus"));
    }

    #[test]
    fn dict_form_rejections() {
        let bad: [&[(&str, &str)]; 7] = [
            &[("local_hostname", "h")],
            &[("metadata_server", "P2PHANDSHAKE")],
            &[("local_hostname", ""), ("metadata_server", "P2PHANDSHAKE")],
            &[
                ("local_hostname", "h"),
                ("metadata_server", "m"),
                ("global_segment_size", "50%"),
            ],
            &[
                ("local_hostname", "h"),
                ("metadata_server", "m"),
                ("enable_ssd_offload", "maybe"),
            ],
            &[
                ("local_hostname", "h"),
                ("metadata_server", "m"),
                ("client_http_port", "x"),
            ],
            &[
                ("local_hostname", "h"),
                ("metadata_server", "m"),
                ("client_http_port", "70000"),
            ],
        ];
        for items in bad {
            let r = ClientConfig::from_entries(&entries(items), &mut Vec::new());
            assert_eq!(
                r.map(|_| ()).map_err(|e| e.code()),
                Err(ErrorCode::InvalidParams),
                "{items:?}"
            );
        }
    }

    #[test]
    fn write_config_rules() {
        let ok = ReplicateConfig::default()
            .write_config(WriteKind::Bytes, &["k"])
            .expect("default is valid");
        assert_eq!(ok.replica_num, 1);
        assert!(ok.preferred_segments.is_empty());
        let rejected = |f: &dyn Fn(&mut ReplicateConfig), n: usize| {
            let mut c = ReplicateConfig::default();
            f(&mut c);
            c.write_config(WriteKind::Bytes, &vec!["k"; n])
                .map_err(|e| e.code())
        };
        let invalid = Err(ErrorCode::InvalidParams);
        assert_eq!(rejected(&|c| c.replica_num = 0, 1).map(|_| ()), invalid);
        assert_eq!(
            rejected(&|c| c.replica_num = u64::from(u32::MAX) + 1, 1).map(|_| ()),
            invalid
        );
        assert_eq!(rejected(&|c| c.nof_replica_num = 1, 1).map(|_| ()), invalid);
        assert_eq!(rejected(&|c| c.dfs_replica_num = 1, 1).map(|_| ()), invalid);
        assert_eq!(
            rejected(&|c| c.soft_pin_ttl_ms = Some(5), 1).map(|_| ()),
            invalid
        );
        assert!(rejected(
            &|c| {
                c.soft_pin = SoftPin::Enable;
                c.soft_pin_ttl_ms = Some(5);
            },
            1
        )
        .is_ok());
        assert_eq!(
            rejected(&|c| c.prefer_alloc_in_same_node = true, 1).map(|_| ()),
            invalid
        );
        assert_eq!(
            rejected(&|c| c.group_ids = Some(vec!["g".into()]), 2).map(|_| ()),
            invalid
        );
        assert!(rejected(&|c| c.group_ids = Some(vec!["g".into(), "h".into()]), 2).is_ok());
    }

    #[test]
    fn same_node_hint_of_multi_buffer_writes() {
        let multi = |replicas: u64| {
            ReplicateConfig {
                prefer_alloc_in_same_node: true,
                replica_num: replicas,
                ..ReplicateConfig::default()
            }
            .write_config(WriteKind::MultiBuffers, &["k"])
            .map(|w| w.replica_num)
            .map_err(|e| e.code())
        };
        assert_eq!(multi(1), Ok(1));
        assert_eq!(multi(2), Err(ErrorCode::InvalidParams));
        // Without the hint any replica count is fine.
        let plain = ReplicateConfig {
            replica_num: 3,
            ..ReplicateConfig::default()
        };
        assert!(plain.write_config(WriteKind::MultiBuffers, &["k"]).is_ok());
    }

    #[test]
    fn preferred_segment_replaces_the_list() {
        let c = ReplicateConfig {
            preferred_segments: vec!["b".into(), "c".into()],
            preferred_segment: "a".into(),
            ..ReplicateConfig::default()
        };
        let w = c.write_config(WriteKind::Bytes, &["k"]).expect("valid");
        assert_eq!(w.preferred_segments, vec!["a".to_string()]);
        let c = ReplicateConfig {
            preferred_segment: String::new(),
            ..c
        };
        let w = c.write_config(WriteKind::Bytes, &["k"]).expect("valid");
        assert_eq!(w.preferred_segments, vec!["b".to_string(), "c".to_string()]);
    }
}
