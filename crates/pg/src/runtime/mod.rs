//! A member's running state and its threads: the state they share
//! (`shared`), the executor that runs ops in order (`executor`), one op's
//! progress (`progress`), one link's socket reader (`reader`), silent-peer
//! detection (`watchdog`), failed ops awaiting reconciliation (`syncer`),
//! and how the member admits links and applies the coordinator's pushes
//! (`member`).

pub(crate) mod executor;
pub(crate) mod member;
pub(crate) mod progress;
pub(crate) mod reader;
pub(crate) mod shared;
pub(crate) mod syncer;
pub(crate) mod watchdog;
