//! Argument conversion of `setup`: the
//! positional/keyword form and the `setup(config: dict)` form, both turned
//! into a [`ClientConfig`]. Only argument *types* are checked here
//! (`TypeError`, as upstream's binding); every value rule — defaults of
//! the dict form, size and boolean parsing, the checks before the master
//! is contacted — is the client's ([`ClientConfig::from_entries`],
//! [`ClientConfig::check`]).

use crate::args::{short_repr, Flag, UInt};
use mooncake_client::{ClientConfig, Error, DEFAULT_CLIENT_HTTP_PORT, DEFAULT_TENANT};
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

/// Convert `setup(*args, **kwargs)`. `Err` is a `TypeError` (bad argument
/// types or arity); `Ok(Err(..))` a config the client rejects, to return as
/// a code. Lines in `notes` are warnings to log (ignored dict keys).
pub(crate) fn parse(
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
    notes: &mut Vec<String>,
) -> PyResult<Result<ClientConfig, Error>> {
    let kw_len = kwargs.map_or(0, |k| k.len());
    if args.len() == 1 && kw_len == 0 {
        let only = args.get_item(0)?;
        if let Ok(dict) = only.downcast::<PyDict>() {
            return Ok(from_dict(dict, notes));
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
            return Ok(from_dict(dict, notes));
        }
    }
    positional(args, kwargs).map(Ok)
}

/// The dict form: every key and value converted with `str()`.
fn from_dict(dict: &Bound<'_, PyDict>, notes: &mut Vec<String>) -> Result<ClientConfig, Error> {
    let mut entries: Vec<(String, String)> = Vec::with_capacity(dict.len());
    for (k, v) in dict.iter() {
        match (k.str(), v.str()) {
            (Ok(k), Ok(v)) => entries.push((k.to_string(), v.to_string())),
            _ => {
                return Err(Error::invalid(
                    "a config key or value cannot be converted with str()",
                ))
            }
        }
    }
    ClientConfig::from_entries(&entries, notes)
}

fn positional(
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<ClientConfig> {
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
    let size = |i: usize, default: u64| -> PyResult<u64> {
        get(i).map_or(Ok(default), |v| {
            named(v.extract::<UInt>(), PARAMS[i]).map(|u| u.0)
        })
    };
    let flag = |i: usize| -> PyResult<bool> {
        get(i).map_or(Ok(false), |v| {
            named(v.extract::<Flag>(), PARAMS[i]).map(|f| f.0)
        })
    };
    Ok(ClientConfig {
        local_hostname: text(0, "")?,
        metadata_server: text(1, "")?,
        global_segment_size: size(2, 0)?,
        local_buffer_size: size(3, 0)?,
        protocol: text(4, "")?,
        rdma_devices: text(5, "")?,
        master_server_addr: text(6, "")?,
        custom_engine: get(7)
            .is_some_and(|e| !e.is_none() && crate::engine::shared_engine(e).is_none()),
        engine: get(7)
            .and_then(crate::engine::shared_engine)
            .map(mooncake_client::SharedEngine),
        enable_ssd_offload: flag(8)?,
        ssd_offload_path: text(9, "")?,
        serve_disk_reads: true,
        tenant_id: text(10, DEFAULT_TENANT)?,
        enable_client_http_server: flag(11)?,
        client_http_port: size(12, DEFAULT_CLIENT_HTTP_PORT)?,
    })
}

/// Prefix an argument TypeError with the parameter name.
fn named<T>(r: PyResult<T>, name: &str) -> PyResult<T> {
    r.map_err(|e| PyTypeError::new_err(format!("setup(): argument '{name}': {e}")))
}
