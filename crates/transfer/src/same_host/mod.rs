//! Copies to and from another process of the same host without TCP. There
//! are two mechanisms, one per face:
//!
//! - [`mapping`]: the owner of a segment hands its `memfd` over an abstract
//!   Unix socket (SCM_RIGHTS); a reader maps it once and from then on
//!   copies with `memcpy`, no system call per transfer. The store's data
//!   path ([`crate::data_path`]) uses it: the store allocates the memory it
//!   serves as its own segments, so there is always a descriptor to hand
//!   over.
//! - `process_vm`: one `process_vm_readv` / `process_vm_writev` per batch
//!   between this process's memory and the other process's, nothing
//!   mapped. The transfer engine ([`crate::engine`]) uses it: it serves
//!   whatever memory its caller registered (a heap buffer, a tensor), which
//!   no descriptor describes, so it cannot be mapped by another process.
//!   The kernel allows it only towards a process this one may ptrace; the
//!   engine falls back to TCP when refused.

pub mod mapping;
pub(crate) mod process_vm;
