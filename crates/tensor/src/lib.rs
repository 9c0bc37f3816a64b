//! Tensor IO domain rules for the Mooncake store, with no I/O.
//!
//! This crate owns everything about tensor objects that does not touch the
//! network: the stored format (the 304-byte header and the 96-byte
//! manifest, byte-compatible with upstream Mooncake 0.3.13), canonical key
//! naming, validation of parallelism requests and writer partitions, write
//! planning (which objects a write produces and which byte runs of the
//! source form each payload) and read planning (which objects to probe, then
//! which ranges assemble the result: `(key, src_offset, dst_offset, len)`,
//! repeated `count` times at two strides for the rows of one dimension).
//! The store client's executor (`mooncake-client`, `tensor_io`) runs these
//! plans; the Python front only converts arguments. Keeping the rules here,
//! pure, lets them be tested exhaustively (unit and property tests) without
//! a master.

mod axis;
mod dtype;
mod error;
mod geometry;
mod header;
mod keys;
mod le;
mod manifest;
mod read_plan;
mod safetensor;
mod write_plan;

pub use axis::{Axis, AxisKind, Parallelism, RawAxis, RawWriterPartition, WriterPartition};
pub use dtype::DType;
pub use error::{TensorError, TensorResult};
pub use geometry::{copy_rows, copy_runs, numel, CopyRows, CopyRun, Region};
pub use header::{
    payload_bytes, Layout, StoredAxis, TensorHeader, HEADER_SIZE, MAX_AXES, MAX_NDIM, TENSOR_MAGIC,
    TENSOR_VERSION,
};
pub use keys::{
    parallelism_manifest_key, shard_key, tp_key, writer_manifest_key, writer_shard_key,
};
pub use manifest::{Manifest, LAYOUT_MAGIC, MANIFEST_MAGIC, MANIFEST_SIZE, MANIFEST_VERSION};
pub use read_plan::{
    resolve, Observations, Observed, PlanRange, PlanSource, ReadMode, ReadOutput, ReadPlan,
    ReadRequest, Step, MAX_SET_MEMBERS, PROBE_PREFIX,
};
pub use safetensor::{object_to_safetensors, tensor_from_safetensors, FileTensor};
pub use write_plan::{
    plan_write, route_for, route_for_object, route_for_tp, PlannedObject, WritePlan, WriteRoute,
    WriteSource,
};

#[cfg(test)]
mod sim;
