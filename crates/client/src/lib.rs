//! mooncake-client (placeholder)
