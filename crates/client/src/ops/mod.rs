//! The store operations, as methods of [`Client`](crate::client::Client):
//! writes and upserts (`writes`), reads (`reads`), ranges (`ranges`),
//! replica locations (`locations`), multi-buffer values
//! (`multi_buffers`), put/get sessions (`sessions`), `BufferPool`
//! leases (`lease_pool`) and copy and move tasks (`tasks`).

pub(crate) mod lease_pool;
pub(crate) mod locations;
pub(crate) mod multi_buffers;
pub(crate) mod ranges;
pub(crate) mod reads;
pub(crate) mod sessions;
pub(crate) mod tasks;
pub(crate) mod writes;

use crate::error::{Error, Result};

/// The result of a one-key call made through its batch form.
pub(crate) fn only<T>(mut results: Vec<Result<T>>) -> Result<T> {
    results
        .pop()
        .unwrap_or_else(|| Err(Error::internal("no result")))
}

/// Check each of `n` items of a batch before any is sent: per item `Ok(())`
/// or why it fails, and the indices of the items that passed, in order.
pub(crate) fn screen(
    n: usize,
    check: impl FnMut(usize) -> Result<()>,
) -> (Vec<Result<()>>, Vec<usize>) {
    let results: Vec<Result<()>> = (0..n).map(check).collect();
    let passed = (0..n).filter(|&i| results[i].is_ok()).collect();
    (results, passed)
}
