//! This client's side of the master: the RPC connection and its
//! failover (`master_conn`), finding the master (`discovery`), read-ticket
//! completion reports (`done`) and publishing the segment descriptor to an
//! HTTP metadata server (`metadata_pub`).

pub(crate) mod discovery;
pub(crate) mod done;
pub(crate) mod master_conn;
pub(crate) mod metadata_pub;
