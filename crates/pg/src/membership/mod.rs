//! The membership control plane: the coordinator (one per process tree,
//! in the store-hosting process), a process's session with it (`agent`),
//! their messages (`control`), connection admission (`handshake`,
//! `admission`) and the data-plane listener and dial (`engine`).

pub(crate) mod admission;
pub(crate) mod agent;
pub(crate) mod control;
pub(crate) mod coordinator;
pub(crate) mod engine;
pub(crate) mod handshake;
