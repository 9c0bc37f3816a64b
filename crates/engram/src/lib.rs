//! EngramStore core (pure Rust, no Python): per-head embedding tables of one
//! Engram layer stored as raw row-major objects `engram:l{layer}:h{h}`, and
//! the row gather used by `EngramStore.lookup`.
//!
//! - [`config`]: table dtypes, layout validation with the exact spec messages;
//! - [`convert`]: float16 / bfloat16 conversions;
//! - [`store`]: populate (create-only with rollback), lookup with a cached
//!   location plan, and batched remove.

pub mod config;
pub mod convert;
pub mod store;

pub use config::{store_key, validate_layout, Layout, TableDtype};
pub use store::{EngramCore, LookupError, OutBuf, OutKind};
