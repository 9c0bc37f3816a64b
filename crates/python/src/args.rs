//! Argument types shared by the bindings. Only argument-type errors raise
//! `TypeError`, as upstream's binding does; everything else is a return
//! code.

use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};

/// A non-negative integer below 2**64 (pointers, sizes, offsets).
///
/// Negative or too large values raise `TypeError` (as upstream's unsigned
/// arguments do) instead of pyo3's default `OverflowError`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct UInt(pub(crate) u64);

impl<'py> FromPyObject<'py> for UInt {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        match ob.extract::<u64>() {
            Ok(v) => Ok(UInt(v)),
            Err(e) if e.is_instance_of::<PyOverflowError>(ob.py()) => Err(PyTypeError::new_err(
                format!("expected an integer in [0, 2**64), got {}", short_repr(ob)),
            )),
            Err(e) => Err(e),
        }
    }
}

impl UInt {
    /// The value as `usize` (lossless on 64-bit targets).
    pub(crate) fn usize(self) -> usize {
        self.0 as usize
    }
}

/// A boolean flag: `bool`, `int` (non-zero is true) or `numpy.bool_`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Flag(pub(crate) bool);

impl<'py> FromPyObject<'py> for Flag {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(b) = ob.downcast::<PyBool>() {
            return Ok(Flag(b.is_true()));
        }
        if ob.is_instance_of::<PyInt>() {
            return Ok(Flag(ob.is_truthy()?));
        }
        // numpy.bool_ and friends.
        ob.extract::<bool>()
            .map(Flag)
            .map_err(|_| PyTypeError::new_err(format!("expected a bool, got {}", short_repr(ob))))
    }
}

/// `IntoPyObject` of an argument newtype: the Python value of what it wraps.
macro_rules! into_wrapped {
    ($($ty:ident($inner:ty)),+) => {$(
        impl<'py> IntoPyObject<'py> for $ty {
            type Target = <$inner as IntoPyObject<'py>>::Target;
            type Output = <$inner as IntoPyObject<'py>>::Output;
            type Error = <$inner as IntoPyObject<'py>>::Error;

            fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
                self.0.into_pyobject(py)
            }
        }
    )+};
}

into_wrapped!(UInt(u64), Flag(bool));

/// `repr(ob)` limited to a readable length, for error messages.
pub(crate) fn short_repr(ob: &Bound<'_, PyAny>) -> String {
    let text = ob
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<object>".to_string());
    if text.chars().count() > 80 {
        let head: String = text.chars().take(80).collect();
        format!("{head}...")
    } else {
        text
    }
}

/// Resolve upstream's positional-only `arg0` and our `key`/`keys` keyword
/// alias into the one value (`TypeError` if both or neither are given).
pub(crate) fn one_of<T>(
    method: &str,
    arg0: Option<T>,
    alias: Option<T>,
    alias_name: &str,
) -> PyResult<T> {
    match (arg0, alias) {
        (Some(v), None) | (None, Some(v)) => Ok(v),
        (Some(_), Some(_)) => Err(PyTypeError::new_err(format!(
            "{method}() got both arg0 and {alias_name}"
        ))),
        (None, None) => Err(PyTypeError::new_err(format!(
            "{method}() missing required argument: '{alias_name}'"
        ))),
    }
}

/// Convert a list of `UInt` to plain values.
pub(crate) fn plain(v: &[UInt]) -> Vec<u64> {
    v.iter().map(|u| u.0).collect()
}

/// Caller addresses or sizes as `usize` (lossless on 64-bit targets).
pub(crate) fn addrs(v: &[UInt]) -> Vec<usize> {
    v.iter().map(|u| u.usize()).collect()
}

/// Per-key lists of caller addresses, sizes or offsets as `usize`.
pub(crate) fn addrs2(v: &[Vec<UInt>]) -> Vec<Vec<usize>> {
    v.iter().map(|l| addrs(l)).collect()
}
