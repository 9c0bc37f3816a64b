//! What survives a master restart or failover: the ledger of this
//! client's committed replicas (`ledger`), streamed to the master
//! (`ledger_stream`), the disk tier (`disk`), and the copies the master
//! asks of this segment for copy and move tasks (`fetch`).

pub(crate) mod disk;
pub(crate) mod fetch;
pub(crate) mod ledger;
pub(crate) mod ledger_stream;
