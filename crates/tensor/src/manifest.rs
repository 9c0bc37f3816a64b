//! The 96-byte shard-set manifest (`K__parallelism_manifest`,
//! `K__writer_manifest`): the global shape,
//! split dimension and shard count of a TP or writer-partition set, so a
//! reader can enumerate the set without guessing.
//!
//! Layout: magic u32 @0 (`NAMW`), version u16 @4, header_size u16 @6 (96),
//! dtype i32 @8, ndim i32 @12, split_dim i32 @16, shard_count i32 @20,
//! reserved i32 @24 (0), 4 zero bytes @28, global_shape i64[8] @32 (-1 padded).

use crate::error::{TensorError, TensorResult};
use crate::header::MAX_NDIM;
use crate::le;

/// Size of an encoded manifest; larger objects are accepted (extra bytes ignored).
pub const MANIFEST_SIZE: usize = 96;
/// `magic` field: the bytes `NAMW` read as a little-endian u32.
pub const MANIFEST_MAGIC: u32 = 0x574D_414E;
/// `version` field.
pub const MANIFEST_VERSION: u16 = 1;

/// A decoded, validated manifest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Manifest {
    /// dtype code of the set (kept raw: the manifest validity rules do not
    /// constrain it; readers compare it with the members' headers).
    pub dtype: i32,
    /// The dimension the set is split along (`< ndim`).
    pub split_dim: usize,
    /// Number of shards in the set (`> 0`).
    pub shard_count: u32,
    /// Shape of the whole tensor.
    pub global_shape: Vec<u64>,
}

impl Manifest {
    /// The 96 manifest bytes.
    pub fn encode(&self) -> [u8; MANIFEST_SIZE] {
        let mut b = [0u8; MANIFEST_SIZE];
        le::put_u32(&mut b, 0, MANIFEST_MAGIC);
        le::put_u16(&mut b, 4, MANIFEST_VERSION);
        le::put_u16(&mut b, 6, MANIFEST_SIZE as u16);
        le::put_i32(&mut b, 8, self.dtype);
        le::put_i32(&mut b, 12, self.global_shape.len() as i32);
        le::put_i32(&mut b, 16, self.split_dim as i32);
        le::put_i32(&mut b, 20, self.shard_count as i32);
        for i in 0..MAX_NDIM {
            let d = self.global_shape.get(i).map_or(-1, |&d| d as i64);
            le::put_i64(&mut b, 32 + 8 * i, d);
        }
        b
    }

    /// Decode and validate: magic, version and size exact, `0 <= ndim <= 8`,
    /// `shard_count > 0`, `0 <= split_dim < ndim`, every dim `>= 0`.
    pub fn decode(bytes: &[u8]) -> TensorResult<Manifest> {
        let bad = |why: String| Err(TensorError::corrupt(format!("not a manifest: {why}")));
        if bytes.len() < MANIFEST_SIZE {
            return bad(format!("{} bytes is shorter than 96", bytes.len()));
        }
        let magic = le::u32_at(bytes, 0);
        if magic != MANIFEST_MAGIC {
            return bad(format!("bad magic {magic:#010x}"));
        }
        if le::u16_at(bytes, 4) != MANIFEST_VERSION {
            return bad("unsupported version".into());
        }
        if le::u16_at(bytes, 6) as usize != MANIFEST_SIZE {
            return bad("header_size is not 96".into());
        }
        let ndim_raw = le::i32_at(bytes, 12);
        let ndim = match usize::try_from(ndim_raw) {
            Ok(n) if n <= MAX_NDIM => n,
            _ => return bad(format!("ndim {ndim_raw} is not in 0..=8")),
        };
        let count = le::i32_at(bytes, 20);
        if count <= 0 {
            return bad(format!("shard_count {count} is not positive"));
        }
        let split = le::i32_at(bytes, 16);
        let split_dim = match usize::try_from(split) {
            Ok(d) if d < ndim => d,
            _ => return bad(format!("split_dim {split} is outside 0..{ndim}")),
        };
        let mut global_shape = Vec::with_capacity(ndim);
        for i in 0..ndim {
            let d = le::i64_at(bytes, 32 + 8 * i);
            if d < 0 {
                return bad(format!("dimension {i} is negative"));
            }
            global_shape.push(d as u64);
        }
        Ok(Manifest {
            dtype: le::i32_at(bytes, 8),
            split_dim,
            shard_count: count as u32,
            global_shape,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m() -> Manifest {
        Manifest {
            dtype: 0,
            split_dim: 1,
            shard_count: 3,
            global_shape: vec![4, 6],
        }
    }

    #[test]
    fn bytes_and_round_trip() {
        let b = m().encode();
        assert_eq!(&b[0..4], b"NAMW");
        assert_eq!(le::u16_at(&b, 6), 96);
        assert_eq!(le::i32_at(&b, 16), 1);
        assert_eq!(le::i32_at(&b, 20), 3);
        assert_eq!(le::i64_at(&b, 32), 4);
        assert_eq!(le::i64_at(&b, 40), 6);
        assert_eq!(le::i64_at(&b, 48), -1);
        assert_eq!(Manifest::decode(&b), Ok(m()));
        let mut long = b.to_vec();
        long.extend_from_slice(&[7u8; 10]);
        assert_eq!(Manifest::decode(&long), Ok(m()), "extra bytes are ignored");
    }

    #[test]
    fn validity_rules() {
        let with = |at: usize, v: &[u8]| {
            let mut b = m().encode();
            b[at..at + v.len()].copy_from_slice(v);
            Manifest::decode(&b)
        };
        assert!(Manifest::decode(&m().encode()[..95]).is_err());
        assert!(with(0, b"XAMW").is_err());
        assert!(with(4, &2u16.to_le_bytes()).is_err());
        assert!(with(6, &95u16.to_le_bytes()).is_err());
        assert!(with(12, &9i32.to_le_bytes()).is_err());
        assert!(with(20, &0i32.to_le_bytes()).is_err());
        assert!(with(16, &2i32.to_le_bytes()).is_err());
        assert!(with(16, &(-1i32).to_le_bytes()).is_err());
        assert!(with(32, &(-4i64).to_le_bytes()).is_err());
    }
}
