//! mooncake-engram (placeholder)
