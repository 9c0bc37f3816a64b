//! Socket I/O shared by the store's data path and the upstream-compatible
//! engine: scatter/gather sends and receives on raw descriptors
//! ([`sockio`]), and the one pool of idle connections both keep to their
//! peers ([`pool`]).

pub mod pool;
pub mod sockio;
