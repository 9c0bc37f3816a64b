//! Parallelism requests: the caller's axis list (`TensorParallelism.axes`),
//! its validation,
//! canonical ordering (DP, TP, EP, PP), matching against stored headers, and
//! writer partitions (`writer_partition=(rank, size, split_dim)`).

use crate::error::{TensorError, TensorResult};
use crate::header::{Layout, StoredAxis, TensorHeader, MAX_AXES};

/// Kind of a parallelism axis. The discriminant is the stored code, and
/// code order is the canonical order used for keys and matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AxisKind {
    /// Data parallel (a scope tag), code 0.
    Dp = 0,
    /// Tensor parallel (splits `split_dim`), code 1.
    Tp = 1,
    /// Expert parallel (scope tag, or layout when it has `split_dim`), code 2.
    Ep = 2,
    /// Pipeline parallel (scope tag with a `stage_id`), code 3.
    Pp = 3,
}

impl AxisKind {
    /// Parse a kind case-insensitively (`"TP"`, `"Dp"`, ...).
    pub fn parse(s: &str) -> Option<AxisKind> {
        match s.to_ascii_lowercase().as_str() {
            "dp" => Some(AxisKind::Dp),
            "tp" => Some(AxisKind::Tp),
            "ep" => Some(AxisKind::Ep),
            "pp" => Some(AxisKind::Pp),
            _ => None,
        }
    }

    /// The stored code.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The kind for a stored code (4, reserved, has none).
    pub fn from_code(code: i32) -> Option<AxisKind> {
        match code {
            0 => Some(AxisKind::Dp),
            1 => Some(AxisKind::Tp),
            2 => Some(AxisKind::Ep),
            3 => Some(AxisKind::Pp),
            _ => None,
        }
    }

    /// Lower-case name, as used in keys.
    pub fn name(self) -> &'static str {
        match self {
            AxisKind::Dp => "dp",
            AxisKind::Tp => "tp",
            AxisKind::Ep => "ep",
            AxisKind::Pp => "pp",
        }
    }
}

/// One axis exactly as the caller gave it (any object with `kind`, `rank`,
/// `size`, `split_dim`, `expert_id`, `stage_id`), before validation; also
/// the form in which an axis list travels between processes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct RawAxis {
    /// Kind, any case.
    pub kind: String,
    /// Rank along the axis.
    pub rank: i64,
    /// Number of ranks.
    pub size: i64,
    /// Split dimension, if any.
    pub split_dim: Option<i64>,
    /// Expert id (EP only).
    pub expert_id: Option<i64>,
    /// Stage id (PP only).
    pub stage_id: Option<i64>,
}

impl From<&Axis> for RawAxis {
    fn from(a: &Axis) -> RawAxis {
        RawAxis {
            kind: a.kind.name().to_string(),
            rank: i64::from(a.rank),
            size: i64::from(a.size),
            split_dim: a.split_dim.map(|d| d as i64),
            expert_id: a.expert_id.map(i64::from),
            stage_id: a.stage_id.map(i64::from),
        }
    }
}

impl RawAxis {
    /// A raw axis with no optional fields.
    pub fn new(kind: &str, rank: i64, size: i64) -> RawAxis {
        RawAxis {
            kind: kind.to_string(),
            rank,
            size,
            split_dim: None,
            expert_id: None,
            stage_id: None,
        }
    }

    /// With `split_dim`.
    pub fn split(mut self, d: i64) -> RawAxis {
        self.split_dim = Some(d);
        self
    }

    /// With `expert_id`.
    pub fn expert(mut self, e: i64) -> RawAxis {
        self.expert_id = Some(e);
        self
    }

    /// With `stage_id`.
    pub fn stage(mut self, s: i64) -> RawAxis {
        self.stage_id = Some(s);
        self
    }
}

/// A validated axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Axis {
    /// Kind.
    pub kind: AxisKind,
    /// Rank, `< size`.
    pub rank: u32,
    /// Number of ranks, `> 0`.
    pub size: u32,
    /// Split dimension: makes this a *layout* axis.
    pub split_dim: Option<usize>,
    /// Expert id (EP only).
    pub expert_id: Option<i32>,
    /// Stage id (PP only).
    pub stage_id: Option<i32>,
}

impl Axis {
    /// A TP axis.
    pub fn tp(rank: u32, size: u32, split_dim: usize) -> Axis {
        Axis {
            kind: AxisKind::Tp,
            rank,
            size,
            split_dim: Some(split_dim),
            expert_id: None,
            stage_id: None,
        }
    }

    /// Whether the axis splits a dimension (TP, or EP with `split_dim`).
    pub fn is_layout(&self) -> bool {
        self.split_dim.is_some()
    }

    /// The same axis at another rank.
    pub fn at_rank(mut self, rank: u32) -> Axis {
        self.rank = rank;
        self
    }

    /// The stored record of this axis at position `index`, with `local_extent`
    /// the local size along its split dimension (ignored for scope axes).
    pub fn stored(&self, index: usize, local_extent: u64) -> StoredAxis {
        let reserved0 = match self.kind {
            AxisKind::Ep => self.expert_id.unwrap_or(0),
            AxisKind::Pp => self.stage_id.unwrap_or(0),
            _ => 0,
        };
        StoredAxis {
            kind: self.kind.code(),
            axis_index: index as i32,
            shard_rank: self.rank as i32,
            shard_count: self.size as i32,
            split_dim: self.split_dim.map_or(-1, |d| d as i32),
            reserved0,
            reserved1: if self.split_dim.is_some() {
                local_extent as i64
            } else {
                0
            },
        }
    }

    /// The axis a stored record describes (`None` for the reserved kind 4).
    pub fn from_stored(a: &StoredAxis) -> Option<Axis> {
        let kind = AxisKind::from_code(a.kind)?;
        Some(Axis {
            kind,
            rank: u32::try_from(a.shard_rank).ok()?,
            size: u32::try_from(a.shard_count).ok()?,
            split_dim: usize::try_from(a.split_dim).ok(),
            expert_id: (kind == AxisKind::Ep).then_some(a.reserved0),
            stage_id: (kind == AxisKind::Pp).then_some(a.reserved0),
        })
    }

    /// Field-by-field match of a request axis (`self`) against a stored
    /// axis; EP layout axes do not compare `expert_id`. With
    /// `ignore_tp_split`, a TP axis's split dim is not compared (the legacy
    /// TP wrappers treat it as advisory).
    fn matches(&self, stored: &Axis, ignore_tp_split: bool) -> bool {
        let split_ok =
            (ignore_tp_split && self.kind == AxisKind::Tp) || self.split_dim == stored.split_dim;
        let expert_ok = match self.kind {
            AxisKind::Ep if self.is_layout() => true,
            AxisKind::Ep => self.expert_id == stored.expert_id,
            _ => true,
        };
        let stage_ok = self.kind != AxisKind::Pp || self.stage_id == stored.stage_id;
        self.kind == stored.kind
            && self.rank == stored.rank
            && self.size == stored.size
            && split_ok
            && expert_ok
            && stage_ok
    }
}

fn fits_i32(name: &str, kind: AxisKind, v: i64) -> TensorResult<i32> {
    i32::try_from(v).map_err(|_| {
        TensorError::invalid(format!(
            "{} axis: {name} {v} does not fit in int32",
            kind.name()
        ))
    })
}

/// A validated parallelism request: 1 to 4 axes of distinct kinds, in the
/// caller's order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Parallelism {
    axes: Vec<Axis>,
}

impl Parallelism {
    /// Validate a caller's axis list: 1 to 4 axes of known kinds, no kind
    /// twice, each axis's rank, size and required or forbidden fields
    /// (`split_dim`, `stage_id`, `expert_id`) in order. Split dims against
    /// the tensor are checked by [`Parallelism::check_split_dims`]. The
    /// error names the first rule broken.
    pub fn new(raw: &[RawAxis]) -> TensorResult<Parallelism> {
        if raw.is_empty() || raw.len() > MAX_AXES {
            return Err(TensorError::invalid(format!(
                "parallelism needs 1 to 4 axes, got {}",
                raw.len()
            )));
        }
        let mut axes: Vec<Axis> = Vec::with_capacity(raw.len());
        for r in raw {
            let Some(kind) = AxisKind::parse(&r.kind) else {
                return Err(TensorError::invalid(format!(
                    "unknown axis kind {:?} (expected tp, dp, ep or pp)",
                    r.kind
                )));
            };
            let name = kind.name();
            if axes.iter().any(|a| a.kind == kind) {
                return Err(TensorError::invalid(format!("duplicate {name} axis")));
            }
            if r.size <= 0 || r.size > i32::MAX as i64 {
                return Err(TensorError::invalid(format!(
                    "{name} axis: size {} must be in 1..=2147483647",
                    r.size
                )));
            }
            if r.rank < 0 || r.rank >= r.size {
                return Err(TensorError::invalid(format!(
                    "{name} axis: rank {} is outside [0, {})",
                    r.rank, r.size
                )));
            }
            let split_dim = match r.split_dim {
                Some(d) if d < 0 => {
                    return Err(TensorError::invalid(format!(
                        "{name} axis: split_dim {d} is negative"
                    )))
                }
                Some(d) => Some(usize::try_from(d).map_err(|_| {
                    TensorError::invalid(format!("{name} axis: split_dim {d} is too large"))
                })?),
                None => None,
            };
            match kind {
                AxisKind::Tp if split_dim.is_none() => {
                    return Err(TensorError::invalid("tp axis requires split_dim"))
                }
                AxisKind::Dp if split_dim.is_some() => {
                    return Err(TensorError::invalid("dp axis must not have split_dim"))
                }
                AxisKind::Pp if split_dim.is_some() => {
                    return Err(TensorError::invalid("pp axis must not have split_dim"))
                }
                AxisKind::Pp if r.stage_id.is_none() => {
                    return Err(TensorError::invalid("pp axis requires stage_id"))
                }
                AxisKind::Ep if r.expert_id.is_none() => {
                    return Err(TensorError::invalid("ep axis requires expert_id"))
                }
                _ => {}
            }
            if r.expert_id.is_some() && kind != AxisKind::Ep {
                return Err(TensorError::invalid(format!(
                    "{name} axis: expert_id is only allowed on an ep axis"
                )));
            }
            if r.stage_id.is_some() && kind != AxisKind::Pp {
                return Err(TensorError::invalid(format!(
                    "{name} axis: stage_id is only allowed on a pp axis"
                )));
            }
            let expert_id = r
                .expert_id
                .map(|e| fits_i32("expert_id", kind, e))
                .transpose()?;
            let stage_id = r
                .stage_id
                .map(|s| fits_i32("stage_id", kind, s))
                .transpose()?;
            if expert_id.is_some_and(|e| e < 0) || stage_id.is_some_and(|s| s < 0) {
                return Err(TensorError::invalid(format!(
                    "{name} axis: expert_id/stage_id must be >= 0"
                )));
            }
            if let Some(d) = split_dim {
                if axes.iter().any(|a| a.split_dim == Some(d)) {
                    return Err(TensorError::invalid(format!(
                        "layout axes must split distinct dims; split_dim {d} is used twice"
                    )));
                }
            }
            axes.push(Axis {
                kind,
                rank: r.rank as u32,
                size: r.size as u32,
                split_dim,
                expert_id,
                stage_id,
            });
        }
        Ok(Parallelism { axes })
    }

    /// Build from already validated axes (used to derive set members).
    pub(crate) fn from_axes(axes: Vec<Axis>) -> Parallelism {
        Parallelism { axes }
    }

    /// The axes in the caller's order.
    pub fn axes(&self) -> &[Axis] {
        &self.axes
    }

    /// The axes as a caller would give them, in order: what
    /// [`Parallelism::new`] turns back into this list.
    pub fn raw_axes(&self) -> Vec<RawAxis> {
        self.axes.iter().map(RawAxis::from).collect()
    }

    /// The axes in canonical order (DP, TP, EP, PP).
    pub fn canonical(&self) -> Vec<Axis> {
        let mut v = self.axes.clone();
        v.sort_by_key(|a| a.kind);
        v
    }

    /// The TP axis, if any.
    pub fn tp(&self) -> Option<&Axis> {
        self.axes.iter().find(|a| a.kind == AxisKind::Tp)
    }

    /// Exactly one axis, and it is TP (the legacy `K_tp_{r}` naming).
    pub fn is_single_tp(&self) -> bool {
        self.axes.len() == 1 && self.axes[0].kind == AxisKind::Tp
    }

    /// Whether an EP axis with `split_dim` (an EP layout axis) is present.
    pub fn has_ep_layout(&self) -> bool {
        self.axes
            .iter()
            .any(|a| a.kind == AxisKind::Ep && a.is_layout())
    }

    /// Whether any axis has a split dim.
    pub fn has_layout(&self) -> bool {
        self.axes.iter().any(Axis::is_layout)
    }

    /// The same request with the axis of `kind` replaced by `axis`.
    pub fn replace(&self, axis: Axis) -> Parallelism {
        Parallelism {
            axes: self
                .axes
                .iter()
                .map(|a| if a.kind == axis.kind { axis } else { *a })
                .collect(),
        }
    }

    /// For a write of a tensor with `ndim` dimensions: every split dim is a
    /// dimension of the tensor.
    pub fn check_split_dims(&self, ndim: usize) -> TensorResult<()> {
        for a in &self.axes {
            if let Some(d) = a.split_dim {
                if d >= ndim {
                    return Err(TensorError::invalid(format!(
                        "{} axis: split_dim {d} is outside the tensor's {ndim} dims",
                        a.kind.name()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Whether a stored header matches this request: both axis
    /// lists, canonicalised, are equal field by field.
    pub fn matches(&self, h: &TensorHeader) -> bool {
        self.matches_with(h, false)
    }

    /// [`Parallelism::matches`], optionally ignoring the TP split dim.
    pub fn matches_with(&self, h: &TensorHeader, ignore_tp_split: bool) -> bool {
        if h.layout != Layout::Shard || h.axes.len() != self.axes.len() {
            return false;
        }
        let Some(mut stored) = h
            .axes
            .iter()
            .map(Axis::from_stored)
            .collect::<Option<Vec<_>>>()
        else {
            return false;
        };
        stored.sort_by_key(|a| a.kind);
        self.canonical()
            .iter()
            .zip(&stored)
            .all(|(want, have)| want.matches(have, ignore_tp_split))
    }

    /// The stored axis records of a shard of this request whose payload has
    /// `local_shape`, in the caller's order.
    pub fn stored_axes(&self, local_shape: &[u64]) -> Vec<StoredAxis> {
        self.axes
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let extent = a
                    .split_dim
                    .and_then(|d| local_shape.get(d).copied())
                    .unwrap_or(0);
                a.stored(i, extent)
            })
            .collect()
    }
}

/// A caller's writer partition (any object with `rank`, `size`, `split_dim`;
/// also a dict or a 3-tuple), before validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawWriterPartition {
    /// Writer rank.
    pub rank: i64,
    /// Number of writers.
    pub size: i64,
    /// Dimension the writers split.
    pub split_dim: i64,
}

/// A validated writer partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WriterPartition {
    /// Writer rank, `< size`.
    pub rank: u32,
    /// Number of writers, `> 0`.
    pub size: u32,
    /// Dimension the writers split.
    pub split_dim: usize,
}

impl WriterPartition {
    /// Validate: invalid when `size <= 0`, `rank` outside
    /// `[0, size)` or `split_dim < 0`.
    pub fn new(raw: RawWriterPartition) -> TensorResult<WriterPartition> {
        if raw.size <= 0 || raw.size > i32::MAX as i64 {
            return Err(TensorError::invalid(format!(
                "writer_partition size {} must be in 1..=2147483647",
                raw.size
            )));
        }
        if raw.rank < 0 || raw.rank >= raw.size {
            return Err(TensorError::invalid(format!(
                "writer_partition rank {} is outside [0, {})",
                raw.rank, raw.size
            )));
        }
        if raw.split_dim < 0 || raw.split_dim > i32::MAX as i64 {
            return Err(TensorError::invalid(format!(
                "writer_partition split_dim {} is negative",
                raw.split_dim
            )));
        }
        Ok(WriterPartition {
            rank: raw.rank as u32,
            size: raw.size as u32,
            split_dim: raw.split_dim as usize,
        })
    }

    /// The TP axis a writer shard's header carries.
    pub fn axis(&self) -> Axis {
        Axis::tp(self.rank, self.size, self.split_dim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn p(raw: &[RawAxis]) -> TensorResult<Parallelism> {
        Parallelism::new(raw)
    }

    fn reason(raw: &[RawAxis]) -> String {
        let e = p(raw).unwrap_err();
        assert_eq!(e.code(), -600);
        e.reason
    }

    #[test]
    fn an_axis_list_survives_its_raw_form() {
        let raw = [
            RawAxis::new("dp", 1, 2),
            RawAxis::new("pp", 0, 4).stage(2),
            RawAxis::new("ep", 1, 2).expert(7).split(0),
            RawAxis::new("TP", 2, 3).split(1),
        ];
        let parsed = p(&raw).unwrap();
        let back = parsed.raw_axes();
        assert_eq!(back.len(), 4);
        assert_eq!(back[0], RawAxis::new("dp", 1, 2));
        assert_eq!(back[1], RawAxis::new("pp", 0, 4).stage(2));
        assert_eq!(back[2], RawAxis::new("ep", 1, 2).expert(7).split(0));
        assert_eq!(back[3], RawAxis::new("tp", 2, 3).split(1));
        assert_eq!(p(&back).unwrap(), parsed);
    }

    #[test]
    fn valid_requests() {
        assert!(p(&[RawAxis::new("tp", 1, 2).split(0)]).is_ok());
        assert!(p(&[RawAxis::new("TP", 1, 3).split(1), RawAxis::new("Dp", 1, 2)]).is_ok());
        assert!(p(&[RawAxis::new("ep", 1, 2).expert(7)]).is_ok());
        assert!(p(&[
            RawAxis::new("ep", 1, 2).expert(7).split(0),
            RawAxis::new("tp", 0, 3).split(1)
        ])
        .is_ok());
        assert!(p(&[RawAxis::new("pp", 0, 4).stage(2), RawAxis::new("dp", 1, 2)]).is_ok());
        let four = [
            RawAxis::new("dp", 0, 2),
            RawAxis::new("tp", 0, 2).split(0),
            RawAxis::new("ep", 0, 2).expert(1),
            RawAxis::new("pp", 0, 2).stage(0),
        ];
        assert!(p(&four).is_ok());
    }

    #[test]
    fn every_validation_rule_fails_with_its_reason() {
        assert!(reason(&[]).contains("1 to 4 axes"));
        let five = [
            RawAxis::new("dp", 0, 2),
            RawAxis::new("tp", 0, 2).split(0),
            RawAxis::new("ep", 0, 2).expert(1),
            RawAxis::new("pp", 0, 2).stage(0),
            RawAxis::new("dp", 1, 2),
        ];
        assert!(reason(&five).contains("1 to 4 axes"));
        assert!(reason(&[RawAxis::new("xx", 0, 1)]).contains("unknown axis kind"));
        assert!(
            reason(&[RawAxis::new("dp", 0, 2), RawAxis::new("DP", 1, 2)]).contains("duplicate")
        );
        assert!(reason(&[RawAxis::new("tp", 2, 2).split(0)]).contains("rank"));
        assert!(reason(&[RawAxis::new("tp", -1, 2).split(0)]).contains("rank"));
        assert!(reason(&[RawAxis::new("tp", 0, 0).split(0)]).contains("size"));
        assert!(reason(&[RawAxis::new("tp", 0, 2)]).contains("requires split_dim"));
        assert!(reason(&[RawAxis::new("tp", 0, 2).split(-1)]).contains("negative"));
        assert!(reason(&[RawAxis::new("dp", 0, 2).split(0)]).contains("must not have split_dim"));
        assert!(reason(&[RawAxis::new("pp", 0, 2)]).contains("requires stage_id"));
        assert!(reason(&[RawAxis::new("pp", 0, 2).stage(0).split(0)])
            .contains("must not have split_dim"));
        assert!(reason(&[RawAxis::new("ep", 0, 2)]).contains("requires expert_id"));
        assert!(reason(&[RawAxis::new("dp", 0, 2).expert(1)]).contains("only allowed on an ep"));
        assert!(
            reason(&[RawAxis::new("tp", 0, 2).split(0).stage(1)]).contains("only allowed on a pp")
        );
        assert!(reason(&[
            RawAxis::new("ep", 0, 2).expert(1).split(0),
            RawAxis::new("tp", 0, 2).split(0)
        ])
        .contains("distinct dims"));
        assert!(reason(&[RawAxis::new("ep", 0, 2).expert(-1)]).contains(">= 0"));
        assert!(reason(&[RawAxis::new("ep", 0, 2).expert(1 << 40)]).contains("int32"));
    }

    #[test]
    fn split_dims_checked_against_the_tensor() {
        let q = p(&[RawAxis::new("tp", 0, 2).split(5)]).expect("valid request");
        assert!(q
            .check_split_dims(2)
            .unwrap_err()
            .reason
            .contains("outside"));
        assert!(q.check_split_dims(6).is_ok());
    }

    fn shard_header(axes: Vec<StoredAxis>) -> TensorHeader {
        let mut h = TensorHeader::full(DType::Float32, &[4, 6]).expect("header");
        h.layout = Layout::Shard;
        h.axes = axes;
        h
    }

    #[test]
    fn matching_is_canonical_and_field_by_field() {
        let q = p(&[RawAxis::new("tp", 1, 3).split(1), RawAxis::new("dp", 1, 2)]).expect("valid");
        let h = shard_header(q.stored_axes(&[4, 2]));
        assert!(q.matches(&h));
        // the same axes in another order match
        let r = p(&[RawAxis::new("dp", 1, 2), RawAxis::new("tp", 1, 3).split(1)]).expect("valid");
        assert!(r.matches(&h));
        let other_dp =
            p(&[RawAxis::new("dp", 0, 2), RawAxis::new("tp", 1, 3).split(1)]).expect("valid");
        assert!(!other_dp.matches(&h));
        let other_split =
            p(&[RawAxis::new("dp", 1, 2), RawAxis::new("tp", 1, 3).split(0)]).expect("valid");
        assert!(!other_split.matches(&h));
        assert!(other_split.matches_with(&h, true), "advisory split dim");
        // EP scope compares expert_id; EP layout does not
        let ep7 = p(&[RawAxis::new("ep", 1, 2).expert(7)]).expect("valid");
        let ep8 = p(&[RawAxis::new("ep", 1, 2).expert(8)]).expect("valid");
        let h7 = shard_header(ep7.stored_axes(&[4, 6]));
        assert!(ep7.matches(&h7));
        assert!(!ep8.matches(&h7));
        let epl1 = p(&[RawAxis::new("ep", 1, 2).expert(1).split(0)]).expect("valid");
        let epl5 = p(&[RawAxis::new("ep", 1, 2).expert(5).split(0)]).expect("valid");
        assert!(epl5.matches(&shard_header(epl1.stored_axes(&[2, 6]))));
        // a FULL header never matches a request
        assert!(!q.matches(&TensorHeader::full(DType::Float32, &[4, 6]).expect("header")));
    }

    #[test]
    fn stored_axis_records_follow_the_caller_order() {
        let q = p(&[RawAxis::new("tp", 1, 3).split(1), RawAxis::new("dp", 1, 2)]).expect("valid");
        let s = q.stored_axes(&[4, 2]);
        let t = StoredAxis::fields;
        assert_eq!(t(&s[0]), (1, 0, 1, 3, 1, 0, 2));
        assert_eq!(t(&s[1]), (0, 1, 1, 2, -1, 0, 0));
        let pp = p(&[RawAxis::new("pp", 0, 4).stage(2)]).expect("valid");
        assert_eq!(t(&pp.stored_axes(&[4, 6])[0]), (3, 0, 0, 4, -1, 2, 0));
    }

    #[test]
    fn writer_partition_rules() {
        let w = |rank, size, split_dim| {
            WriterPartition::new(RawWriterPartition {
                rank,
                size,
                split_dim,
            })
        };
        assert!(w(1, 2, 1).is_ok());
        assert!(w(0, 0, 1).is_err());
        assert!(w(2, 2, 1).is_err());
        assert!(w(-1, 2, 1).is_err());
        assert!(w(0, 2, -1).is_err());
    }
}
