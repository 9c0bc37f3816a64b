//! mooncake-pg (placeholder)
