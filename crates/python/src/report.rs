//! The one place where a domain error becomes what Python sees: a return
//! code plus one log line, or an exception.
//!
//! Store methods never raise for store failures: a failure is the upstream
//! code, and it logs exactly one line on `logging.getLogger("mooncake.store")`
//! naming the method, the key and the reason: INFO for OBJECT_NOT_FOUND,
//! WARNING otherwise; nothing on success. [`Call`] does that for single
//! calls ([`Call::code`], [`Call::ok`]) and per-item batches
//! ([`Call::codes`], [`Call::oks`]: one line per call, not per item).
//! EngramStore raises with its documented exact message and logs the reason
//! ([`OrRaise`]).

use mooncake_client::{Error, ErrorCode, Result};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use std::fmt::Write;

static LOGGER: GILOnceCell<Py<PyAny>> = GILOnceCell::new();

/// Longest key (in chars) written into a log line before it is shortened.
const MAX_KEY_CHARS: usize = 200;
/// How many failing items a batch log line names before summarising.
const MAX_LISTED: usize = 8;

/// Python logging levels used here.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Info,
    Warning,
}

impl Level {
    fn of(code: ErrorCode) -> Level {
        if code == ErrorCode::ObjectNotFound {
            Level::Info
        } else {
            Level::Warning
        }
    }
}

fn logger(py: Python<'_>) -> Option<&Bound<'_, PyAny>> {
    LOGGER
        .get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            let logging = py.import("logging")?;
            Ok(logging
                .call_method1("getLogger", ("mooncake.store",))?
                .unbind())
        })
        .ok()
        .map(|l| l.bind(py))
}

/// Emit one line; logging failures are swallowed (a store call never raises).
fn emit(py: Python<'_>, level: Level, msg: &str) {
    let Some(logger) = logger(py) else { return };
    let method = match level {
        Level::Info => "info",
        Level::Warning => "warning",
    };
    // `%s` keeps user text (keys may contain '%') out of the format string.
    let _ = logger.call_method1(method, ("%s", msg));
}

/// A key as shown in log lines: quoted, and shortened when very long.
pub(crate) fn show_key(key: &str) -> String {
    if key.chars().count() <= MAX_KEY_CHARS {
        format!("{key:?}")
    } else {
        let head: String = key.chars().take(MAX_KEY_CHARS).collect();
        format!("{head:?}...")
    }
}

/// What a successful call returns as a Python `int`: 0 for `()`, a size or
/// count as is, 1/0 for a yes/no answer.
pub(crate) trait IntoCode {
    /// The `int` value.
    fn into_code(self) -> i64;
}

impl IntoCode for () {
    fn into_code(self) -> i64 {
        0
    }
}

impl IntoCode for u64 {
    fn into_code(self) -> i64 {
        i64::try_from(self).unwrap_or(i64::MAX)
    }
}

impl IntoCode for bool {
    fn into_code(self) -> i64 {
        i64::from(self)
    }
}

/// The `int` a failure returns: its upstream code.
fn code_of(e: &Error) -> i64 {
    i64::from(e.code().code())
}

/// One store method call, for turning its results into return values and
/// log lines.
#[derive(Clone, Copy)]
pub(crate) struct Call<'py> {
    py: Python<'py>,
    method: &'static str,
}

impl<'py> Call<'py> {
    /// A call of `method` (its Python name, as the log lines show it).
    pub(crate) fn new(py: Python<'py>, method: &'static str) -> Self {
        Call { py, method }
    }

    /// The interpreter this call runs in.
    pub(crate) fn py(&self) -> Python<'py> {
        self.py
    }

    /// Log a failure of the call on `key`:
    /// `method: key="k": NAME (code): reason`.
    pub(crate) fn fail(&self, key: Option<&str>, e: &Error) {
        let mut msg = String::from(self.method);
        if let Some(k) = key {
            let _ = write!(msg, ": key={}", show_key(k));
        }
        let _ = write!(msg, ": {e}");
        emit(self.py, Level::of(e.code()), &msg);
    }

    /// Log a WARNING that is not a failure (a setting ignored, nothing stored).
    pub(crate) fn note(&self, text: &str) {
        emit(self.py, Level::Warning, &format!("{}: {text}", self.method));
    }

    /// An `int` return: the value on success, else the logged code.
    pub(crate) fn code<T: IntoCode>(&self, key: Option<&str>, r: Result<T>) -> i64 {
        match r {
            Ok(v) => v.into_code(),
            Err(e) => {
                self.fail(key, &e);
                code_of(&e)
            }
        }
    }

    /// An optional return (`get_buffer`, `get`): the value, or `None`
    /// after logging the failure.
    pub(crate) fn ok<T>(&self, key: Option<&str>, r: Result<T>) -> Option<T> {
        r.map_err(|e| self.fail(key, &e)).ok()
    }

    /// A batch call answered with one code (`put_batch`): 0, or the code
    /// of its failure logged as a failure of all `n` items.
    pub(crate) fn batch_code(&self, n: usize, r: Result<()>) -> i64 {
        match r {
            Ok(()) => 0,
            Err(e) => {
                let msg = format!("{}: {n} items: {e}", self.method);
                emit(self.py, Level::of(e.code()), &msg);
                code_of(&e)
            }
        }
    }

    /// A per-item batch as one `int` per item (the value or the code), with
    /// one log line for the whole call. An outer error (the call failed as a
    /// whole) gives its code for every item. No items log nothing.
    pub(crate) fn codes<T: IntoCode>(
        &self,
        keys: &[String],
        r: Result<Vec<Result<T>>>,
    ) -> Vec<i64> {
        self.items(keys, r)
            .into_iter()
            .map(|r| r.map_or_else(|c| c, IntoCode::into_code))
            .collect()
    }

    /// A per-item batch as one `Option` per item (`None` where an item
    /// failed), with one log line for the whole call.
    pub(crate) fn oks<T>(&self, keys: &[String], r: Result<Vec<Result<T>>>) -> Vec<Option<T>> {
        self.items(keys, r).into_iter().map(Result::ok).collect()
    }

    /// The per-item results with failures reduced to their codes, after the
    /// call's one log line.
    fn items<T>(&self, keys: &[String], r: Result<Vec<Result<T>>>) -> Vec<Result<T, i64>> {
        let n = keys.len();
        let items = match r {
            Ok(items) => items,
            Err(e) => {
                if n > 0 {
                    let msg = format!("{}: {n} items: {e}", self.method);
                    emit(self.py, Level::of(e.code()), &msg);
                }
                return (0..n).map(|_| Err(code_of(&e))).collect();
            }
        };
        let failures: Vec<(&str, &Error)> = keys
            .iter()
            .zip(&items)
            .filter_map(|(k, r)| r.as_ref().err().map(|e| (k.as_str(), e)))
            .collect();
        self.fail_items(&failures, items.len());
        items
            .into_iter()
            .map(|r| r.map_err(|e| code_of(&e)))
            .collect()
    }

    /// One line for the failed items `(key, error)` of a batch of `total`
    /// items; nothing when none failed. INFO only when every failure is
    /// OBJECT_NOT_FOUND.
    pub(crate) fn fail_items(&self, failures: &[(&str, &Error)], total: usize) {
        if failures.is_empty() {
            return;
        }
        let level = if failures
            .iter()
            .all(|(_, e)| Level::of(e.code()) == Level::Info)
        {
            Level::Info
        } else {
            Level::Warning
        };
        let mut msg = format!(
            "{}: {} of {total} items failed:",
            self.method,
            failures.len()
        );
        for (i, (key, e)) in failures.iter().take(MAX_LISTED).enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            let _ = write!(msg, "{sep}key={} {e}", show_key(key));
        }
        if failures.len() > MAX_LISTED {
            let _ = write!(msg, ", and {} more", failures.len() - MAX_LISTED);
        }
        emit(self.py, level, &msg);
    }
}

/// Raise an EngramStore failure: `ValueError` for a layout, `RuntimeError`
/// otherwise, with the failure's documented exact message; the
/// reason behind it is logged first on the `mooncake.store` logger.
pub(crate) trait OrRaise<T> {
    /// `Ok` as is; an error raised (and its reason logged) for `method`.
    fn or_raise(self, py: Python<'_>, method: &str) -> PyResult<T>;
}

impl<T> OrRaise<T> for mooncake_engram::Result<T> {
    fn or_raise(self, py: Python<'_>, method: &str) -> PyResult<T> {
        self.map_err(|e| raise(py, method, e))
    }
}

/// The exception of an EngramStore failure of `method` (see [`OrRaise`]).
pub(crate) fn raise(py: Python<'_>, method: &str, e: mooncake_engram::Error) -> PyErr {
    let message = e.message();
    if !e.reason().is_empty() {
        let code = e.code();
        let line = format!(
            "EngramStore.{method}: {message}: {code} ({}): {}",
            code.code(),
            e.reason()
        );
        emit(py, Level::of(e.code()), &line);
    }
    match e {
        mooncake_engram::Error::Layout(_) => PyValueError::new_err(message.into_owned()),
        _ => PyRuntimeError::new_err(message.into_owned()),
    }
}
