//! Publishing this client's segment descriptor to an HTTP metadata server
//! (`PUT <url>?key=mooncake/ram/<segment>`, removed on close). The HTTP
//! client, with the signing of writes under a cluster token, is the
//! transfer engine's ([`mooncake_engine::HttpMetadata`]), which publishes
//! engine descriptors to the same servers.

pub(crate) use mooncake_engine::HttpMetadata as MetadataUrl;
