//! What survives a master restart or failover: the ledger of this
//! client's committed replicas (`ledger`), streamed to the master
//! (`ledger_stream`), and the disk tier (`disk`).

pub(crate) mod disk;
pub(crate) mod ledger;
pub(crate) mod ledger_stream;
