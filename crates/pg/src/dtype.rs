//! Element types and reduction operators as they cross the Python boundary.
//!
//! Codes are small integers chosen by `mooncake.pg`; the extension never
//! sees a torch object.

use crate::error::PgError;

/// Element type of a tensor, by wire code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    /// `torch.uint8`.
    U8,
    /// `torch.int8`.
    I8,
    /// `torch.int16`.
    I16,
    /// `torch.uint16`.
    U16,
    /// `torch.int32`.
    I32,
    /// `torch.uint32`.
    U32,
    /// `torch.int64`.
    I64,
    /// `torch.uint64`.
    U64,
    /// `torch.bool` (0/1 bytes).
    Bool,
    /// `torch.float16`.
    F16,
    /// `torch.bfloat16`.
    BF16,
    /// `torch.float32`.
    F32,
    /// `torch.float64`.
    F64,
    /// Any other dtype (f8, complex, ...): movable bytes, not reducible.
    Raw,
}

impl DType {
    /// Decodes a wire code.
    pub fn from_code(code: u32) -> Result<Self, PgError> {
        use DType::*;
        Ok(match code {
            0 => U8,
            1 => I8,
            2 => I16,
            3 => U16,
            4 => I32,
            5 => U32,
            6 => I64,
            7 => U64,
            8 => Bool,
            9 => F16,
            10 => BF16,
            11 => F32,
            12 => F64,
            13 => Raw,
            _ => {
                return Err(PgError::InvalidArgument(format!(
                    "unknown dtype code {code}"
                )))
            }
        })
    }

    /// Size of one element in bytes (1 for `Raw`, which is counted in bytes).
    pub fn size(self) -> usize {
        use DType::*;
        match self {
            U8 | I8 | Bool | Raw => 1,
            I16 | U16 | F16 | BF16 => 2,
            I32 | U32 | F32 => 4,
            I64 | U64 | F64 => 8,
        }
    }

    /// True for floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }
}

/// Reduction operator, by wire code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum (wrapping for integers; OR for bool).
    Sum,
    /// Product (AND for bool).
    Product,
    /// Minimum (NaN propagates).
    Min,
    /// Maximum (NaN propagates).
    Max,
    /// Sum divided by the contributor count (floats only).
    Avg,
    /// Bitwise AND.
    BAnd,
    /// Bitwise OR.
    BOr,
    /// Bitwise XOR.
    BXor,
}

impl ReduceOp {
    /// Decodes a wire code.
    pub fn from_code(code: u32) -> Result<Self, PgError> {
        use ReduceOp::*;
        Ok(match code {
            0 => Sum,
            1 => Product,
            2 => Min,
            3 => Max,
            4 => Avg,
            5 => BAnd,
            6 => BOr,
            7 => BXor,
            _ => {
                return Err(PgError::InvalidArgument(format!(
                    "unknown reduce op code {code}"
                )))
            }
        })
    }
}

/// Checks that `op` is defined on `dtype`.
pub fn check_reduction(dtype: DType, op: ReduceOp) -> Result<(), PgError> {
    match (dtype, op) {
        (DType::Raw, _) => Err(PgError::InvalidArgument(
            "reductions are not supported for this dtype".into(),
        )),
        (d, ReduceOp::Avg) if !d.is_float() => Err(PgError::InvalidArgument(format!(
            "ReduceOp.AVG is only supported for floating-point dtypes, not {d:?}"
        ))),
        (d, ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor) if d.is_float() => Err(
            PgError::InvalidArgument(format!("bitwise reductions are not supported for {d:?}")),
        ),
        _ => Ok(()),
    }
}
