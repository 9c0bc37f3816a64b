//! The configuration types: the
//! `SoftPinAction`, `ObjectDataType`, `ReplicaStatus`, `TaskType` and
//! `TaskStatus` enums, `ReplicateConfig`, and the
//! `ErrorCode` IntEnum.
//!
//! `ReplicateConfig` is a Python view of the client's
//! [`mooncake_client::ReplicateConfig`], which holds the defaults and the
//! validation; this module converts field types and renders upstream's
//! exact `str()` form. Store methods take `config: Option<ReplicateConfig>`
//! and pass [`options`] of it to the client.

use crate::args::{Flag, UInt};
use mooncake_client::{ErrorCode, SoftPin};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple, PyType};

/// Declares an upstream (pybind11-style) enum class: a frozen, int-valued
/// pyclass with `name`, `value`, `__index__`, `__hash__`, `__str__`/`__repr__`,
/// pickling and `__members__`. Like pybind11 enums, members do not compare
/// equal to plain ints.
macro_rules! upstream_enum {
    ($(#[$doc:meta])* $ty:ident { $($variant:ident = $value:literal => $pyname:tt),+ $(,)? }) => {
        $(#[$doc])*
        #[pyclass(module = "mooncake.store", eq, frozen)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $ty {
            $(
                #[pyo3(name = $pyname)]
                $variant = $value,
            )+
        }

        impl $ty {
            /// Every member, in value order.
            pub(crate) const ALL: &'static [$ty] = &[$(Self::$variant),+];

            /// Upstream member name.
            pub(crate) fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $pyname,)+
                }
            }
        }

        #[pymethods]
        impl $ty {
            /// Construct from an int; `ValueError` for values outside the enum.
            #[new]
            fn py_new(value: i64) -> PyResult<Self> {
                Self::ALL.iter().copied().find(|m| *m as i64 == value).ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "{value} is not a valid {}",
                        stringify!($ty)
                    ))
                })
            }

            /// Member name.
            #[getter(name)]
            fn py_name(&self) -> &'static str {
                self.name()
            }

            /// Integer value.
            #[getter]
            fn value(&self) -> i64 {
                *self as i64
            }

            /// The integer value (`operator.index`).
            fn __index__(&self) -> i64 {
                *self as i64
            }

            /// Hash of the integer value (as upstream's pybind11 enums).
            fn __hash__(&self) -> u64 {
                *self as u64
            }

            /// `Type.NAME`.
            fn __str__(&self) -> String {
                format!("{}.{}", stringify!($ty), self.name())
            }

            /// `<Type.NAME: value>`.
            fn __repr__(&self) -> String {
                format!("<{}.{}: {}>", stringify!($ty), self.name(), *self as i64)
            }

            /// Pickle as `Type(value)`.
            fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
                let value = *slf.get() as i64;
                PyTuple::new(
                    slf.py(),
                    [
                        slf.as_any().get_type().into_any(),
                        PyTuple::new(slf.py(), [value])?.into_any(),
                    ],
                )
            }

            /// Name -> member mapping, like upstream's `__members__`.
            #[classattr]
            #[pyo3(name = "__members__")]
            fn members(py: Python<'_>) -> PyResult<Py<PyDict>> {
                let d = PyDict::new(py);
                for m in Self::ALL {
                    d.set_item(m.name(), *m)?;
                }
                Ok(d.unbind())
            }
        }
    };
}

upstream_enum! {
    /// Soft-pin action of a write: `PRESERVE=0`, `ENABLE=1`, `DISABLE=2`.
    SoftPinAction {
        Preserve = 0 => "PRESERVE",
        Enable = 1 => "ENABLE",
        Disable = 2 => "DISABLE",
    }
}

impl From<SoftPinAction> for SoftPin {
    fn from(a: SoftPinAction) -> SoftPin {
        match a {
            SoftPinAction::Preserve => SoftPin::Preserve,
            SoftPinAction::Enable => SoftPin::Enable,
            SoftPinAction::Disable => SoftPin::Disable,
        }
    }
}

impl From<SoftPin> for SoftPinAction {
    fn from(p: SoftPin) -> SoftPinAction {
        match p {
            SoftPin::Preserve => SoftPinAction::Preserve,
            SoftPin::Enable => SoftPinAction::Enable,
            SoftPin::Disable => SoftPinAction::Disable,
        }
    }
}

upstream_enum! {
    /// State of a replica (`ReplicaDescriptor.status`); the replicas a
    /// lookup returns are COMPLETE.
    ReplicaStatus {
        Undefined = 0 => "UNDEFINED",
        Initialized = 1 => "INITIALIZED",
        Processing = 2 => "PROCESSING",
        Complete = 3 => "COMPLETE",
        Removed = 4 => "REMOVED",
        Failed = 5 => "FAILED",
    }
}

upstream_enum! {
    /// Kind of a copy or move task (`QueryTaskResponse.type`).
    TaskType {
        ReplicaCopy = 0 => "REPLICA_COPY",
        ReplicaMove = 1 => "REPLICA_MOVE",
    }
}

upstream_enum! {
    /// State of a copy or move task (`QueryTaskResponse.status`).
    TaskStatus {
        Pending = 0 => "PENDING",
        Processing = 1 => "PROCESSING",
        Failed = 2 => "FAILED",
        Success = 3 => "SUCCESS",
    }
}

upstream_enum! {
    /// Kind of data an object holds (recorded per object; no Tier 1 effect).
    ObjectDataType {
        Unknown = 0 => "UNKNOWN",
        KvCache = 1 => "KVCACHE",
        Tensor = 2 => "TENSOR",
        Weight = 3 => "WEIGHT",
        Sample = 4 => "SAMPLE",
        Activation = 5 => "ACTIVATION",
        Gradient = 6 => "GRADIENT",
        OptimizerState = 7 => "OPTIMIZER_STATE",
        Metadata = 8 => "METADATA",
        General = 9 => "GENERAL",
    }
}

impl ObjectDataType {
    /// The member with value `v` (UNKNOWN for values outside the enum).
    fn from_value(v: u32) -> Self {
        Self::ALL
            .iter()
            .copied()
            .find(|m| *m as u32 == v)
            .unwrap_or(ObjectDataType::Unknown)
    }
}

/// Declares the config struct and its keyword setter from one field list.
macro_rules! keyword_fields {
    ($(#[$meta:meta])* struct $ty:ident { $($field:ident: $fty:ty,)+ }) => {
        $(#[$meta])*
        pub(crate) struct $ty {
            $($field: $fty,)+
        }

        impl $ty {
            /// Set the field `name` from `value`; `Ok(false)` for an unknown name.
            fn set_field(&mut self, name: &str, value: &Bound<'_, PyAny>) -> PyResult<bool> {
                match name {
                    $(stringify!($field) => self.$field = value.extract()?,)+
                    _ => return Ok(false),
                }
                Ok(true)
            }
        }
    };
}

keyword_fields! {
    /// Replication / placement / pinning options of a write: the Python view
    /// of [`mooncake_client::ReplicateConfig`] (whose `Default` gives the
    /// defaults and whose `write_config` the rules).
    ///
    /// Upstream takes no constructor arguments; we also accept keyword
    /// arguments for any field. List fields return copies.
    #[pyclass(module = "mooncake.store", subclass, get_all, set_all)]
    #[derive(Clone, Debug)]
    struct ReplicateConfig {
        replica_num: UInt,
        soft_pin_action: SoftPinAction,
        soft_pin_ttl_ms: Option<UInt>,
        with_hard_pin: Flag,
        preferred_segments: Vec<String>,
        preferred_segment: String,
        prefer_alloc_in_same_node: Flag,
        group_ids: Option<Vec<String>>,
        data_type: ObjectDataType,
        nof_replica_num: UInt,
        dfs_replica_num: UInt,
        preferred_nof_segments: Vec<String>,
    }
}

impl From<mooncake_client::ReplicateConfig> for ReplicateConfig {
    fn from(c: mooncake_client::ReplicateConfig) -> Self {
        ReplicateConfig {
            replica_num: UInt(c.replica_num),
            soft_pin_action: c.soft_pin.into(),
            soft_pin_ttl_ms: c.soft_pin_ttl_ms.map(UInt),
            with_hard_pin: Flag(c.with_hard_pin),
            preferred_segments: c.preferred_segments,
            preferred_segment: c.preferred_segment,
            prefer_alloc_in_same_node: Flag(c.prefer_alloc_in_same_node),
            group_ids: c.group_ids,
            data_type: ObjectDataType::from_value(c.data_type),
            nof_replica_num: UInt(c.nof_replica_num),
            dfs_replica_num: UInt(c.dfs_replica_num),
            preferred_nof_segments: c.preferred_nof_segments,
        }
    }
}

impl From<ReplicateConfig> for mooncake_client::ReplicateConfig {
    fn from(c: ReplicateConfig) -> Self {
        mooncake_client::ReplicateConfig {
            replica_num: c.replica_num.0,
            soft_pin: c.soft_pin_action.into(),
            soft_pin_ttl_ms: c.soft_pin_ttl_ms.map(|u| u.0),
            with_hard_pin: c.with_hard_pin.0,
            preferred_segments: c.preferred_segments,
            preferred_segment: c.preferred_segment,
            prefer_alloc_in_same_node: c.prefer_alloc_in_same_node.0,
            group_ids: c.group_ids,
            data_type: c.data_type as u32,
            nof_replica_num: c.nof_replica_num.0,
            dfs_replica_num: c.dfs_replica_num.0,
            preferred_nof_segments: c.preferred_nof_segments,
        }
    }
}

/// The client config of a `config` argument (`None`: the default config).
pub(crate) fn options(config: Option<ReplicateConfig>) -> mooncake_client::ReplicateConfig {
    config.map(Into::into).unwrap_or_default()
}

fn list_text(items: &[String]) -> String {
    format!("[{}]", items.join(", "))
}

#[pymethods]
impl ReplicateConfig {
    /// `ReplicateConfig(**fields)`: defaults, then the given fields.
    #[new]
    #[pyo3(signature = (**kwargs))]
    fn py_new(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut cfg = ReplicateConfig::from(mooncake_client::ReplicateConfig::default());
        for (k, v) in kwargs.into_iter().flat_map(|k| k.iter()) {
            let name: String = k.extract()?;
            if !cfg.set_field(&name, &v)? {
                return Err(PyTypeError::new_err(format!(
                    "ReplicateConfig() got an unexpected keyword argument '{name}'"
                )));
            }
        }
        Ok(cfg)
    }

    /// Upstream's exact text form.
    fn __str__(&self) -> String {
        let c = mooncake_client::ReplicateConfig::from(self.clone());
        let ttl = c
            .soft_pin_ttl_ms
            .map_or_else(|| "default".to_string(), |t| t.to_string());
        let mut s = format!(
            "ReplicateConfig: {{ replica_num: {}, nof_replica_num: {}, dfs_replica_num: {}, \
             soft_pin_action: {}, soft_pin_ttl_ms: {}, with_hard_pin: {}, preferred_segments: {}",
            c.replica_num,
            c.nof_replica_num,
            c.dfs_replica_num,
            SoftPinAction::from(c.soft_pin).name(),
            ttl,
            u8::from(c.with_hard_pin),
            list_text(&c.preferred_segments),
        );
        if !c.preferred_segment.is_empty() {
            s.push_str(&format!(
                ", preferred_segment (deprecated): {}",
                c.preferred_segment
            ));
        }
        s.push_str(&format!(
            ", preferred_nof_segments: {}, prefer_alloc_in_same_node: {}, data_type: {}",
            list_text(&c.preferred_nof_segments),
            u8::from(c.prefer_alloc_in_same_node),
            ObjectDataType::from_value(c.data_type).name(),
        ));
        if let Some(ids) = &c.group_ids {
            s.push_str(&format!(", group_ids: {}", list_text(ids)));
        }
        s.push_str(" }");
        s
    }

    /// Same as `str()`.
    fn __repr__(&self) -> String {
        self.__str__()
    }
}

/// Build `mooncake.store.ErrorCode`, an `IntEnum` of the upstream codes plus `OK = 0`.
pub(crate) fn error_code_enum(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let mut members: Vec<(String, i32)> = vec![("OK".to_string(), 0)];
    members.extend(ErrorCode::ALL.iter().map(|c| (c.name(), c.code())));
    let kwargs = PyDict::new(py);
    kwargs.set_item("module", "mooncake.store")?;
    let int_enum: Bound<'_, PyType> = py.import("enum")?.getattr("IntEnum")?.downcast_into()?;
    int_enum.call(("ErrorCode", members), Some(&kwargs))
}
