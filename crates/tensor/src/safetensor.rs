//! Conversion between stored tensor objects and the safetensors file format
//! (`save_tensor_to_safetensor` / `load_tensor_from_safetensor`), through
//! the `safetensors` crate: a file holds the tensor under its store key, and
//! a file written by any safetensors writer loads.
//!
//! Rules: every one of the 15 stored dtypes maps to its safetensors dtype
//! (`float8_e4m3fn` is `F8_E4M3`); a file tensor of another dtype (`F4`,
//! complex, ...) or of more than 8 dimensions cannot be stored. When loading,
//! the tensor named like the store key is taken, else the first name in
//! sorted order (what `safetensors.torch.load_file(...).keys()` lists
//! first). A truncated file or a corrupt header is an error naming why.

use crate::dtype::DType;
use crate::error::{TensorError, TensorResult};
use crate::header::{Layout, TensorHeader, HEADER_SIZE};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

fn to_file_dtype(d: DType) -> Dtype {
    match d {
        DType::Float32 => Dtype::F32,
        DType::Float64 => Dtype::F64,
        DType::Int8 => Dtype::I8,
        DType::Uint8 => Dtype::U8,
        DType::Int16 => Dtype::I16,
        DType::Uint16 => Dtype::U16,
        DType::Int32 => Dtype::I32,
        DType::Uint32 => Dtype::U32,
        DType::Int64 => Dtype::I64,
        DType::Uint64 => Dtype::U64,
        DType::Bool => Dtype::BOOL,
        DType::Float16 => Dtype::F16,
        DType::BFloat16 => Dtype::BF16,
        DType::Float8E4M3Fn => Dtype::F8_E4M3,
        DType::Float8E5M2 => Dtype::F8_E5M2,
    }
}

fn from_file_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::Float32,
        Dtype::F64 => DType::Float64,
        Dtype::I8 => DType::Int8,
        Dtype::U8 => DType::Uint8,
        Dtype::I16 => DType::Int16,
        Dtype::U16 => DType::Uint16,
        Dtype::I32 => DType::Int32,
        Dtype::U32 => DType::Uint32,
        Dtype::I64 => DType::Int64,
        Dtype::U64 => DType::Uint64,
        Dtype::BOOL => DType::Bool,
        Dtype::F16 => DType::Float16,
        Dtype::BF16 => DType::BFloat16,
        Dtype::F8_E4M3 => DType::Float8E4M3Fn,
        Dtype::F8_E5M2 => DType::Float8E5M2,
        _ => return None,
    })
}

/// The safetensors file bytes of a stored tensor object (a whole tensor,
/// not a shard), holding it under `name`.
pub fn object_to_safetensors(name: &str, object: &[u8]) -> TensorResult<Vec<u8>> {
    let h = TensorHeader::decode(object, object.len() as u64)?;
    if h.layout != Layout::Full {
        return Err(TensorError::invalid(
            "the object is one shard of a parallel tensor, not a whole tensor",
        ));
    }
    let start = h.data_offset as usize;
    let data = object
        .get(start..start + h.data_bytes as usize)
        .ok_or_else(|| TensorError::corrupt("the object is shorter than its header says"))?;
    let shape: Vec<usize> = h.local_shape.iter().map(|&d| d as usize).collect();
    let view = TensorView::new(to_file_dtype(h.dtype), shape, data)
        .map_err(|e| TensorError::corrupt(format!("safetensors rejected the tensor: {e}")))?;
    safetensors::tensor::serialize([(name, view)], None)
        .map_err(|e| TensorError::invalid(format!("safetensors serialization failed: {e}")))
}

/// A tensor read from safetensors file bytes.
#[derive(Debug)]
pub struct FileTensor<'a> {
    /// The tensor's name in the file.
    pub name: String,
    /// Whether it is the tensor that was asked for by name.
    pub matched: bool,
    /// Header of the stored object that holds it.
    pub header: TensorHeader,
    /// Its payload, in the file's memory.
    pub data: &'a [u8],
}

impl FileTensor<'_> {
    /// The 304-byte header of the stored object.
    pub fn header_bytes(&self) -> [u8; HEADER_SIZE] {
        self.header.encode()
    }
}

/// The tensor named `wanted` in `file` (else the first name in sorted order).
pub fn tensor_from_safetensors<'a>(
    file: &'a [u8],
    wanted: Option<&str>,
) -> TensorResult<FileTensor<'a>> {
    let st = SafeTensors::deserialize(file)
        .map_err(|e| TensorError::corrupt(format!("not a valid safetensors file: {e}")))?;
    let mut names = st.names();
    names.sort_unstable();
    let (name, matched) = match wanted.filter(|w| names.contains(w)) {
        Some(w) => (w.to_string(), true),
        None => (
            names
                .first()
                .ok_or_else(|| TensorError::not_found("the safetensors file holds no tensors"))?
                .to_string(),
            false,
        ),
    };
    let view = st
        .tensor(&name)
        .map_err(|e| TensorError::corrupt(format!("tensor {name:?}: {e}")))?;
    let dtype = from_file_dtype(view.dtype()).ok_or_else(|| {
        TensorError::invalid(format!(
            "tensor {name:?} has dtype {:?}, which the store cannot hold",
            view.dtype()
        ))
    })?;
    let shape: Vec<u64> = view.shape().iter().map(|&d| d as u64).collect();
    let header = TensorHeader::full(dtype, &shape).ok_or_else(|| {
        TensorError::invalid(format!("tensor {name:?} has more than 8 dimensions"))
    })?;
    if header.data_bytes != view.data().len() as u64 {
        return Err(TensorError::corrupt(format!(
            "tensor {name:?}: payload size does not match its shape"
        )));
    }
    Ok(FileTensor {
        name,
        matched,
        header,
        data: view.data(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(dtype: DType, shape: &[u64], data: &[u8]) -> Vec<u8> {
        let h = TensorHeader::full(dtype, shape).unwrap();
        let mut v = h.encode().to_vec();
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn every_dtype_round_trips() {
        for d in DType::ALL {
            let n = d.itemsize() as usize * 6;
            let data: Vec<u8> = (0..n as u8).collect();
            let file = object_to_safetensors("k", &object(d, &[2, 3], &data)).unwrap();
            let t = tensor_from_safetensors(&file, Some("k")).unwrap();
            assert!(t.matched);
            assert_eq!(t.header.dtype, d);
            assert_eq!(t.header.local_shape, vec![2, 3]);
            assert_eq!(t.data, &data[..]);
        }
    }

    #[test]
    fn unknown_names_take_the_first_sorted_and_bad_files_fail() {
        let a = TensorView::new(Dtype::F32, vec![1], &[0, 0, 128, 63]).unwrap();
        let b = TensorView::new(Dtype::I8, vec![2], &[1, 2]).unwrap();
        let file = safetensors::tensor::serialize([("zeta", a), ("alpha", b)], None).unwrap();
        let t = tensor_from_safetensors(&file, Some("missing")).unwrap();
        assert_eq!((t.name.as_str(), t.matched), ("alpha", false));
        let e = tensor_from_safetensors(&file[..file.len() - 1], None).unwrap_err();
        assert!(e.reason.contains("not a valid safetensors file"), "{e}");
        let mut corrupt = file.clone();
        corrupt[9] = b'!';
        assert!(tensor_from_safetensors(&corrupt, None).is_err());
        assert!(tensor_from_safetensors(b"abc", None).is_err());
    }
}
