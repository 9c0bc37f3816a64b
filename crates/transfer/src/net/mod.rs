//! Socket I/O shared by the store's data path and the upstream-compatible
//! engine: scatter/gather sends and receives on raw descriptors
//! ([`sockio`]), the one pool of idle connections both keep to their peers
//! ([`pool`]), and the connection side of their server loops ([`server`]).

pub mod pool;
pub mod server;
pub mod sockio;
