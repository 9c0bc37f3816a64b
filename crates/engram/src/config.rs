//! Layout of one Engram layer: per-head vocab sizes, row width, table
//! dtype; validation in the order and with the messages of the spec.

use std::fmt;

/// Element type of the stored tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableDtype {
    Float32,
    Float16,
    BFloat16,
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
}

impl fmt::Display for TableDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A validated layer layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Rows per head (`N_h`), all positive.
    pub vocab_sizes: Vec<u64>,
    /// Row width `D`, positive.
    pub dim: usize,
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
}

/// Validate `(table_vocab_sizes, embedding_dim, table_dtype)` in spec order;
/// the error is the exact `ValueError` message.
pub fn validate_layout(vocab: &[i64], dim: i64, dtype: &str) -> Result<Layout, &'static str> {
    if vocab.is_empty() {
        return Err("EngramStoreConfig.table_vocab_sizes must not be empty");
    }
    if dim <= 0 {
        return Err("EngramStoreConfig.embedding_dim must be positive");
    }
    if vocab.iter().any(|&n| n <= 0) {
        return Err("EngramStoreConfig.table_vocab_sizes must contain only positive values");
    }
    let Some(dtype) = TableDtype::parse(dtype) else {
        return Err(
            "EngramStoreConfig.table_dtype must be one of 'float32', 'float16', 'bfloat16'",
        );
    };
    Ok(Layout {
        vocab_sizes: vocab.iter().map(|&n| n as u64).collect(),
        dim: dim as usize,
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

    #[test]
    fn keys() {
        assert_eq!(store_key(7, 0), "engram:l7:h0");
        assert_eq!(store_key(-3, 2), "engram:l-3:h2");
    }

    #[test]
    fn validation_order() {
        assert_eq!(
            validate_layout(&[], 0, "x").unwrap_err(),
            "EngramStoreConfig.table_vocab_sizes must not be empty"
        );
        assert_eq!(
            validate_layout(&[3, -1], -5, "float32").unwrap_err(),
            "EngramStoreConfig.embedding_dim must be positive"
        );
        assert_eq!(
            validate_layout(&[3, 0], 4, "float32").unwrap_err(),
            "EngramStoreConfig.table_vocab_sizes must contain only positive values"
        );
        assert!(validate_layout(&[3], 4, "int8")
            .unwrap_err()
            .contains("table_dtype"));
        let l = validate_layout(&[3, 5], 4, "bfloat16").expect("valid");
        assert_eq!(l.row_bytes(), 8);
        assert_eq!(l.table_bytes(1), 40);
    }
}
