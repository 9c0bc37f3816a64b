//! The rules a batch tensor call applies before it writes anything, shared
//! by every binding of the batch methods:
//!
//! - the per-item lists (keys, tensors, buffers, sizes) have one entry per
//!   key, or every item fails with INVALID_PARAMS and nothing is written;
//! - a batch `_from` write from raw buffers is all or nothing: one buffer
//!   that is not a tensor object fails every item;
//! - per-item parallelism requests and per-item writer partitions are
//!   mutually exclusive; neither given means FULL objects.

use crate::error::{Error, Result};
use crate::tensor::tensor_io::object_source;

/// The per-item lists of a batch call have one entry per key.
pub fn check_lengths(keys: usize, others: &[usize]) -> Result<()> {
    if others.iter().any(|&m| m != keys) {
        return Err(Error::invalid(format!(
            "argument lists differ in length ({keys} keys, {others:?})"
        )));
    }
    Ok(())
}

/// Every `(address, size)` buffer of a batch `_from` write holds a tensor
/// object; the first that does not names its item and key.
///
/// # Safety
/// Each buffer's first `min(size, 304)` bytes must be readable.
pub unsafe fn check_object_sources(keys: &[String], bufs: &[(usize, u64)]) -> Result<()> {
    for (i, (&(ptr, size), key)) in bufs.iter().zip(keys).enumerate() {
        // SAFETY: forwarded from the caller's contract.
        if let Err(e) = unsafe { object_source(ptr, size) } {
            return Err(e.context(format!("item {i} ({key:?})")));
        }
    }
    Ok(())
}

/// One item's write request of a batch `*_with_parallelism` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemRequest<P, W> {
    /// A parallelism request for this item.
    Parallelism(P),
    /// A writer partition for this item.
    Writer(W),
}

/// The per-item requests of a batch call from its two optional lists
/// (each already checked to hold one entry per key): both given is
/// INVALID_PARAMS; neither gives `None` (FULL objects).
pub fn item_requests<P, W>(
    parallelisms: Option<Vec<P>>,
    writers: Option<Vec<W>>,
) -> Result<Option<Vec<ItemRequest<P, W>>>> {
    match (parallelisms, writers) {
        (Some(_), Some(_)) => Err(Error::invalid(
            "parallelisms and writer_partitions are mutually exclusive",
        )),
        (None, None) => Ok(None),
        (Some(ps), None) => Ok(Some(ps.into_iter().map(ItemRequest::Parallelism).collect())),
        (None, Some(ws)) => Ok(Some(ws.into_iter().map(ItemRequest::Writer).collect())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn lists_must_match_the_keys() {
        assert!(check_lengths(3, &[3, 3]).is_ok());
        assert!(check_lengths(0, &[]).is_ok());
        let e = check_lengths(3, &[3, 2])
            .err()
            .map(|e| (e.code(), e.to_string()));
        let (code, text) = e.unwrap_or((ErrorCode::InternalError, String::new()));
        assert_eq!(code, ErrorCode::InvalidParams);
        assert!(text.contains("3 keys"), "{text}");
    }

    #[test]
    fn one_bad_buffer_names_its_item() {
        let keys = vec!["a".to_string(), "b".to_string()];
        // A null buffer is refused before anything is read.
        // SAFETY: no buffer is read: the first item is null.
        let r = unsafe { check_object_sources(&keys, &[(0, 16), (0, 16)]) };
        let text = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("item 0") && text.contains("\"a\""), "{text}");
    }

    #[test]
    fn parallelisms_and_writers_exclude_each_other() {
        let none: Option<Vec<u8>> = None;
        assert_eq!(item_requests::<u8, u8>(None, None).ok(), Some(None));
        assert_eq!(
            item_requests(Some(vec![1u8, 2]), none.clone()).ok(),
            Some(Some(vec![
                ItemRequest::Parallelism(1),
                ItemRequest::Parallelism(2)
            ]))
        );
        assert_eq!(
            item_requests(none, Some(vec![7u8])).ok(),
            Some(Some(vec![ItemRequest::Writer(7)]))
        );
        let both = item_requests(Some(vec![1u8]), Some(vec![2u8]));
        assert_eq!(both.err().map(|e| e.code()), Some(ErrorCode::InvalidParams));
    }
}
