//! Tensors over the store: reading and writing whole and parallel tensors
//! (`tensor_io`), the rules of tensor batches (`tensor_batch`) and
//! safetensors-style object IO (`safetensor_io`).

pub(crate) mod safetensor_io;
pub(crate) mod tensor_batch;
pub(crate) mod tensor_io;
