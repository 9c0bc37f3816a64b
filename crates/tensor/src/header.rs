//! The 304-byte header that starts every stored tensor object:
//! little-endian encoding at upstream's
//! byte offsets, and the validity rules every read and every `_from` write
//! applies before trusting a stored or caller-supplied object.
//!
//! Layout (offsets in bytes): magic u32 @0 (`NOOM`), version u16 @4,
//! header_size u16 @6, dtype i32 @8, ndim i32 @12, layout_kind u32 @16,
//! flags u32 @20, data_offset u64 @24, data_bytes u64 @32, global_shape
//! i64[8] @40, local_shape i64[8] @104, axis_count u32 @168, reserved u32
//! @172, then four 32-byte axes @176 (kind, axis_index, shard_rank,
//! shard_count, split_dim, reserved0 as i32; reserved1 as i64).

use crate::dtype::DType;
use crate::error::{TensorError, TensorResult};
use crate::le;

/// Size of the header, and the payload offset of every object we write.
pub const HEADER_SIZE: usize = 304;
/// Most dimensions a stored tensor may have.
pub const MAX_NDIM: usize = 8;
/// Most parallelism axes a header (and a request) may carry.
pub const MAX_AXES: usize = 4;
/// `magic` field: the bytes `NOOM` read as a little-endian u32.
pub const TENSOR_MAGIC: u32 = 0x4D4F_4F4E;
/// `version` field.
pub const TENSOR_VERSION: u16 = 1;

const OFF_GLOBAL: usize = 40;
const OFF_LOCAL: usize = 104;
const OFF_AXIS_COUNT: usize = 168;
const OFF_AXES: usize = 176;
const AXIS_SIZE: usize = 32;

/// `layout_kind` of a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// A whole tensor (`global == local`, no axes); code 0.
    Full,
    /// One shard of a parallel layout; code 1.
    Shard,
}

impl Layout {
    /// The stored code.
    pub fn code(self) -> u32 {
        match self {
            Layout::Full => 0,
            Layout::Shard => 1,
        }
    }
}

/// One 32-byte `LayoutAxis` record, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StoredAxis {
    /// DP=0, TP=1, EP=2, PP=3 (4 is reserved and accepted on parse).
    pub kind: i32,
    /// Position of this axis in the writer's axis list.
    pub axis_index: i32,
    /// This shard's rank along the axis.
    pub shard_rank: i32,
    /// Number of ranks along the axis.
    pub shard_count: i32,
    /// Split dimension, -1 for none.
    pub split_dim: i32,
    /// EP: expert_id; PP: stage_id; otherwise 0.
    pub reserved0: i32,
    /// Local extent along `split_dim` when it is set, else 0.
    pub reserved1: i64,
}

#[cfg(test)]
impl StoredAxis {
    /// Every field in record order, for comparing with a literal tuple.
    pub(crate) fn fields(&self) -> (i32, i32, i32, i32, i32, i32, i64) {
        (
            self.kind,
            self.axis_index,
            self.shard_rank,
            self.shard_count,
            self.split_dim,
            self.reserved0,
            self.reserved1,
        )
    }
}

/// A decoded (and, when it came from [`TensorHeader::decode`], validated)
/// tensor object header.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorHeader {
    /// Element type.
    pub dtype: DType,
    /// FULL or SHARD.
    pub layout: Layout,
    /// `flags` field (0 in every object we write).
    pub flags: u32,
    /// Where the payload starts in the object (304 in every object we write).
    pub data_offset: u64,
    /// Payload length in bytes.
    pub data_bytes: u64,
    /// Shape of the logical (whole) tensor.
    pub global_shape: Vec<u64>,
    /// Shape of the stored payload.
    pub local_shape: Vec<u64>,
    /// Parallelism axes in the writer's order (at most 4).
    pub axes: Vec<StoredAxis>,
}

/// `prod(shape) * itemsize`, or `None` on overflow.
pub fn payload_bytes(dtype: DType, shape: &[u64]) -> Option<u64> {
    shape
        .iter()
        .try_fold(dtype.itemsize(), |acc, &d| acc.checked_mul(d))
}

impl TensorHeader {
    /// Header of a FULL object holding a whole tensor of `shape`.
    /// `None` when the shape has more than 8 dims or its byte size overflows.
    pub fn full(dtype: DType, shape: &[u64]) -> Option<TensorHeader> {
        if shape.len() > MAX_NDIM || shape.iter().any(|&d| d > i64::MAX as u64) {
            return None;
        }
        Some(TensorHeader {
            dtype,
            layout: Layout::Full,
            flags: 0,
            data_offset: HEADER_SIZE as u64,
            data_bytes: payload_bytes(dtype, shape)?,
            global_shape: shape.to_vec(),
            local_shape: shape.to_vec(),
            axes: Vec::new(),
        })
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.local_shape.len()
    }

    /// Total object size: `data_offset + data_bytes`.
    pub fn object_size(&self) -> u64 {
        self.data_offset.saturating_add(self.data_bytes)
    }

    /// The 304 header bytes.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        le::put_u32(&mut b, 0, TENSOR_MAGIC);
        le::put_u16(&mut b, 4, TENSOR_VERSION);
        le::put_u16(&mut b, 6, HEADER_SIZE as u16);
        le::put_i32(&mut b, 8, self.dtype.code());
        le::put_i32(&mut b, 12, self.ndim() as i32);
        le::put_u32(&mut b, 16, self.layout.code());
        le::put_u32(&mut b, 20, self.flags);
        le::put_u64(&mut b, 24, self.data_offset);
        le::put_u64(&mut b, 32, self.data_bytes);
        for i in 0..MAX_NDIM {
            let g = self.global_shape.get(i).map_or(-1, |&d| d as i64);
            let l = self.local_shape.get(i).map_or(-1, |&d| d as i64);
            le::put_i64(&mut b, OFF_GLOBAL + 8 * i, g);
            le::put_i64(&mut b, OFF_LOCAL + 8 * i, l);
        }
        le::put_u32(&mut b, OFF_AXIS_COUNT, self.axes.len() as u32);
        for (i, a) in self.axes.iter().take(MAX_AXES).enumerate() {
            let o = OFF_AXES + AXIS_SIZE * i;
            le::put_i32(&mut b, o, a.kind);
            le::put_i32(&mut b, o + 4, a.axis_index);
            le::put_i32(&mut b, o + 8, a.shard_rank);
            le::put_i32(&mut b, o + 12, a.shard_count);
            le::put_i32(&mut b, o + 16, a.split_dim);
            le::put_i32(&mut b, o + 20, a.reserved0);
            le::put_i64(&mut b, o + 24, a.reserved1);
        }
        b
    }

    /// Decode and validate the header of an object of `total` bytes whose
    /// first bytes are `bytes` (at least 304 of them unless the object is
    /// shorter, which is itself invalid). Every validity rule below is
    /// checked in order; the error names the first rule that fails.
    pub fn decode(bytes: &[u8], total: u64) -> TensorResult<TensorHeader> {
        let bad = |why: String| Err(TensorError::corrupt(format!("not a tensor object: {why}")));
        if total < HEADER_SIZE as u64 || bytes.len() < HEADER_SIZE {
            return bad(format!("{total} bytes is shorter than the 304-byte header"));
        }
        let magic = le::u32_at(bytes, 0);
        if magic != TENSOR_MAGIC {
            return bad(format!("bad magic {magic:#010x}"));
        }
        let version = le::u16_at(bytes, 4);
        if version != TENSOR_VERSION {
            return bad(format!("unsupported version {version}"));
        }
        let header_size = le::u16_at(bytes, 6);
        if header_size as usize != HEADER_SIZE {
            return bad(format!("header_size {header_size} is not 304"));
        }
        let dtype_code = le::i32_at(bytes, 8);
        let Some(dtype) = DType::from_code(dtype_code) else {
            return bad(format!("dtype code {dtype_code} is not in 0..=14"));
        };
        let ndim_raw = le::i32_at(bytes, 12);
        let ndim = match usize::try_from(ndim_raw) {
            Ok(n) if n <= MAX_NDIM => n,
            _ => return bad(format!("ndim {ndim_raw} is not in 0..=8")),
        };
        let layout = match le::u32_at(bytes, 16) {
            0 => Layout::Full,
            1 => Layout::Shard,
            other => return bad(format!("layout_kind {other} is not 0 or 1")),
        };
        let flags = le::u32_at(bytes, 20);
        let axis_count = le::u32_at(bytes, OFF_AXIS_COUNT);
        if axis_count as usize > MAX_AXES {
            return bad(format!("axis_count {axis_count} is more than 4"));
        }
        let data_offset = le::u64_at(bytes, 24);
        if data_offset < HEADER_SIZE as u64 || data_offset > total {
            return bad(format!(
                "data_offset {data_offset} is outside 304..={total}"
            ));
        }
        let data_bytes = le::u64_at(bytes, 32);
        if data_bytes != total - data_offset {
            return bad(format!(
                "data_bytes {data_bytes} does not match the object size {total} - {data_offset}"
            ));
        }
        let mut global_shape = Vec::with_capacity(ndim);
        let mut local_shape = Vec::with_capacity(ndim);
        for i in 0..MAX_NDIM {
            let g = le::i64_at(bytes, OFF_GLOBAL + 8 * i);
            let l = le::i64_at(bytes, OFF_LOCAL + 8 * i);
            if i < ndim {
                if g < 0 || l < 0 {
                    return bad(format!("dimension {i} is negative"));
                }
                global_shape.push(g as u64);
                local_shape.push(l as u64);
            } else if g != -1 || l != -1 {
                return bad(format!("dimension slot {i} beyond ndim {ndim} is not -1"));
            }
        }
        match payload_bytes(dtype, &local_shape) {
            Some(n) if n == data_bytes => {}
            _ => {
                return bad(format!(
                    "data_bytes {data_bytes} is not prod(local_shape) x itemsize"
                ))
            }
        }
        let mut axes = Vec::with_capacity(axis_count as usize);
        for i in 0..axis_count as usize {
            let o = OFF_AXES + AXIS_SIZE * i;
            let a = StoredAxis {
                kind: le::i32_at(bytes, o),
                axis_index: le::i32_at(bytes, o + 4),
                shard_rank: le::i32_at(bytes, o + 8),
                shard_count: le::i32_at(bytes, o + 12),
                split_dim: le::i32_at(bytes, o + 16),
                reserved0: le::i32_at(bytes, o + 20),
                reserved1: le::i64_at(bytes, o + 24),
            };
            if !(0..=4).contains(&a.kind) {
                return bad(format!("axis {i} kind {} is not in 0..=4", a.kind));
            }
            if a.shard_count <= 0 || a.shard_rank < 0 || a.shard_rank >= a.shard_count {
                return bad(format!(
                    "axis {i} rank {} of {} is out of range",
                    a.shard_rank, a.shard_count
                ));
            }
            if a.split_dim < -1 || a.split_dim >= ndim as i32 {
                return bad(format!(
                    "axis {i} split_dim {} is outside -1..{ndim}",
                    a.split_dim
                ));
            }
            axes.push(a);
        }
        if layout == Layout::Full && (global_shape != local_shape || !axes.is_empty()) {
            return bad("a FULL object must have global == local and no axes".into());
        }
        Ok(TensorHeader {
            dtype,
            layout,
            flags,
            data_offset,
            data_bytes,
            global_shape,
            local_shape,
            axes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t34() -> TensorHeader {
        TensorHeader::full(DType::Float32, &[3, 4]).expect("header")
    }

    #[test]
    fn full_header_bytes_match_the_spec_table() {
        let b = t34().encode();
        assert_eq!(&b[0..4], b"NOOM");
        assert_eq!(le::u16_at(&b, 4), 1);
        assert_eq!(le::u16_at(&b, 6), 304);
        assert_eq!(le::i32_at(&b, 8), 0);
        assert_eq!(le::i32_at(&b, 12), 2);
        assert_eq!(le::u32_at(&b, 16), 0);
        assert_eq!(le::u64_at(&b, 24), 304);
        assert_eq!(le::u64_at(&b, 32), 48);
        assert_eq!(le::i64_at(&b, 40), 3);
        assert_eq!(le::i64_at(&b, 48), 4);
        for i in 2..8 {
            assert_eq!(le::i64_at(&b, 40 + 8 * i), -1);
            assert_eq!(le::i64_at(&b, 104 + 8 * i), -1);
        }
        assert_eq!(le::i64_at(&b, 104), 3);
        assert_eq!(le::u32_at(&b, 168), 0);
        assert!(b[176..].iter().all(|&x| x == 0));
    }

    #[test]
    fn decode_round_trips() {
        let h = t34();
        assert_eq!(TensorHeader::decode(&h.encode(), 352), Ok(h));
        let z = TensorHeader::full(DType::Float32, &[]).expect("0-d");
        let back = TensorHeader::decode(&z.encode(), 308).expect("0-d decodes");
        assert_eq!(back.ndim(), 0);
        assert_eq!(back.data_bytes, 4);
    }

    fn corrupt(at: usize, bytes: &[u8]) -> String {
        let mut b = t34().encode();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        TensorHeader::decode(&b, 352).unwrap_err().reason
    }

    #[test]
    fn each_validity_rule_is_enforced() {
        assert!(corrupt(0, b"XOOM").contains("magic"));
        assert!(corrupt(4, &2u16.to_le_bytes()).contains("version"));
        assert!(corrupt(6, &300u16.to_le_bytes()).contains("header_size"));
        assert!(corrupt(8, &15i32.to_le_bytes()).contains("dtype"));
        assert!(corrupt(8, &(-1i32).to_le_bytes()).contains("dtype"));
        assert!(corrupt(12, &9i32.to_le_bytes()).contains("ndim"));
        assert!(corrupt(12, &(-1i32).to_le_bytes()).contains("ndim"));
        assert!(corrupt(16, &2u32.to_le_bytes()).contains("layout_kind"));
        assert!(corrupt(168, &5u32.to_le_bytes()).contains("axis_count"));
        assert!(corrupt(24, &100u64.to_le_bytes()).contains("data_offset"));
        assert!(corrupt(24, &400u64.to_le_bytes()).contains("data_offset"));
        assert!(corrupt(32, &47u64.to_le_bytes()).contains("data_bytes"));
        assert!(corrupt(40, &(-3i64).to_le_bytes()).contains("negative"));
        assert!(corrupt(104 + 16, &7i64.to_le_bytes()).contains("beyond ndim"));
        // local shape inconsistent with data_bytes
        assert!(corrupt(104, &5i64.to_le_bytes()).contains("prod(local_shape)"));
        // FULL with global != local
        assert!(corrupt(40, &5i64.to_le_bytes()).contains("FULL"));
        // too short
        assert!(TensorHeader::decode(&[0u8; 100], 100).is_err());
        assert!(TensorHeader::decode(&t34().encode(), 300).is_err());
    }

    fn shard_with_axis(a: StoredAxis) -> TensorResult<TensorHeader> {
        let mut h = t34();
        h.layout = Layout::Shard;
        h.axes = vec![a];
        TensorHeader::decode(&h.encode(), 352)
    }

    #[test]
    fn axis_rules() {
        let ok = StoredAxis {
            kind: 1,
            axis_index: 0,
            shard_rank: 1,
            shard_count: 2,
            split_dim: 0,
            reserved0: 0,
            reserved1: 3,
        };
        assert!(shard_with_axis(ok).is_ok());
        assert!(
            shard_with_axis(StoredAxis { kind: 4, ..ok }).is_ok(),
            "kind 4 is reserved but accepted"
        );
        assert!(shard_with_axis(StoredAxis { kind: 5, ..ok }).is_err());
        assert!(shard_with_axis(StoredAxis { kind: -1, ..ok }).is_err());
        assert!(shard_with_axis(StoredAxis {
            shard_count: 0,
            ..ok
        })
        .is_err());
        assert!(shard_with_axis(StoredAxis {
            shard_rank: 2,
            ..ok
        })
        .is_err());
        assert!(shard_with_axis(StoredAxis {
            shard_rank: -1,
            ..ok
        })
        .is_err());
        assert!(shard_with_axis(StoredAxis { split_dim: 2, ..ok }).is_err());
        assert!(shard_with_axis(StoredAxis {
            split_dim: -2,
            ..ok
        })
        .is_err());
        assert!(shard_with_axis(StoredAxis {
            split_dim: -1,
            ..ok
        })
        .is_ok());
    }
}
