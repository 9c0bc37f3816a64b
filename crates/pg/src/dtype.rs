//! Element types and reduction operators as they cross the Python boundary.
//!
//! Codes are small integers; the extension never sees a torch object. The
//! tables here are the single source of the codes: the Python package reads
//! them through `mooncake._native` ([`DType::table`], [`ReduceOp::table`])
//! instead of keeping its own copy. Reduction support: every integer type,
//! bool, f16, bf16, f32 and f64 reduce; AVG is floating-point only; bitwise
//! ops are integer/bool only; anything else (f8, complex) moves as raw bytes.

use crate::error::PgError;
use std::fmt;

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

const DTYPES: [(DType, &str); 14] = [
    (DType::U8, "uint8"),
    (DType::I8, "int8"),
    (DType::I16, "int16"),
    (DType::U16, "uint16"),
    (DType::I32, "int32"),
    (DType::U32, "uint32"),
    (DType::I64, "int64"),
    (DType::U64, "uint64"),
    (DType::Bool, "bool"),
    (DType::F16, "float16"),
    (DType::BF16, "bfloat16"),
    (DType::F32, "float32"),
    (DType::F64, "float64"),
    (DType::Raw, "raw"),
];

/// The wire-code methods of a fieldless enum `$ty` whose variants stand,
/// in code order, in `$table` with their names: `from_code` (an unknown
/// code is `PgError::$unknown`), `code`, `name` and `table`, documented by
/// the two strings.
macro_rules! wire_codes {
    ($ty:ident, $table:ident, $unknown:ident, name: $name_doc:literal, table: $table_doc:literal) => {
        impl $ty {
            /// Decodes a wire code.
            pub fn from_code(code: u32) -> Result<Self, PgError> {
                $table
                    .get(code as usize)
                    .map(|(v, _)| *v)
                    .ok_or(PgError::$unknown(code))
            }

            /// The wire code.
            pub fn code(self) -> u32 {
                self as u32
            }

            #[doc = $name_doc]
            pub fn name(self) -> &'static str {
                $table[self as usize].1
            }

            #[doc = $table_doc]
            pub fn table() -> Vec<(&'static str, u32)> {
                $table.iter().map(|(v, n)| (*n, v.code())).collect()
            }
        }
    };
}

wire_codes!(
    DType,
    DTYPES,
    UnknownDtype,
    name: "The torch attribute name (`\"float32\"`), or `\"raw\"`.",
    table: "Every `(torch name, code)` pair; `\"raw\"` is the code for any dtype \
            that is moved but never reduced."
);

impl DType {
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

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "torch.{}", self.name())
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

const OPS: [(ReduceOp, &str); 8] = [
    (ReduceOp::Sum, "SUM"),
    (ReduceOp::Product, "PRODUCT"),
    (ReduceOp::Min, "MIN"),
    (ReduceOp::Max, "MAX"),
    (ReduceOp::Avg, "AVG"),
    (ReduceOp::BAnd, "BAND"),
    (ReduceOp::BOr, "BOR"),
    (ReduceOp::BXor, "BXOR"),
];

wire_codes!(
    ReduceOp,
    OPS,
    UnknownOp,
    name: "The `torch.distributed.ReduceOp` attribute name (`\"SUM\"`).",
    table: "Every `(ReduceOp name, code)` pair."
);

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Checks that `op` is defined on `dtype`.
pub(crate) fn check_reduction(dtype: DType, op: ReduceOp) -> Result<(), PgError> {
    let reason = match (dtype, op) {
        (DType::Raw, _) => "reductions are not supported for this dtype",
        (d, ReduceOp::Avg) if !d.is_float() => "AVG is only defined for floating-point dtypes",
        (d, ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor) if d.is_float() => {
            "bitwise reductions are only defined for integer and bool dtypes"
        }
        _ => return Ok(()),
    };
    Err(PgError::UnsupportedReduction {
        dtype: dtype.name(),
        op: op.name(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_codes_are_rejected() {
        for (name, code) in DType::table() {
            let d = DType::from_code(code).expect("known code");
            assert_eq!((d.name(), d.code()), (name, code));
        }
        for (name, code) in ReduceOp::table() {
            let o = ReduceOp::from_code(code).expect("known code");
            assert_eq!((o.name(), o.code()), (name, code));
        }
        assert!(matches!(
            DType::from_code(14),
            Err(PgError::UnknownDtype(14))
        ));
        assert!(matches!(ReduceOp::from_code(8), Err(PgError::UnknownOp(8))));
    }

    #[test]
    fn reduction_matrix() {
        assert!(check_reduction(DType::BF16, ReduceOp::Avg).is_ok());
        assert!(check_reduction(DType::Bool, ReduceOp::BXor).is_ok());
        for (d, o) in [
            (DType::I32, ReduceOp::Avg),
            (DType::F32, ReduceOp::BAnd),
            (DType::Raw, ReduceOp::Sum),
        ] {
            let e = check_reduction(d, o).expect_err("unsupported");
            assert!(e.to_string().contains(d.name()), "{e}");
        }
    }
}
