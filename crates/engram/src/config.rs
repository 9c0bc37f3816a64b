//! The layout of one Engram layer and every rule about it (configuration,
//! construction, `populate`, `lookup`, `lookup_into`):
//!
//! * [`EngramConfig`]: the settable fields with upstream's defaults
//!   (`[1024]`, 64, float32); assignment does not validate.
//! * [`validate_layout`]: the construction checks, in upstream's order and
//!   with its exact `ValueError` messages.
//! * [`Layout`]: per-call shape rules with their exact messages: one table
//!   per head of shape `[N_h, D]`, ids of shape `[B, L, H]`, and the output
//!   dtypes a lookup may write (the table dtype or float32).
//! * [`TableDtype`]: element types, which populate inputs are accepted and
//!   how they are taken (raw bits, or float32 narrowed here with
//!   round-to-nearest-even).
//! * The rules for the arrays a caller hands over (NumPy dtype kinds,
//!   empty or non-integer ids) with their messages: [`ids_kind_ok`],
//!   [`ids_not_integer_array`], [`not_an_array`], [`empty_ids`],
//!   [`ids_not_integers`].

use crate::error::{Error, Result};
use std::fmt;

/// Element type of the stored tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableDtype {
    /// IEEE single precision (upstream's only type).
    Float32,
    /// IEEE half precision.
    Float16,
    /// bfloat16 (the upper half of a float32).
    BFloat16,
}

/// How a lookup writes its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutKind {
    /// The table dtype itself (raw bits for bfloat16).
    Raw,
    /// float32 (converted from half-precision tables).
    Float32,
}

impl TableDtype {
    /// Parse a normalised dtype name.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "float32" => Some(Self::Float32),
            "float16" => Some(Self::Float16),
            "bfloat16" => Some(Self::BFloat16),
            _ => None,
        }
    }

    /// The canonical name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Float32 => "float32",
            Self::Float16 => "float16",
            Self::BFloat16 => "bfloat16",
        }
    }

    /// Bytes per element.
    pub fn itemsize(self) -> usize {
        match self {
            Self::Float32 => 4,
            Self::Float16 | Self::BFloat16 => 2,
        }
    }

    /// A populate input whose NumPy dtype kind is `kind` must be numeric
    /// (`b`, `i`, `u`, `f`, `c`: it is cast to the table dtype, upstream's
    /// forcecast); object, string and other arrays are rejected.
    pub fn check_input_kind(self, kind: &str) -> Result<()> {
        if kind.len() == 1 && "biufc".contains(kind) {
            Ok(())
        } else {
            Err(self.not_castable())
        }
    }

    /// A populate input that cannot be cast to this dtype.
    pub fn not_castable(self) -> Error {
        Error::Argument(format!("embedding_buffers must be {self} arrays").into())
    }

    /// The element type `populate` casts an input array whose elements are
    /// `input` (a NumPy dtype name) to before handing it over: float32
    /// (values a float32 table stores, or this crate narrows to a half
    /// type with round-to-nearest-even, without the GIL), `float16` (NumPy
    /// casts non-float32 input for a float16 table), or `uint16` (raw
    /// bfloat16 bits, taken as they are).
    pub fn populate_cast(self, input: &str) -> &'static str {
        match self {
            Self::Float32 => "float32",
            Self::Float16 if input == "float32" => "float32",
            Self::Float16 => "float16",
            Self::BFloat16 if input == "uint16" => "uint16",
            Self::BFloat16 => "float32",
        }
    }

    /// The output `lookup` allocates: its element type name and kind
    /// (float16 tables give float16, the others float32).
    pub fn lookup_output(self) -> (&'static str, OutKind) {
        match self {
            Self::Float16 => ("float16", OutKind::Raw),
            Self::Float32 | Self::BFloat16 => ("float32", OutKind::Float32),
        }
    }

    /// The element type names `lookup_into` accepts for its output: the
    /// table dtype (`uint16` raw bits for bfloat16) or float32.
    pub fn lookup_into_outputs(self) -> &'static [&'static str] {
        match self {
            Self::Float32 => &["float32"],
            Self::Float16 => &["float16", "float32"],
            Self::BFloat16 => &["uint16", "float32"],
        }
    }
}

impl fmt::Display for TableDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The settable fields of `EngramStoreConfig`; validated only when a layer
/// is built from them ([`EngramConfig::layout`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngramConfig {
    /// Rows per head.
    pub table_vocab_sizes: Vec<i64>,
    /// Row width.
    pub embedding_dim: i32,
    /// Element type name.
    pub table_dtype: String,
}

impl Default for EngramConfig {
    /// Upstream's defaults: one head of 1024 rows, width 64, float32.
    fn default() -> Self {
        EngramConfig {
            table_vocab_sizes: vec![1024],
            embedding_dim: 64,
            table_dtype: TableDtype::Float32.name().into(),
        }
    }
}

impl EngramConfig {
    /// The validated layout ([`validate_layout`]).
    pub fn layout(&self) -> Result<Layout> {
        validate_layout(
            &self.table_vocab_sizes,
            i64::from(self.embedding_dim),
            &self.table_dtype,
        )
    }
}

/// A validated layer layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Rows per head (`N_h`), all positive.
    pub vocab_sizes: Vec<u64>,
    /// Row width `D`, positive.
    pub dim: usize,
    /// Table element type.
    pub dtype: TableDtype,
}

impl Layout {
    /// Number of heads `H`.
    pub fn num_heads(&self) -> usize {
        self.vocab_sizes.len()
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.dim * self.dtype.itemsize()
    }

    /// Bytes of the table of head `h`.
    pub fn table_bytes(&self, h: usize) -> u64 {
        self.vocab_sizes[h] * self.row_bytes() as u64
    }

    /// `populate` gets one table per head.
    pub fn check_table_count(&self, n: usize) -> Result<()> {
        if n == self.num_heads() {
            Ok(())
        } else {
            Err(Error::Argument(
                "embedding_buffers size must match num_heads".into(),
            ))
        }
    }

    /// The table of head `h` has shape `[N_h, D]`.
    pub fn check_table_shape(&self, h: usize, shape: &[usize]) -> Result<()> {
        if shape.len() != 2 {
            return Err(Error::Argument(
                "each embedding buffer must be 2D [N_h, D]".into(),
            ));
        }
        let want = self.vocab_sizes.get(h).map(|&n| [n, self.dim as u64]);
        if want != Some([shape[0] as u64, shape[1] as u64]) {
            return Err(Error::Argument(
                "embedding buffer shape does not match get_table_vocab_sizes()/get_embedding_dim()"
                    .into(),
            ));
        }
        Ok(())
    }

    /// `(B, L)` of an id array of shape `[B, L, H]`.
    pub fn ids_shape(&self, shape: &[usize]) -> Result<(usize, usize)> {
        if shape.len() != 3 {
            return Err(Error::Argument(
                "row_ids array must have shape [B, L, H]".into(),
            ));
        }
        if shape[2] != self.num_heads() {
            return Err(Error::Argument(
                "row_ids last dimension must match num_heads".into(),
            ));
        }
        Ok((shape[0], shape[1]))
    }

    /// The kind of a caller-provided `lookup_into` output for ids of shape
    /// `[b, l, H]`: C-contiguous, writable, shape `[b, l, H, D]`, element
    /// type one of [`TableDtype::lookup_into_outputs`]; otherwise a
    /// message naming what is expected.
    pub fn check_output(
        &self,
        (b, l): (usize, usize),
        shape: &[usize],
        dtype: &str,
        c_contiguous: bool,
        writable: bool,
    ) -> Result<OutKind> {
        let expected = [b, l, self.num_heads(), self.dim];
        let allowed = self.dtype.lookup_into_outputs();
        if !c_contiguous || !writable || shape != expected || !allowed.contains(&dtype) {
            return Err(Error::Argument(
                format!(
                    "out must be a C-contiguous writable array of shape (B, L, H, D)=({}, {}, {}, {}) and dtype {}",
                    expected[0],
                    expected[1],
                    expected[2],
                    expected[3],
                    allowed.join(" or ")
                )
                .into(),
            ));
        }
        Ok(if dtype == "float32" {
            OutKind::Float32
        } else {
            OutKind::Raw
        })
    }
}

/// Row ids given as an array must have an integer dtype kind (`i` or
/// `u`). Ours: float, bool, complex and object ids are rejected rather than
/// truncated ([`ids_not_integer_array`]).
pub fn ids_kind_ok(kind: &str) -> bool {
    kind == "i" || kind == "u"
}

/// Row ids given as an array of dtype `dtype`, which is not an integer type.
pub fn ids_not_integer_array(dtype: &str) -> Error {
    Error::Argument(
        format!(
            "row_ids must be an integer array (got dtype {dtype}); EngramStore does not truncate floating-point ids"
        )
        .into(),
    )
}

/// A populate input that is neither a NumPy array nor a CPU tensor.
pub fn not_an_array() -> Error {
    Error::Argument("embedding_buffers must be NumPy arrays".into())
}

/// Nested-sequence ids with no rows (`[]`, `[[]]`).
pub fn empty_ids() -> Error {
    Error::Argument("row_ids must not be empty".into())
}

/// A nested-sequence id that is not an integer (`type_name` is its type).
pub fn ids_not_integers(type_name: &str) -> Error {
    Error::Argument(format!("row_ids elements must be integers (got {type_name})").into())
}

/// Validate `(table_vocab_sizes, embedding_dim, table_dtype)` in upstream's
/// order, each failure with its exact `ValueError` message.
pub fn validate_layout(vocab: &[i64], dim: i64, dtype: &str) -> Result<Layout> {
    if vocab.is_empty() {
        return Err(Error::Layout(
            "EngramStoreConfig.table_vocab_sizes must not be empty",
        ));
    }
    if dim <= 0 {
        return Err(Error::Layout(
            "EngramStoreConfig.embedding_dim must be positive",
        ));
    }
    if vocab.iter().any(|&n| n <= 0) {
        return Err(Error::Layout(
            "EngramStoreConfig.table_vocab_sizes must contain only positive values",
        ));
    }
    let Some(dtype) = TableDtype::parse(dtype) else {
        return Err(Error::Layout(
            "EngramStoreConfig.table_dtype must be one of 'float32', 'float16', 'bfloat16'",
        ));
    };
    Ok(Layout {
        vocab_sizes: vocab.iter().map(|&n| n.unsigned_abs()).collect(),
        dim: dim.unsigned_abs() as usize,
        dtype,
    })
}

/// Store key of head `h` of layer `layer_id`.
pub fn store_key(layer_id: i32, h: usize) -> String {
    format!("engram:l{layer_id}:h{h}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message<T: fmt::Debug>(r: Result<T>) -> String {
        r.expect_err("rejected").message().into_owned()
    }

    #[test]
    fn keys() {
        assert_eq!(store_key(7, 0), "engram:l7:h0");
        assert_eq!(store_key(-3, 2), "engram:l-3:h2");
    }

    #[test]
    fn validation_order() {
        assert_eq!(
            message(validate_layout(&[], 0, "x")),
            "EngramStoreConfig.table_vocab_sizes must not be empty"
        );
        assert_eq!(
            message(validate_layout(&[3, -1], -5, "float32")),
            "EngramStoreConfig.embedding_dim must be positive"
        );
        assert_eq!(
            message(validate_layout(&[3, 0], 4, "float32")),
            "EngramStoreConfig.table_vocab_sizes must contain only positive values"
        );
        assert!(message(validate_layout(&[3], 4, "int8")).contains("table_dtype"));
        assert!(matches!(
            validate_layout(&[3], 4, "int8"),
            Err(Error::Layout(_))
        ));
        let l = validate_layout(&[3, 5], 4, "bfloat16").expect("valid");
        assert_eq!(l.row_bytes(), 8);
        assert_eq!(l.table_bytes(1), 40);
    }

    #[test]
    fn defaults() {
        let c = EngramConfig::default();
        let l = c.layout().expect("the defaults are valid");
        assert_eq!(l.vocab_sizes, vec![1024]);
        assert_eq!(l.dim, 64);
        assert_eq!(l.dtype, TableDtype::Float32);
    }

    #[test]
    fn shape_rules() {
        let l = validate_layout(&[3, 5], 4, "float16").expect("valid");
        assert!(l.check_table_count(2).is_ok());
        assert_eq!(
            message(l.check_table_count(3)),
            "embedding_buffers size must match num_heads"
        );
        assert!(l.check_table_shape(1, &[5, 4]).is_ok());
        assert_eq!(
            message(l.check_table_shape(1, &[20])),
            "each embedding buffer must be 2D [N_h, D]"
        );
        assert!(message(l.check_table_shape(1, &[3, 4])).contains("shape does not match"));
        assert!(message(l.check_table_shape(2, &[3, 4])).contains("shape does not match"));
        assert_eq!(l.ids_shape(&[2, 3, 2]).ok(), Some((2, 3)));
        assert_eq!(
            message(l.ids_shape(&[2, 2])),
            "row_ids array must have shape [B, L, H]"
        );
        assert_eq!(
            message(l.ids_shape(&[1, 1, 3])),
            "row_ids last dimension must match num_heads"
        );
        let ok = l.check_output((1, 1), &[1, 1, 2, 4], "float16", true, true);
        assert_eq!(ok.ok(), Some(OutKind::Raw));
        let ok = l.check_output((1, 1), &[1, 1, 2, 4], "float32", true, true);
        assert_eq!(ok.ok(), Some(OutKind::Float32));
        let bad = l.check_output((1, 1), &[1, 1, 2, 4], "float16", false, true);
        assert_eq!(
            message(bad),
            "out must be a C-contiguous writable array of shape (B, L, H, D)=(1, 1, 2, 4) and dtype float16 or float32"
        );
        assert!(l
            .check_output((1, 1), &[1, 1, 2, 4], "float16", true, false)
            .is_err());
        assert!(l
            .check_output((1, 1), &[1, 1, 2, 3], "float16", true, true)
            .is_err());
        assert!(l
            .check_output((1, 1), &[1, 1, 2, 4], "uint16", true, true)
            .is_err());
    }

    #[test]
    fn input_rules() {
        use TableDtype::*;
        for k in ["b", "i", "u", "f", "c"] {
            assert!(Float16.check_input_kind(k).is_ok(), "{k}");
        }
        assert_eq!(
            message(Float16.check_input_kind("O")),
            "embedding_buffers must be float16 arrays"
        );
        assert!(BFloat16.check_input_kind("U").is_err());
        assert!(Float32.check_input_kind("").is_err());
        assert!(ids_kind_ok("i") && ids_kind_ok("u"));
        for k in ["f", "b", "c", "O"] {
            assert!(!ids_kind_ok(k));
        }
        assert!(ids_not_integer_array("float64")
            .message()
            .contains("integer array (got dtype float64)"));
        assert_eq!(
            not_an_array().message(),
            "embedding_buffers must be NumPy arrays"
        );
        assert_eq!(empty_ids().message(), "row_ids must not be empty");
        assert_eq!(
            ids_not_integers("float").message(),
            "row_ids elements must be integers (got float)"
        );
    }

    #[test]
    fn populate_casts() {
        use TableDtype::*;
        assert_eq!(Float32.populate_cast("float64"), "float32");
        assert_eq!(Float16.populate_cast("float32"), "float32");
        assert_eq!(Float16.populate_cast("float64"), "float16");
        assert_eq!(BFloat16.populate_cast("uint16"), "uint16");
        assert_eq!(BFloat16.populate_cast("float64"), "float32");
        assert_eq!(Float16.lookup_output(), ("float16", OutKind::Raw));
        assert_eq!(BFloat16.lookup_output(), ("float32", OutKind::Float32));
    }
}
