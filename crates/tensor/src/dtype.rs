//! The 15 element types a stored tensor object may hold, with upstream's
//! numeric codes (the `dtype` field of the header and the manifest) and the
//! torch names the Python front maps them from and to.

use crate::error::TensorError;

/// Element type of a stored tensor. The discriminant is the code stored in
/// headers and manifests (upstream's enum values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum DType {
    /// `torch.float32`, code 0.
    Float32 = 0,
    /// `torch.float64`, code 1.
    Float64 = 1,
    /// `torch.int8`, code 2.
    Int8 = 2,
    /// `torch.uint8`, code 3.
    Uint8 = 3,
    /// `torch.int16`, code 4.
    Int16 = 4,
    /// `torch.uint16`, code 5.
    Uint16 = 5,
    /// `torch.int32`, code 6.
    Int32 = 6,
    /// `torch.uint32`, code 7.
    Uint32 = 7,
    /// `torch.int64`, code 8.
    Int64 = 8,
    /// `torch.uint64`, code 9.
    Uint64 = 9,
    /// `torch.bool`, code 10.
    Bool = 10,
    /// `torch.float16`, code 11.
    Float16 = 11,
    /// `torch.bfloat16`, code 12.
    BFloat16 = 12,
    /// `torch.float8_e4m3fn`, code 13.
    Float8E4M3Fn = 13,
    /// `torch.float8_e5m2`, code 14.
    Float8E5M2 = 14,
}

impl DType {
    /// Every dtype, in code order.
    pub const ALL: [DType; 15] = [
        DType::Float32,
        DType::Float64,
        DType::Int8,
        DType::Uint8,
        DType::Int16,
        DType::Uint16,
        DType::Int32,
        DType::Uint32,
        DType::Int64,
        DType::Uint64,
        DType::Bool,
        DType::Float16,
        DType::BFloat16,
        DType::Float8E4M3Fn,
        DType::Float8E5M2,
    ];

    /// The stored code.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The dtype for a stored code, if the code is one of the 15.
    pub fn from_code(code: i32) -> Option<DType> {
        usize::try_from(code)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
    }

    /// Bytes per element.
    pub fn itemsize(self) -> u64 {
        match self {
            DType::Float64 | DType::Int64 | DType::Uint64 => 8,
            DType::Float32 | DType::Int32 | DType::Uint32 => 4,
            DType::Int16 | DType::Uint16 | DType::Float16 | DType::BFloat16 => 2,
            DType::Int8 | DType::Uint8 | DType::Bool | DType::Float8E4M3Fn | DType::Float8E5M2 => 1,
        }
    }

    /// The torch attribute name (`torch.<name>`).
    pub fn torch_name(self) -> &'static str {
        match self {
            DType::Float32 => "float32",
            DType::Float64 => "float64",
            DType::Int8 => "int8",
            DType::Uint8 => "uint8",
            DType::Int16 => "int16",
            DType::Uint16 => "uint16",
            DType::Int32 => "int32",
            DType::Uint32 => "uint32",
            DType::Int64 => "int64",
            DType::Uint64 => "uint64",
            DType::Bool => "bool",
            DType::Float16 => "float16",
            DType::BFloat16 => "bfloat16",
            DType::Float8E4M3Fn => "float8_e4m3fn",
            DType::Float8E5M2 => "float8_e5m2",
        }
    }

    /// Parse `str(tensor.dtype)` (`"torch.float32"`) or a bare name,
    /// including torch's aliases (`float`, `half`, `long`, ...). Complex,
    /// quantized and other float8 variants are rejected with the reason.
    pub fn from_torch_name(name: &str) -> Result<DType, TensorError> {
        let bare = name.strip_prefix("torch.").unwrap_or(name);
        let dt = match bare {
            "float32" | "float" => DType::Float32,
            "float64" | "double" => DType::Float64,
            "int8" => DType::Int8,
            "uint8" => DType::Uint8,
            "int16" | "short" => DType::Int16,
            "uint16" => DType::Uint16,
            "int32" | "int" => DType::Int32,
            "uint32" => DType::Uint32,
            "int64" | "long" => DType::Int64,
            "uint64" => DType::Uint64,
            "bool" => DType::Bool,
            "float16" | "half" => DType::Float16,
            "bfloat16" => DType::BFloat16,
            "float8_e4m3fn" => DType::Float8E4M3Fn,
            "float8_e5m2" => DType::Float8E5M2,
            _ => {
                return Err(TensorError::invalid(format!(
                    "unsupported tensor dtype {name}"
                )))
            }
        };
        Ok(dt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_match_upstream_table() {
        for (i, d) in DType::ALL.iter().enumerate() {
            assert_eq!(d.code(), i as i32);
            assert_eq!(DType::from_code(i as i32), Some(*d));
            assert_eq!(
                DType::from_torch_name(&format!("torch.{}", d.torch_name())),
                Ok(*d)
            );
        }
        assert_eq!(DType::from_code(15), None);
        assert_eq!(DType::from_code(-1), None);
        assert_eq!(DType::BFloat16.code(), 12);
        assert_eq!(DType::Float8E5M2.code(), 14);
    }

    #[test]
    fn itemsizes() {
        assert_eq!(DType::Float32.itemsize(), 4);
        assert_eq!(DType::Float64.itemsize(), 8);
        assert_eq!(DType::BFloat16.itemsize(), 2);
        assert_eq!(DType::Bool.itemsize(), 1);
        assert_eq!(DType::Float8E4M3Fn.itemsize(), 1);
        assert_eq!(DType::Uint64.itemsize(), 8);
    }

    #[test]
    fn unsupported_dtypes_are_rejected_with_reason() {
        for bad in [
            "torch.complex64",
            "torch.complex128",
            "torch.qint8",
            "torch.quint8",
            "torch.float8_e4m3fnuz",
            "torch.float8_e5m2fnuz",
            "",
        ] {
            let e = DType::from_torch_name(bad).unwrap_err();
            assert_eq!(e.code(), -600);
            assert!(e.to_string().contains("unsupported tensor dtype"), "{e}");
        }
        assert_eq!(DType::from_torch_name("torch.half"), Ok(DType::Float16));
    }
}
