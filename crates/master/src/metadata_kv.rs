//! In-memory key → bytes map behind the embedded HTTP metadata server,
//! including the `rpc_meta` duplicate rule and the per-segment
//! cleanup used by `--enable_metadata_cleanup_on_timeout`.

use std::collections::HashMap;

use parking_lot::RwLock;

/// Result of [`MetadataKv::put`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The value was stored (new key, or overwrite of a non-`rpc_meta` key).
    Updated,
    /// An `rpc_meta` key already held exactly this value; nothing changed.
    Unchanged,
    /// An `rpc_meta` key already held a different value; rejected.
    DuplicateRpcMeta,
}

/// Thread-safe in-memory metadata store (not persisted).
#[derive(Debug, Default)]
pub struct MetadataKv {
    map: RwLock<HashMap<String, Vec<u8>>>,
}

impl MetadataKv {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The stored bytes for `key`, if any.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.map.read().get(key).cloned()
    }

    /// Store `value` under `key`. Keys containing `rpc_meta` may not be
    /// overwritten with a different value (upstream rule).
    pub fn put(&self, key: &str, value: Vec<u8>) -> PutOutcome {
        let mut map = self.map.write();
        if key.contains("rpc_meta") {
            if let Some(old) = map.get(key) {
                return if *old == value {
                    PutOutcome::Unchanged
                } else {
                    PutOutcome::DuplicateRpcMeta
                };
            }
        }
        map.insert(key.to_string(), value);
        PutOutcome::Updated
    }

    /// Remove `key`; `true` if it existed.
    pub fn delete(&self, key: &str) -> bool {
        self.map.write().remove(key).is_some()
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.map.read().len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.map.read().is_empty()
    }

    /// Key under which a client publishes its segment descriptor.
    pub fn segment_key(segment: &str) -> String {
        format!("mooncake/ram/{segment}")
    }

    /// Metadata cleanup for an expired client: delete
    /// `mooncake/ram/<segment>`. Returns `true` if it existed.
    pub fn cleanup_segment(&self, segment: &str) -> bool {
        self.delete(&Self::segment_key(segment))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_delete() {
        let kv = MetadataKv::new();
        assert!(kv.is_empty());
        assert_eq!(kv.get("k"), None);
        assert_eq!(kv.put("k", b"{\"a\":1}".to_vec()), PutOutcome::Updated);
        assert_eq!(kv.get("k").as_deref(), Some(&b"{\"a\":1}"[..]));
        assert_eq!(kv.put("k", b"other".to_vec()), PutOutcome::Updated);
        assert_eq!(kv.get("k").as_deref(), Some(&b"other"[..]));
        assert_eq!(kv.len(), 1);
        assert!(kv.delete("k"));
        assert!(!kv.delete("k"));
    }

    #[test]
    fn rpc_meta_duplicate_rule() {
        let kv = MetadataKv::new();
        let k = "mooncake/rpc_meta/h";
        assert_eq!(kv.put(k, b"x".to_vec()), PutOutcome::Updated);
        assert_eq!(kv.put(k, b"x".to_vec()), PutOutcome::Unchanged);
        assert_eq!(kv.put(k, b"y".to_vec()), PutOutcome::DuplicateRpcMeta);
        assert_eq!(kv.get(k).as_deref(), Some(&b"x"[..]));
        assert!(kv.delete(k));
        assert_eq!(kv.put(k, b"y".to_vec()), PutOutcome::Updated);
    }

    #[test]
    fn cleanup_segment() {
        let kv = MetadataKv::new();
        kv.put("mooncake/ram/127.0.0.1:12345", b"d".to_vec());
        kv.put("mooncake/rpc_meta/127.0.0.1:12345", b"r".to_vec());
        assert!(kv.cleanup_segment("127.0.0.1:12345"));
        assert!(!kv.cleanup_segment("127.0.0.1:12345"));
        assert_eq!(kv.len(), 1);
    }
}
