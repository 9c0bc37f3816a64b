//! Canonical key names, identical to
//! upstream's so objects written by either implementation are found by the
//! other.
//!
//! * full tensor: `K`; single-axis TP shard: `K_tp_{rank}`;
//! * any other shard: `K` + `__{kind}_{rank}of{size}[_sd{d}][_eid{e}][_sid{s}]`
//!   per axis in canonical order DP, TP, EP, PP (an EP axis with a split dim
//!   omits `_eid`, so an EP layout set can be enumerated);
//! * manifests `K__parallelism_manifest`, `K__writer_manifest`; writer shards
//!   `K__writer_{rank}of{size}_sd{d}`.

use crate::axis::{AxisKind, Parallelism, WriterPartition};
use std::fmt::Write;

/// `K_tp_{rank}`.
pub fn tp_key(base: &str, rank: u32) -> String {
    format!("{base}_tp_{rank}")
}

/// The key of the shard `p` describes.
pub fn shard_key(base: &str, p: &Parallelism) -> String {
    if p.is_single_tp() {
        return tp_key(base, p.axes()[0].rank);
    }
    let mut key = String::from(base);
    for a in p.canonical() {
        let _ = write!(key, "__{}_{}of{}", a.kind.name(), a.rank, a.size);
        if let Some(d) = a.split_dim {
            let _ = write!(key, "_sd{d}");
        }
        if let Some(e) = a.expert_id {
            if !(a.kind == AxisKind::Ep && a.is_layout()) {
                let _ = write!(key, "_eid{e}");
            }
        }
        if let Some(s) = a.stage_id {
            let _ = write!(key, "_sid{s}");
        }
    }
    key
}

/// `K__parallelism_manifest`.
pub fn parallelism_manifest_key(base: &str) -> String {
    format!("{base}__parallelism_manifest")
}

/// `K__writer_manifest`.
pub fn writer_manifest_key(base: &str) -> String {
    format!("{base}__writer_manifest")
}

/// `K__writer_{rank}of{size}_sd{split_dim}`.
pub fn writer_shard_key(base: &str, w: &WriterPartition) -> String {
    format!("{base}__writer_{}of{}_sd{}", w.rank, w.size, w.split_dim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::axis::{RawAxis, RawWriterPartition};

    fn key(raw: &[RawAxis]) -> String {
        shard_key("K", &Parallelism::new(raw).expect("valid"))
    }

    #[test]
    fn spec_examples() {
        assert_eq!(key(&[RawAxis::new("tp", 1, 2).split(0)]), "K_tp_1");
        assert_eq!(
            key(&[RawAxis::new("tp", 1, 3).split(1), RawAxis::new("dp", 1, 2)]),
            "K__dp_1of2__tp_1of3_sd1"
        );
        assert_eq!(
            key(&[RawAxis::new("ep", 1, 2).expert(7)]),
            "K__ep_1of2_eid7"
        );
        assert_eq!(
            key(&[RawAxis::new("pp", 0, 4).stage(2), RawAxis::new("dp", 1, 2)]),
            "K__dp_1of2__pp_0of4_sid2"
        );
        assert_eq!(
            key(&[
                RawAxis::new("ep", 0, 2).expert(0).split(0),
                RawAxis::new("tp", 1, 3).split(1)
            ]),
            "K__tp_1of3_sd1__ep_0of2_sd0"
        );
        assert_eq!(
            key(&[RawAxis::new("TP", 1, 3).split(1), RawAxis::new("Dp", 1, 2)]),
            "K__dp_1of2__tp_1of3_sd1"
        );
        let w = WriterPartition::new(RawWriterPartition {
            rank: 1,
            size: 2,
            split_dim: 1,
        })
        .expect("valid");
        assert_eq!(writer_shard_key("W", &w), "W__writer_1of2_sd1");
        assert_eq!(writer_manifest_key("W"), "W__writer_manifest");
        assert_eq!(parallelism_manifest_key("A"), "A__parallelism_manifest");
        assert_eq!(tp_key("G", 2), "G_tp_2");
    }
}
