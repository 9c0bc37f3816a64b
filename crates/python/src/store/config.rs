//! Configuration types: `SoftPinAction`, `ObjectDataType`, `ReplicateConfig`
//! (with its validation into the client's `WriteConfig`) and the `ErrorCode`
//! IntEnum.

use super::args::{Flag, UInt};
use mooncake_common::proto::{SoftPin, WriteConfig};
use mooncake_common::ErrorCode;
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
            pub const ALL: &'static [$ty] = &[$(Self::$variant),+];

            /// Upstream member name.
            pub fn name(self) -> &'static str {
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

            fn __index__(&self) -> i64 {
                *self as i64
            }

            /// Hash of the integer value (as upstream's pybind11 enums).
            fn __hash__(&self) -> u64 {
                *self as u64
            }

            fn __str__(&self) -> String {
                format!("{}.{}", stringify!($ty), self.name())
            }

            fn __repr__(&self) -> String {
                format!("<{}.{}: {}>", stringify!($ty), self.name(), *self as i64)
            }

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

impl SoftPinAction {
    fn to_proto(self) -> SoftPin {
        match self {
            Self::Preserve => SoftPin::Preserve,
            Self::Enable => SoftPin::Enable,
            Self::Disable => SoftPin::Disable,
        }
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

/// What kind of write a `ReplicateConfig` is validated for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    /// `put*`, `upsert*`, `*_from`: `prefer_alloc_in_same_node` is rejected.
    Bytes,
    /// Tensor writes: `prefer_alloc_in_same_node` is a placement hint (the
    /// writer's own segment first), marked as `writer_segment = Some("")`
    /// for the client to fill in.
    Tensor,
}

/// A rejected configuration: the code to return and why.
pub type Rejection = (ErrorCode, &'static str);

/// Replication / placement / pinning options of a write.
///
/// Upstream takes no constructor arguments; we also accept keyword
/// arguments for any field. List fields return copies.
#[pyclass(module = "mooncake.store", subclass)]
#[derive(Clone, Debug)]
pub struct ReplicateConfig {
    replica_num: u64,
    soft_pin_action: SoftPinAction,
    soft_pin_ttl_ms: Option<u64>,
    with_hard_pin: bool,
    preferred_segments: Vec<String>,
    preferred_segment: String,
    prefer_alloc_in_same_node: bool,
    group_ids: Option<Vec<String>>,
    data_type: ObjectDataType,
    nof_replica_num: u64,
    dfs_replica_num: u64,
    preferred_nof_segments: Vec<String>,
}

impl Default for ReplicateConfig {
    fn default() -> Self {
        ReplicateConfig {
            replica_num: 1,
            soft_pin_action: SoftPinAction::Preserve,
            soft_pin_ttl_ms: None,
            with_hard_pin: false,
            preferred_segments: Vec::new(),
            preferred_segment: String::new(),
            prefer_alloc_in_same_node: false,
            group_ids: None,
            data_type: ObjectDataType::Unknown,
            nof_replica_num: 0,
            dfs_replica_num: 0,
            preferred_nof_segments: Vec::new(),
        }
    }
}

impl ReplicateConfig {
    /// Validate for a write of `n_keys` keys (`None` for a single-key write)
    /// and build the client's `WriteConfig`.
    ///
    /// Client-side rules only; the master checks the soft-pin TTL maximum.
    pub fn to_write_config(
        &self,
        kind: WriteKind,
        n_keys: Option<usize>,
    ) -> Result<WriteConfig, Rejection> {
        let invalid = |why| Err((ErrorCode::InvalidParams, why));
        if self.replica_num == 0 {
            return invalid("replica_num is 0");
        }
        let Ok(replica_num) = u32::try_from(self.replica_num) else {
            return invalid("replica_num is too large");
        };
        if self.nof_replica_num != 0 || self.dfs_replica_num != 0 {
            return invalid("nof/dfs replicas are not supported");
        }
        if self.soft_pin_ttl_ms.is_some() && self.soft_pin_action != SoftPinAction::Enable {
            return invalid("soft_pin_ttl_ms is only valid with SoftPinAction.ENABLE");
        }
        if kind == WriteKind::Bytes && self.prefer_alloc_in_same_node {
            return invalid("prefer_alloc_in_same_node is not supported for byte writes");
        }
        if let Some(ids) = &self.group_ids {
            let expected = n_keys.unwrap_or(1);
            if ids.len() != expected {
                return invalid("group_ids length does not match the number of keys");
            }
        }
        let preferred_segments = if self.preferred_segment.is_empty() {
            self.preferred_segments.clone()
        } else {
            vec![self.preferred_segment.clone()]
        };
        Ok(WriteConfig {
            replica_num,
            soft_pin: self.soft_pin_action.to_proto(),
            soft_pin_ttl_ms: self.soft_pin_ttl_ms,
            hard_pin: self.with_hard_pin,
            preferred_segments,
            data_type: self.data_type as u32,
            writer_segment: (kind == WriteKind::Tensor && self.prefer_alloc_in_same_node)
                .then(String::new),
            ..WriteConfig::default()
        })
    }

    fn set_field(&mut self, name: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        match name {
            "replica_num" => self.set_replica_num(value.extract()?),
            "soft_pin_action" => self.set_soft_pin_action(value.extract()?),
            "soft_pin_ttl_ms" => self.set_soft_pin_ttl_ms(value.extract()?),
            "with_hard_pin" => self.set_with_hard_pin(value.extract()?),
            "preferred_segments" => self.set_preferred_segments(value.extract()?),
            "preferred_segment" => self.set_preferred_segment(value.extract()?),
            "prefer_alloc_in_same_node" => self.set_prefer_alloc_in_same_node(value.extract()?),
            "group_ids" => self.set_group_ids(value.extract()?),
            "data_type" => self.set_data_type(value.extract()?),
            "nof_replica_num" => self.set_nof_replica_num(value.extract()?),
            "dfs_replica_num" => self.set_dfs_replica_num(value.extract()?),
            "preferred_nof_segments" => self.set_preferred_nof_segments(value.extract()?),
            other => {
                return Err(PyTypeError::new_err(format!(
                    "ReplicateConfig() got an unexpected keyword argument '{other}'"
                )))
            }
        }
        Ok(())
    }
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
        let mut cfg = ReplicateConfig::default();
        if let Some(kwargs) = kwargs {
            for (k, v) in kwargs.iter() {
                let name: String = k.extract()?;
                cfg.set_field(&name, &v)?;
            }
        }
        Ok(cfg)
    }

    #[getter]
    fn get_replica_num(&self) -> u64 {
        self.replica_num
    }
    #[setter]
    fn set_replica_num(&mut self, v: UInt) {
        self.replica_num = v.0;
    }

    #[getter]
    fn get_soft_pin_action(&self) -> SoftPinAction {
        self.soft_pin_action
    }
    #[setter]
    fn set_soft_pin_action(&mut self, v: SoftPinAction) {
        self.soft_pin_action = v;
    }

    #[getter]
    fn get_soft_pin_ttl_ms(&self) -> Option<u64> {
        self.soft_pin_ttl_ms
    }
    #[setter]
    fn set_soft_pin_ttl_ms(&mut self, v: Option<UInt>) {
        self.soft_pin_ttl_ms = v.map(|u| u.0);
    }

    #[getter]
    fn get_with_hard_pin(&self) -> bool {
        self.with_hard_pin
    }
    #[setter]
    fn set_with_hard_pin(&mut self, v: Flag) {
        self.with_hard_pin = v.0;
    }

    #[getter]
    fn get_preferred_segments(&self) -> Vec<String> {
        self.preferred_segments.clone()
    }
    #[setter]
    fn set_preferred_segments(&mut self, v: Vec<String>) {
        self.preferred_segments = v;
    }

    #[getter]
    fn get_preferred_segment(&self) -> String {
        self.preferred_segment.clone()
    }
    #[setter]
    fn set_preferred_segment(&mut self, v: String) {
        self.preferred_segment = v;
    }

    #[getter]
    fn get_prefer_alloc_in_same_node(&self) -> bool {
        self.prefer_alloc_in_same_node
    }
    #[setter]
    fn set_prefer_alloc_in_same_node(&mut self, v: Flag) {
        self.prefer_alloc_in_same_node = v.0;
    }

    #[getter]
    fn get_group_ids(&self) -> Option<Vec<String>> {
        self.group_ids.clone()
    }
    #[setter]
    fn set_group_ids(&mut self, v: Option<Vec<String>>) {
        self.group_ids = v;
    }

    #[getter]
    fn get_data_type(&self) -> ObjectDataType {
        self.data_type
    }
    #[setter]
    fn set_data_type(&mut self, v: ObjectDataType) {
        self.data_type = v;
    }

    #[getter]
    fn get_nof_replica_num(&self) -> u64 {
        self.nof_replica_num
    }
    #[setter]
    fn set_nof_replica_num(&mut self, v: UInt) {
        self.nof_replica_num = v.0;
    }

    #[getter]
    fn get_dfs_replica_num(&self) -> u64 {
        self.dfs_replica_num
    }
    #[setter]
    fn set_dfs_replica_num(&mut self, v: UInt) {
        self.dfs_replica_num = v.0;
    }

    #[getter]
    fn get_preferred_nof_segments(&self) -> Vec<String> {
        self.preferred_nof_segments.clone()
    }
    #[setter]
    fn set_preferred_nof_segments(&mut self, v: Vec<String>) {
        self.preferred_nof_segments = v;
    }

    /// Upstream's exact text form.
    fn __str__(&self) -> String {
        let ttl = self
            .soft_pin_ttl_ms
            .map_or_else(|| "default".to_string(), |t| t.to_string());
        let mut s = format!(
            "ReplicateConfig: {{ replica_num: {}, nof_replica_num: {}, dfs_replica_num: {}, \
             soft_pin_action: {}, soft_pin_ttl_ms: {}, with_hard_pin: {}, preferred_segments: {}",
            self.replica_num,
            self.nof_replica_num,
            self.dfs_replica_num,
            self.soft_pin_action.name(),
            ttl,
            u8::from(self.with_hard_pin),
            list_text(&self.preferred_segments),
        );
        if !self.preferred_segment.is_empty() {
            s.push_str(&format!(
                ", preferred_segment (deprecated): {}",
                self.preferred_segment
            ));
        }
        s.push_str(&format!(
            ", preferred_nof_segments: {}, prefer_alloc_in_same_node: {}, data_type: {}",
            list_text(&self.preferred_nof_segments),
            u8::from(self.prefer_alloc_in_same_node),
            self.data_type.name(),
        ));
        if let Some(ids) = &self.group_ids {
            s.push_str(&format!(", group_ids: {}", list_text(ids)));
        }
        s.push_str(" }");
        s
    }

    fn __repr__(&self) -> String {
        self.__str__()
    }
}

/// Build `mooncake.store.ErrorCode`, an `IntEnum` of the upstream codes plus `OK = 0`.
pub fn error_code_enum(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let mut members: Vec<(String, i32)> = vec![("OK".to_string(), 0)];
    members.extend(ErrorCode::ALL.iter().map(|c| (c.name(), c.code())));
    let kwargs = PyDict::new(py);
    kwargs.set_item("module", "mooncake.store")?;
    let int_enum: Bound<'_, PyType> = py.import("enum")?.getattr("IntEnum")?.downcast_into()?;
    int_enum.call(("ErrorCode", members), Some(&kwargs))
}
