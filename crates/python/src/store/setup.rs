//! Argument handling of `setup`: the positional/keyword form and the dict
//! form, both reduced to a validated `ClientConfig` or a return code.
//!
//! Everything here runs before the master is contacted.

use super::args::{short_repr, Flag, UInt};
use super::log::{self, Level};
use mooncake_client::ClientConfig;
use mooncake_common::size::{parse_bool, parse_size};
use mooncake_common::ErrorCode;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// Parameter names of the positional form, in order (the first 7 are required).
const PARAMS: [&str; 13] = [
    "local_hostname",
    "metadata_server",
    "global_segment_size",
    "local_buffer_size",
    "protocol",
    "rdma_devices",
    "master_server_addr",
    "engine",
    "enable_ssd_offload",
    "ssd_offload_path",
    "tenant_id",
    "enable_client_http_server",
    "client_http_port",
];
const REQUIRED: usize = 7;

/// Keys understood by the dict form.
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

const DEFAULT_SIZE: u64 = 16 << 20;
const DEFAULT_MASTER: &str = "127.0.0.1:50051";
const MIN_SIZE: u64 = 1024;
const MAX_LOCAL_BUFFER: u64 = 1 << 40;

/// A setup request that failed validation: code and reason.
pub type SetupError = (i32, String);

/// All `setup` inputs, whichever form they came from.
#[derive(Debug, Clone)]
struct Request {
    local_hostname: String,
    metadata_server: String,
    global_segment_size: u64,
    local_buffer_size: u64,
    protocol: String,
    master_server_addr: String,
    engine_given: bool,
    enable_ssd_offload: bool,
    tenant_id: String,
    enable_client_http_server: bool,
}

/// Parse `setup(*args, **kwargs)`. `Err` is a `TypeError` (bad argument
/// types/arity); `Ok(Err(..))` a validation failure to return as a code.
pub fn parse(
    py: Python<'_>,
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Result<ClientConfig, SetupError>> {
    let kw_len = kwargs.map_or(0, |k| k.len());
    if args.len() == 1 && kw_len == 0 {
        let only = args.get_item(0)?;
        if let Ok(dict) = only.downcast::<PyDict>() {
            return Ok(parse_dict(py, dict).and_then(|r| validate(py, r)));
        }
    }
    if args.is_empty() && kw_len == 1 {
        if let Some(cfg) = kwargs.and_then(|k| k.get_item("config").ok().flatten()) {
            let dict = cfg.downcast::<PyDict>().map_err(|_| {
                PyTypeError::new_err(format!(
                    "setup(): config must be a dict, got {}",
                    short_repr(&cfg)
                ))
            })?;
            return Ok(parse_dict(py, dict).and_then(|r| validate(py, r)));
        }
    }
    let request = parse_positional(args, kwargs)?;
    Ok(validate(py, request))
}

fn parse_positional(
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Request> {
    if args.len() > PARAMS.len() {
        return Err(PyTypeError::new_err(format!(
            "setup() takes at most {} arguments ({} given)",
            PARAMS.len(),
            args.len()
        )));
    }
    let mut slots: Vec<Option<Bound<'_, PyAny>>> = vec![None; PARAMS.len()];
    for (i, a) in args.iter().enumerate() {
        slots[i] = Some(a);
    }
    if let Some(kwargs) = kwargs {
        for (k, v) in kwargs.iter() {
            let name: String = k.extract()?;
            let Some(i) = PARAMS.iter().position(|p| *p == name) else {
                return Err(PyTypeError::new_err(format!(
                    "setup() got an unexpected keyword argument '{name}'"
                )));
            };
            if slots[i].is_some() {
                return Err(PyTypeError::new_err(format!(
                    "setup() got multiple values for argument '{name}'"
                )));
            }
            slots[i] = Some(v);
        }
    }
    if let Some(missing) = (0..REQUIRED).find(|&i| slots[i].is_none()) {
        return Err(PyTypeError::new_err(format!(
            "setup() missing required argument: '{}'",
            PARAMS[missing]
        )));
    }
    let get = |i: usize| slots[i].as_ref();
    let text = |i: usize, default: &str| -> PyResult<String> {
        get(i).map_or(Ok(default.to_string()), |v| named(v.extract(), PARAMS[i]))
    };
    let size = |i: usize| -> PyResult<u64> {
        get(i).map_or(Ok(0), |v| {
            named(v.extract::<UInt>(), PARAMS[i]).map(|u| u.0)
        })
    };
    let flag = |i: usize| -> PyResult<bool> {
        get(i).map_or(Ok(false), |v| {
            named(v.extract::<Flag>(), PARAMS[i]).map(|f| f.0)
        })
    };
    let request = Request {
        local_hostname: text(0, "")?,
        metadata_server: text(1, "")?,
        global_segment_size: size(2)?,
        local_buffer_size: size(3)?,
        protocol: text(4, "")?,
        master_server_addr: {
            let _rdma: String = text(5, "")?;
            text(6, "")?
        },
        engine_given: get(7).is_some_and(|e| !e.is_none()),
        enable_ssd_offload: flag(8)?,
        tenant_id: {
            let _ssd_path: String = text(9, "")?;
            text(10, "default")?
        },
        enable_client_http_server: flag(11)?,
    };
    if let Some(port) = get(12) {
        named(port.extract::<UInt>(), PARAMS[12])?;
    }
    Ok(request)
}

/// Prefix an argument TypeError with the parameter name.
fn named<T>(r: PyResult<T>, name: &str) -> PyResult<T> {
    r.map_err(|e| PyTypeError::new_err(format!("setup(): argument '{name}': {e}")))
}

fn parse_dict(py: Python<'_>, dict: &Bound<'_, PyDict>) -> Result<Request, SetupError> {
    let mut values: Vec<(String, String)> = Vec::with_capacity(dict.len());
    for (k, v) in dict.iter() {
        let key = k.str().map(|s| s.to_string());
        let value = v.str().map(|s| s.to_string());
        match (key, value) {
            (Ok(key), Ok(value)) => values.push((key, value)),
            _ => {
                return Err((
                    invalid(),
                    "a config key or value cannot be converted with str()".into(),
                ))
            }
        }
    }
    for (key, _) in &values {
        if !DICT_KEYS.contains(&key.as_str()) {
            log::emit(
                py,
                Level::Warning,
                &format!("setup: ignoring unknown config key {}", log::show_key(key)),
            );
        }
    }
    let get = |name: &str| {
        values
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let required = |name: &str| match get(name) {
        Some(v) if !v.is_empty() => Ok(v.to_string()),
        _ => Err((invalid(), format!("config key '{name}' is required"))),
    };
    let size = |name: &str| match get(name) {
        None => Ok(DEFAULT_SIZE),
        Some(v) => parse_size(v).ok_or_else(|| (invalid(), format!("{name}: invalid size {v:?}"))),
    };
    let flag = |name: &str| match get(name) {
        None => Ok(false),
        Some(v) => {
            parse_bool(v).ok_or_else(|| (invalid(), format!("{name}: invalid boolean {v:?}")))
        }
    };
    if let Some(port) = get("client_http_port") {
        if port.trim().parse::<u16>().is_err() {
            return Err((
                invalid(),
                format!("client_http_port: invalid port {port:?}"),
            ));
        }
    }
    Ok(Request {
        local_hostname: required("local_hostname")?,
        metadata_server: required("metadata_server")?,
        global_segment_size: size("global_segment_size")?,
        local_buffer_size: size("local_buffer_size")?,
        protocol: get("protocol").unwrap_or("tcp").to_string(),
        master_server_addr: get("master_server_addr")
            .unwrap_or(DEFAULT_MASTER)
            .to_string(),
        engine_given: false,
        enable_ssd_offload: flag("enable_ssd_offload")?,
        tenant_id: get("tenant_id").unwrap_or("default").to_string(),
        enable_client_http_server: flag("enable_client_http_server")?,
    })
}

fn invalid() -> i32 {
    ErrorCode::InvalidParams.code()
}

/// The checks of spec §2.3 that need no master, in a fixed order.
fn validate(py: Python<'_>, r: Request) -> Result<ClientConfig, SetupError> {
    let internal = ErrorCode::InternalError.code();
    if r.engine_given {
        return Err((
            invalid(),
            "a custom transfer engine is not supported".into(),
        ));
    }
    if r.enable_ssd_offload {
        return Err((
            ErrorCode::NotSupported.code(),
            "SSD offload is not supported".into(),
        ));
    }
    if r.tenant_id != "default" {
        return Err((
            ErrorCode::NotSupported.code(),
            "tenants are not supported".into(),
        ));
    }
    if r.enable_client_http_server {
        log::emit(
            py,
            Level::Warning,
            "setup: enable_client_http_server is not supported yet; ignored",
        );
    }
    if r.local_hostname.is_empty() {
        return Err((invalid(), "local_hostname is empty".into()));
    }
    if r.global_segment_size != 0 && r.global_segment_size < MIN_SIZE {
        return Err((
            invalid(),
            format!(
                "global_segment_size {} is below 1024",
                r.global_segment_size
            ),
        ));
    }
    if r.local_buffer_size != 0 && !(MIN_SIZE..=MAX_LOCAL_BUFFER).contains(&r.local_buffer_size) {
        return Err((
            invalid(),
            format!(
                "local_buffer_size {} is outside [1024, 1 TiB]",
                r.local_buffer_size
            ),
        ));
    }
    let force_tcp = std::env::var("MC_FORCE_TCP").is_ok_and(|v| v.trim() == "1");
    let protocol = if force_tcp {
        "tcp".to_string()
    } else {
        r.protocol
    };
    if protocol != "tcp" {
        return Err((
            internal,
            format!("protocol {protocol:?} is not supported (only \"tcp\")"),
        ));
    }
    let md = r.metadata_server.as_str();
    if !(md == "P2PHANDSHAKE" || md.starts_with("http://")) {
        return Err((
            internal,
            format!("metadata server {md:?} is not supported (use http://... or P2PHANDSHAKE)"),
        ));
    }
    Ok(ClientConfig {
        local_hostname: r.local_hostname,
        metadata_server: r.metadata_server,
        global_segment_size: r.global_segment_size,
        local_buffer_size: r.local_buffer_size,
        protocol,
        master_server_addr: r.master_server_addr,
    })
}
