//! Collectives as data: algorithms as phases (`plan`), reduction kernels
//! (`reduce`), retained reduction inputs and pulls for all-or-nothing
//! inclusion (`retain`) and point-to-point matching (`p2p`).

pub(crate) mod p2p;
pub(crate) mod plan;
pub(crate) mod reduce;
pub(crate) mod retain;
