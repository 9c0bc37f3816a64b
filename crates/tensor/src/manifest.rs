//! The 96-byte shard-set manifest (`K__parallelism_manifest`,
//! `K__writer_manifest`): the global shape,
//! split dimension and shard count of a TP or writer-partition set, so a
//! reader can enumerate the set without guessing.
//!
//! Layout: magic u32 @0 (`NAMW`), version u16 @4, header_size u16 @6 (96),
//! dtype i32 @8, ndim i32 @12, split_dim i32 @16, shard_count i32 @20,
//! reserved i32 @24 (0), 4 zero bytes @28, global_shape i64[8] @32 (-1 padded).
//!
//! A set written with any axis list other than a single TP axis appends a
//! layout record after the 96 bytes (readers that only know the 96-byte form
//! ignore it): magic u32 @96 (`LAYT`), axis count u32 @100, then per axis,
//! in the writer's order, 20 bytes: kind i32, rank i32, size i32, split_dim
//! i32 (-1 none), id i32 (EP expert_id / PP stage_id, -1 none). It names the
//! whole axis list of the set (the ranks of its layout axes are the
//! writer's and mean nothing), so a reader can enumerate the set's members
//! and learn its scope without being told either. With the record present,
//! `split_dim`/`shard_count` describe the TP axis if there is one, else the
//! first layout axis, else `(0, 1)`, and are not validated against `ndim`.

use crate::axis::{AxisKind, Parallelism, RawAxis};
use crate::error::{TensorError, TensorResult};
use crate::header::{MAX_AXES, MAX_NDIM};
use crate::le;

/// Size of an encoded manifest; larger objects are accepted (extra bytes ignored).
pub const MANIFEST_SIZE: usize = 96;
/// `magic` field: the bytes `NAMW` read as a little-endian u32.
pub const MANIFEST_MAGIC: u32 = 0x574D_414E;
/// `version` field.
pub const MANIFEST_VERSION: u16 = 1;
/// Magic of the layout record after the 96 bytes: the bytes `LAYT`.
pub const LAYOUT_MAGIC: u32 = 0x5459_414C;
const LAYOUT_AXIS_SIZE: usize = 20;

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
    /// The set's whole axis list, when the layout record is present.
    pub layout: Option<Parallelism>,
}

impl Manifest {
    /// The manifest bytes: 96, plus the layout record when there is one.
    pub fn encode(&self) -> Vec<u8> {
        let n = self.layout.as_ref().map_or(0, |p| p.axes().len());
        let extra = if self.layout.is_some() {
            8 + LAYOUT_AXIS_SIZE * n
        } else {
            0
        };
        let mut b = vec![0u8; MANIFEST_SIZE + extra];
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
        if let Some(p) = &self.layout {
            le::put_u32(&mut b, MANIFEST_SIZE, LAYOUT_MAGIC);
            le::put_u32(&mut b, MANIFEST_SIZE + 4, n as u32);
            for (i, a) in p.axes().iter().enumerate() {
                let o = MANIFEST_SIZE + 8 + LAYOUT_AXIS_SIZE * i;
                let id = match a.kind {
                    AxisKind::Ep => a.expert_id.unwrap_or(-1),
                    AxisKind::Pp => a.stage_id.unwrap_or(-1),
                    _ => -1,
                };
                le::put_i32(&mut b, o, a.kind.code());
                le::put_i32(&mut b, o + 4, a.rank as i32);
                le::put_i32(&mut b, o + 8, a.size as i32);
                le::put_i32(&mut b, o + 12, a.split_dim.map_or(-1, |d| d as i32));
                le::put_i32(&mut b, o + 16, id);
            }
        }
        b
    }

    /// The layout record after the 96 bytes: `None` when absent, an error
    /// when present but invalid (its axes must form a valid request whose
    /// split dims lie inside `ndim`).
    fn decode_layout(bytes: &[u8], ndim: usize) -> TensorResult<Option<Parallelism>> {
        if bytes.len() < MANIFEST_SIZE + 8 || le::u32_at(bytes, MANIFEST_SIZE) != LAYOUT_MAGIC {
            return Ok(None);
        }
        let bad = |why: String| Err(TensorError::corrupt(format!("bad layout record: {why}")));
        let n = le::u32_at(bytes, MANIFEST_SIZE + 4) as usize;
        if n == 0 || n > MAX_AXES {
            return bad(format!("{n} axes"));
        }
        if bytes.len() < MANIFEST_SIZE + 8 + LAYOUT_AXIS_SIZE * n {
            return bad("truncated".into());
        }
        let mut raw = Vec::with_capacity(n);
        for i in 0..n {
            let o = MANIFEST_SIZE + 8 + LAYOUT_AXIS_SIZE * i;
            let Some(kind) = AxisKind::from_code(le::i32_at(bytes, o)) else {
                return bad(format!("axis {i} has an unknown kind"));
            };
            let opt = |v: i32| (v >= 0).then_some(i64::from(v));
            let id = opt(le::i32_at(bytes, o + 16));
            let mut a = RawAxis::new(
                kind.name(),
                i64::from(le::i32_at(bytes, o + 4)),
                i64::from(le::i32_at(bytes, o + 8)),
            );
            a.split_dim = opt(le::i32_at(bytes, o + 12));
            match kind {
                AxisKind::Ep => a.expert_id = id,
                AxisKind::Pp => a.stage_id = id,
                _ => {}
            }
            raw.push(a);
        }
        let p = Parallelism::new(&raw).map_err(|e| e.context("bad layout record"))?;
        p.check_split_dims(ndim)
            .map_err(|e| e.context("bad layout record"))?;
        Ok(Some(p))
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
        let layout = Manifest::decode_layout(bytes, ndim)?;
        let split = le::i32_at(bytes, 16);
        let split_dim = match usize::try_from(split) {
            Ok(d) if d < ndim => d,
            _ if layout.is_some() => 0,
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
            layout,
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
            layout: None,
        }
    }

    #[test]
    fn bytes_and_round_trip() {
        let b = m().encode();
        assert_eq!(b.len(), 96);
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
    fn layout_record_round_trip_and_rules() {
        let p = Parallelism::new(&[
            RawAxis::new("pp", 1, 2).stage(3),
            RawAxis::new("dp", 0, 2),
            RawAxis::new("ep", 1, 4).expert(5).split(0),
            RawAxis::new("tp", 2, 4).split(1),
        ])
        .expect("valid");
        let with = Manifest {
            layout: Some(p),
            ..m()
        };
        let b = with.encode();
        assert_eq!(b.len(), 96 + 8 + 4 * 20);
        assert_eq!(&b[96..100], b"LAYT");
        assert_eq!(le::u32_at(&b, 100), 4);
        assert_eq!(Manifest::decode(&b), Ok(with.clone()));
        // the first 96 bytes alone are the plain manifest
        assert_eq!(Manifest::decode(&b[..96]), Ok(m()));
        // a layout record relaxes split_dim (a 0-d scope-only set)
        let scope = Manifest {
            dtype: 0,
            split_dim: 0,
            shard_count: 1,
            global_shape: vec![],
            layout: Some(Parallelism::new(&[RawAxis::new("dp", 1, 2)]).expect("valid")),
        };
        assert_eq!(Manifest::decode(&scope.encode()), Ok(scope));
        // invalid records fail the manifest
        let mut bad = b.clone();
        le::put_i32(&mut bad, 104, 9);
        assert!(Manifest::decode(&bad).is_err(), "unknown kind");
        let mut bad = b.clone();
        le::put_i32(&mut bad, 104 + 60 + 12, 5);
        assert!(Manifest::decode(&bad).is_err(), "split dim outside ndim");
        assert!(Manifest::decode(&b[..110]).is_err(), "truncated");
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
