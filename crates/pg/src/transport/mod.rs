//! Moving bytes between members: one peer connection (`link`), same-host
//! rings and doorbells (`shm`, `futex`), the data framing (`wire`) and
//! the copy kernels (`copy`).

pub(crate) mod copy;
pub(crate) mod futex;
pub(crate) mod link;
pub(crate) mod shm;
pub(crate) mod wire;
