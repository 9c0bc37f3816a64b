//! Configuration types (store spec, "Configuration types"): the
//! `SoftPinAction` and `ObjectDataType` enums, `ReplicateConfig`, and the
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

/// Replication / placement / pinning options of a write.
///
/// Upstream takes no constructor arguments; we also accept keyword
/// arguments for any field. List fields return copies.
#[pyclass(module = "mooncake.store", subclass)]
#[derive(Clone, Debug, Default)]
pub struct ReplicateConfig {
    inner: mooncake_client::ReplicateConfig,
}

/// The client config of a `config` argument (`None`: the default config).
pub(crate) fn options(config: Option<ReplicateConfig>) -> mooncake_client::ReplicateConfig {
    config.map(|c| c.inner).unwrap_or_default()
}

impl ReplicateConfig {
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

    /// Replicas on distinct segments (default 1).
    #[getter]
    fn get_replica_num(&self) -> u64 {
        self.inner.replica_num
    }
    #[setter]
    fn set_replica_num(&mut self, v: UInt) {
        self.inner.replica_num = v.0;
    }

    /// Soft-pin action (default PRESERVE).
    #[getter]
    fn get_soft_pin_action(&self) -> SoftPinAction {
        self.inner.soft_pin.into()
    }
    #[setter]
    fn set_soft_pin_action(&mut self, v: SoftPinAction) {
        self.inner.soft_pin = v.into();
    }

    /// Soft-pin TTL in ms, or None for the master's default.
    #[getter]
    fn get_soft_pin_ttl_ms(&self) -> Option<u64> {
        self.inner.soft_pin_ttl_ms
    }
    #[setter]
    fn set_soft_pin_ttl_ms(&mut self, v: Option<UInt>) {
        self.inner.soft_pin_ttl_ms = v.map(|u| u.0);
    }

    /// Hard pin: never evicted.
    #[getter]
    fn get_with_hard_pin(&self) -> bool {
        self.inner.with_hard_pin
    }
    #[setter]
    fn set_with_hard_pin(&mut self, v: Flag) {
        self.inner.with_hard_pin = v.0;
    }

    /// Segment names tried first (a copy).
    #[getter]
    fn get_preferred_segments(&self) -> Vec<String> {
        self.inner.preferred_segments.clone()
    }
    #[setter]
    fn set_preferred_segments(&mut self, v: Vec<String>) {
        self.inner.preferred_segments = v;
    }

    /// Deprecated single preferred segment.
    #[getter]
    fn get_preferred_segment(&self) -> String {
        self.inner.preferred_segment.clone()
    }
    #[setter]
    fn set_preferred_segment(&mut self, v: String) {
        self.inner.preferred_segment = v;
    }

    /// Rejected by byte writes (upstream).
    #[getter]
    fn get_prefer_alloc_in_same_node(&self) -> bool {
        self.inner.prefer_alloc_in_same_node
    }
    #[setter]
    fn set_prefer_alloc_in_same_node(&mut self, v: Flag) {
        self.inner.prefer_alloc_in_same_node = v.0;
    }

    /// Lease groups (a copy), or None.
    #[getter]
    fn get_group_ids(&self) -> Option<Vec<String>> {
        self.inner.group_ids.clone()
    }
    #[setter]
    fn set_group_ids(&mut self, v: Option<Vec<String>>) {
        self.inner.group_ids = v;
    }

    /// Kind of data stored.
    #[getter]
    fn get_data_type(&self) -> ObjectDataType {
        ObjectDataType::from_value(self.inner.data_type)
    }
    #[setter]
    fn set_data_type(&mut self, v: ObjectDataType) {
        self.inner.data_type = v as u32;
    }

    /// NVMe-oF replicas (Tier 3; non-zero is rejected by writes).
    #[getter]
    fn get_nof_replica_num(&self) -> u64 {
        self.inner.nof_replica_num
    }
    #[setter]
    fn set_nof_replica_num(&mut self, v: UInt) {
        self.inner.nof_replica_num = v.0;
    }

    /// DFS replicas (Tier 3; non-zero is rejected by writes).
    #[getter]
    fn get_dfs_replica_num(&self) -> u64 {
        self.inner.dfs_replica_num
    }
    #[setter]
    fn set_dfs_replica_num(&mut self, v: UInt) {
        self.inner.dfs_replica_num = v.0;
    }

    /// Tier 3; ignored (a copy).
    #[getter]
    fn get_preferred_nof_segments(&self) -> Vec<String> {
        self.inner.preferred_nof_segments.clone()
    }
    #[setter]
    fn set_preferred_nof_segments(&mut self, v: Vec<String>) {
        self.inner.preferred_nof_segments = v;
    }

    /// Upstream's exact text form.
    fn __str__(&self) -> String {
        let c = &self.inner;
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
