//! Publishing this client's segment descriptor to the metadata server
//! (`mooncake/ram/<segment>`, removed on close): an HTTP server
//! (`PUT <url>?key=...`, writes signed under a cluster token) or etcd. The
//! clients of both are the transfer engine's
//! ([`mooncake_transfer::engine::MetadataServer`]), which publishes engine
//! descriptors to the same servers.

pub(crate) use mooncake_transfer::engine::MetadataServer;
