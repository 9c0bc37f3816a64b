//! The store operations, as methods of [`Client`](crate::client::Client):
//! writes and upserts (`writes`), reads (`reads`), ranges (`ranges`),
//! replica locations (`locations`), multi-buffer values
//! (`multi_buffers`), put/get sessions (`sessions`) and `BufferPool`
//! leases (`lease_pool`).

pub(crate) mod lease_pool;
pub(crate) mod locations;
pub(crate) mod multi_buffers;
pub(crate) mod ranges;
pub(crate) mod reads;
pub(crate) mod sessions;
pub(crate) mod writes;
