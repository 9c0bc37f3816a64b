//! mooncake-transfer (placeholder)
