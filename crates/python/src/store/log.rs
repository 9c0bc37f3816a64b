//! Error-path logging through Python's `logging.getLogger("mooncake.store")`.
//!
//! Every failing return of a store method logs exactly one line: INFO when
//! the failure is OBJECT_NOT_FOUND (-704), WARNING otherwise. Nothing is
//! logged on success paths.

use mooncake_common::ErrorCode;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use std::fmt::Write;

static LOGGER: GILOnceCell<Py<PyAny>> = GILOnceCell::new();

/// Longest key (in chars) written into a log line before it is shortened.
const MAX_KEY_CHARS: usize = 200;
/// How many failing items a batch log line names before summarising.
const MAX_LISTED: usize = 8;

/// Python logging levels.
#[derive(Clone, Copy)]
pub enum Level {
    Info,
    Warning,
}

impl Level {
    /// INFO for OBJECT_NOT_FOUND, WARNING for everything else.
    pub fn for_code(code: i64) -> Level {
        if code == ErrorCode::ObjectNotFound.code() as i64 {
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
pub fn emit(py: Python<'_>, level: Level, msg: &str) {
    let Some(logger) = logger(py) else { return };
    let method = match level {
        Level::Info => "info",
        Level::Warning => "warning",
    };
    // `%s` keeps user text (keys may contain '%') out of the format string.
    let _ = logger.call_method1(method, ("%s", msg));
}

/// `"name" (code)` for a status code, `UNKNOWN_ERROR` for values outside the table.
pub fn describe(code: i64) -> String {
    let known = i32::try_from(code)
        .ok()
        .map(ErrorCode::from_code)
        .filter(|c| c.code() as i64 == code);
    match known {
        Some(c) => format!("{} ({code})", c.name()),
        None => format!("UNKNOWN_ERROR ({code})"),
    }
}

/// A key as shown in log lines: quoted, and shortened when very long.
pub fn show_key(key: &str) -> String {
    if key.chars().count() <= MAX_KEY_CHARS {
        format!("{key:?}")
    } else {
        let head: String = key.chars().take(MAX_KEY_CHARS).collect();
        format!("{head:?}...")
    }
}

/// Log one failed single-key call: `method: key="k": NAME (code): detail`.
pub fn fail(py: Python<'_>, method: &str, key: Option<&str>, code: i64, detail: &str) {
    let mut msg = String::from(method);
    if let Some(k) = key {
        let _ = write!(msg, ": key={}", show_key(k));
    }
    let _ = write!(msg, ": {}", describe(code));
    if !detail.is_empty() {
        let _ = write!(msg, ": {detail}");
    }
    emit(py, Level::for_code(code), &msg);
}

/// One log line for the negative codes of a per-key result list.
pub fn fail_codes<T: Copy + Into<i64>>(py: Python<'_>, method: &str, keys: &[String], codes: &[T]) {
    let failures: Vec<(&str, i64)> = keys
        .iter()
        .zip(codes)
        .map(|(k, c)| (k.as_str(), (*c).into()))
        .filter(|(_, c)| *c < 0)
        .collect();
    fail_batch(py, method, &failures, keys.len());
}

/// One log line for the failed entries of a per-key result list; returns
/// the successful values, `None` where an entry failed.
pub fn fail_results<T>(
    py: Python<'_>,
    method: &str,
    keys: &[String],
    results: Vec<Result<T, i64>>,
) -> Vec<Option<T>> {
    let failures: Vec<(&str, i64)> = keys
        .iter()
        .zip(&results)
        .filter_map(|(k, r)| r.as_ref().err().map(|c| (k.as_str(), *c)))
        .collect();
    fail_batch(py, method, &failures, keys.len());
    results.into_iter().map(Result::ok).collect()
}

/// Log one line for a batch call with per-item failures `(key, code)` out of
/// `total` items. Does nothing when `failures` is empty. INFO only when every
/// failure is OBJECT_NOT_FOUND.
pub fn fail_batch(py: Python<'_>, method: &str, failures: &[(&str, i64)], total: usize) {
    if failures.is_empty() {
        return;
    }
    let level = if failures
        .iter()
        .all(|&(_, c)| matches!(Level::for_code(c), Level::Info))
    {
        Level::Info
    } else {
        Level::Warning
    };
    let mut msg = format!("{method}: {} of {total} items failed:", failures.len());
    for (i, (key, code)) in failures.iter().take(MAX_LISTED).enumerate() {
        let sep = if i == 0 { " " } else { ", " };
        let _ = write!(msg, "{sep}key={} {}", show_key(key), describe(*code));
    }
    if failures.len() > MAX_LISTED {
        let _ = write!(msg, ", and {} more", failures.len() - MAX_LISTED);
    }
    emit(py, level, &msg);
}

/// Log a failure that applies to every item of a batch call (closed store,
/// invalid arguments): `method: N items: NAME (code): detail`.
pub fn fail_all(py: Python<'_>, method: &str, n: usize, code: i64, detail: &str) {
    let mut msg = format!("{method}: {n} items: {}", describe(code));
    if !detail.is_empty() {
        let _ = write!(msg, ": {detail}");
    }
    emit(py, Level::for_code(code), &msg);
}
