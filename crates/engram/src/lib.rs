//! EngramStore core (pure Rust, no Python): per-head embedding tables of one Engram layer
//! stored as raw row-major objects `engram:l{layer}:h{h}`, and the row
//! gather used by `EngramStore.lookup`. Every EngramStore rule lives here;
//! the Python binding converts arrays and raises [`Error`]s.
//!
//! - [`config`]: table dtypes, the layout and its checks, with the exact
//!   messages;
//! - [`convert`]: float16 / bfloat16 conversions over slices;
//! - [`error`]: the one error type ([`Error`]);
//! - [`ids`]: lookup row ids and their shape rules;
//! - [`store`]: populate (create-only with rollback), lookup with a cached
//!   location plan, and batched remove.

pub mod config;
pub mod convert;
pub mod error;
pub mod ids;
pub mod store;

pub use config::{
    empty_ids, ids_kind_ok, ids_not_integer_array, ids_not_integers, not_an_array, store_key,
    validate_layout, EngramConfig, Layout, OutKind, TableDtype,
};
pub use error::{Error, Result};
pub use ids::{Ids, IdsBuilder};
pub use store::{EngramCore, OutBuf, Table};
