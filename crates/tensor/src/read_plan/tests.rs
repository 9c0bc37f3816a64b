//! Planner tests over the in-memory simulation: the re-sharding scenarios
//! (TP writers read back whole, at another TP, by DP/EP/PP scope) at the
//! planning level, the bad-input cases, and
//! property tests (uniform TP/EP splits re-sharded to any divisor reassemble
//! byte-exact; at most two probe rounds).

use super::*;
use crate::axis::{RawAxis, RawWriterPartition, WriterPartition};
use crate::header::TensorHeader;
use crate::le;
use crate::sim::MemStore;
use crate::write_plan::{route_for_object, route_for_tp, WriteRoute, WriteSource};
use proptest::prelude::*;

/// `arange(n)` as little-endian u32 elements (dtype Int32).
fn arange(n: u64) -> Vec<u8> {
    (0..n as u32).flat_map(|v| v.to_le_bytes()).collect()
}

fn vals(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Elements of `box` of a C-ordered tensor of `shape` whose element i is i.
fn expect_box(shape: &[u64], b: &Region) -> Vec<u32> {
    let n = crate::geometry::numel(&b.extent).unwrap_or(0);
    let mut out = Vec::new();
    let mut idx = vec![0u64; shape.len()];
    for _ in 0..n {
        let mut flat = 0u64;
        for d in 0..shape.len() {
            flat = flat * shape[d] + b.origin[d] + idx[d];
        }
        out.push(flat as u32);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < b.extent[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

fn rows(shape: &[u64], dim: usize, lo: u64, hi: u64) -> Vec<u32> {
    let mut b = Region::whole(shape);
    b.origin[dim] = lo;
    b.extent[dim] = hi - lo;
    expect_box(shape, &b)
}

const SHAPE: [u64; 2] = [4, 6];

fn full() -> (WriteSource, Vec<u8>) {
    (WriteSource::tensor(DType::Int32, &SHAPE), arange(24))
}

fn p(raw: &[RawAxis]) -> Parallelism {
    Parallelism::new(raw).expect("valid parallelism")
}

fn tp(r: i64, n: i64, d: i64) -> RawAxis {
    RawAxis::new("tp", r, n).split(d)
}
fn dp(r: i64, n: i64) -> RawAxis {
    RawAxis::new("dp", r, n)
}

fn req(key: &str, mode: ReadMode, par: Option<Parallelism>) -> ReadRequest {
    ReadRequest {
        key: key.into(),
        mode,
        parallelism: par,
        advisory_split_dim: false,
    }
}

/// Write the whole of `full` along `route`, write-once.
fn write_full(s: &mut MemStore, key: &str, route: &WriteRoute) -> TensorResult<()> {
    let (src, bytes) = full();
    s.write(key, &src, &bytes, route, false)
}

/// Write the shard of `full` that `par` (single TP: shard input) selects.
fn put_par(s: &mut MemStore, key: &str, par: Parallelism) {
    if par.is_single_tp() {
        let a = par.axes()[0];
        let d = a.split_dim.unwrap_or(0);
        let b = Region::whole(&SHAPE)
            .split(d, a.rank, a.size)
            .expect("uniform");
        let shard: Vec<u8> = expect_box(&SHAPE, &b)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let src = WriteSource::tensor(DType::Int32, &b.extent);
        s.write(key, &src, &shard, &WriteRoute::Parallelism(par), false)
            .expect("write");
    } else {
        write_full(s, key, &WriteRoute::Parallelism(par)).expect("write");
    }
}

fn read_vals(s: &MemStore, r: &ReadRequest) -> Option<(Vec<u64>, Vec<u32>)> {
    s.read(r)
        .ok()
        .map(|b| (b.output.shape.clone(), vals(&b.payload)))
}

#[test]
fn tp_set_a_scenarios() {
    let mut s = MemStore::default();
    put_par(&mut s, "A", p(&[tp(1, 2, 0)]));
    assert_eq!(s.keys(), vec!["A__parallelism_manifest", "A_tp_1"]);
    let m = Manifest::decode(&s.objs["A__parallelism_manifest"]).expect("manifest");
    assert_eq!(
        (m.split_dim, m.shard_count, m.global_shape.clone()),
        (0, 2, vec![4, 6])
    );
    let h = TensorHeader::decode(&s.objs["A_tp_1"], 352).expect("header");
    assert_eq!(
        (h.global_shape.clone(), h.local_shape.clone()),
        (vec![4, 6], vec![2, 6])
    );
    let a = h.axes[0];
    assert_eq!(a.fields(), (1, 0, 1, 2, 0, 0, 2));
    // full read before rank 0 exists fails
    assert!(s
        .read(&req("A", ReadMode::Full, Some(p(&[tp(0, 2, 0)]))))
        .is_err());
    put_par(&mut s, "A", p(&[tp(0, 2, 0)]));
    let all: Vec<u32> = (0..24).collect();
    assert_eq!(
        read_vals(&s, &req("A", ReadMode::Full, Some(p(&[tp(0, 2, 0)])))),
        Some((vec![4, 6], all.clone()))
    );
    assert_eq!(
        read_vals(&s, &req("A", ReadMode::Shard, Some(p(&[tp(3, 4, 0)])))),
        Some((vec![1, 6], rows(&SHAPE, 0, 3, 4)))
    );
    assert_eq!(
        read_vals(&s, &req("A", ReadMode::Shard, Some(p(&[tp(0, 1, 0)])))),
        Some((vec![4, 6], all.clone()))
    );
    let legacy = ReadRequest::legacy_tp("A", 1, 2, Some(0)).expect("valid");
    assert_eq!(
        read_vals(&s, &legacy),
        Some((vec![2, 6], rows(&SHAPE, 0, 2, 4)))
    );
    // no object at A itself
    assert!(s.read(&ReadRequest::plain("A")).is_err());
    // F3: full read without parallelism rebuilds the legacy set
    assert_eq!(
        read_vals(&s, &req("A", ReadMode::Full, None)),
        Some((vec![4, 6], all))
    );
    assert_eq!(
        read_vals(&s, &req("A", ReadMode::AsStored, Some(p(&[tp(1, 2, 0)])))),
        Some((vec![2, 6], rows(&SHAPE, 0, 2, 4)))
    );
    // a full read ignores the request's layout axes
    assert_eq!(
        read_vals(&s, &req("A", ReadMode::Full, Some(p(&[tp(0, 2, 1)])))).map(|v| v.0),
        Some(vec![4, 6])
    );
    // a TP split on another dim than the stored one is a remap, never the stored chunk
    assert_eq!(
        read_vals(&s, &req("A", ReadMode::Shard, Some(p(&[tp(1, 2, 1)])))),
        Some((vec![4, 3], rows(&SHAPE, 1, 3, 6)))
    );
}

#[test]
fn reshard_output_header_is_a_shard_with_the_request_axes() {
    let mut s = MemStore::default();
    put_par(&mut s, "A", p(&[tp(0, 2, 0)]));
    put_par(&mut s, "A", p(&[tp(1, 2, 0)]));
    let b = s
        .read(&req("A", ReadMode::Shard, Some(p(&[tp(1, 4, 0)]))))
        .expect("reshard");
    let h = TensorHeader::decode(&b.output.header, 304 + b.output.nbytes).expect("valid header");
    assert_eq!(h.layout, Layout::Shard);
    let a = h.axes[0];
    assert_eq!(a.fields(), (1, 0, 1, 4, 0, 0, 1));
    assert_eq!(b.rounds, 1, "A_tp_0 and A_tp_1 are both round-1 candidates");
    let f = s
        .read(&req("A", ReadMode::Full, Some(p(&[tp(0, 2, 0)]))))
        .expect("full");
    let h = TensorHeader::decode(&f.output.header, 304 + f.output.nbytes).expect("valid header");
    assert_eq!(h.layout, Layout::Full);
    assert_eq!(h.global_shape, vec![4, 6]);
}

#[test]
fn multi_axis_b_scenarios() {
    let mut s = MemStore::default();
    put_par(&mut s, "B", p(&[tp(1, 3, 1), dp(1, 2)]));
    assert_eq!(
        s.keys(),
        vec!["B__dp_1of2__tp_1of3_sd1", "B__parallelism_manifest"]
    );
    let h = TensorHeader::decode(&s.objs["B__dp_1of2__tp_1of3_sd1"], 304 + 32).expect("header");
    assert_eq!(h.axes[0].fields(), (1, 0, 1, 3, 1, 0, 2));
    assert_eq!(h.axes[1].fields(), (0, 1, 1, 2, -1, 0, 0));
    let m = Manifest::decode(&s.objs["B__parallelism_manifest"]).expect("manifest");
    assert_eq!(
        (m.split_dim, m.shard_count, m.global_shape.clone()),
        (1, 3, vec![4, 6])
    );
    assert_eq!(m.layout, Some(p(&[tp(1, 3, 1), dp(1, 2)])));
    put_par(&mut s, "B", p(&[tp(0, 3, 1), dp(1, 2)]));
    put_par(&mut s, "B", p(&[tp(2, 3, 1), dp(1, 2)]));
    let read = |mode, axes: &[RawAxis]| read_vals(&s, &req("B", mode, Some(p(axes))));
    let whole: Vec<u32> = (0..24).collect();
    assert_eq!(
        read(ReadMode::Shard, &[dp(1, 2), tp(1, 3, 1)]),
        Some((vec![4, 2], rows(&SHAPE, 1, 2, 4)))
    );
    // DP replicas hold the same tensor: replica 0's read is served by replica 1
    assert_eq!(
        read(ReadMode::Shard, &[dp(0, 2), tp(1, 3, 1)]),
        Some((vec![4, 2], rows(&SHAPE, 1, 2, 4)))
    );
    assert_eq!(
        read(ReadMode::Shard, &[dp(1, 2), tp(1, 2, 1)]),
        Some((vec![4, 3], rows(&SHAPE, 1, 3, 6)))
    );
    assert_eq!(
        read(ReadMode::Full, &[dp(1, 2), tp(0, 3, 1)]),
        Some((vec![4, 6], whole.clone()))
    );
    assert_eq!(
        read(ReadMode::Full, &[dp(0, 2), tp(0, 3, 1)]),
        Some((vec![4, 6], whole))
    );
    // shard input with multi-axis TP is narrowed as a full tensor: non-uniform
    let shard_in = WriteSource::tensor(DType::Int32, &[4, 2]);
    let e = s
        .write(
            "B2",
            &shard_in,
            &arange(8),
            &WriteRoute::Parallelism(p(&[tp(1, 3, 1), dp(1, 2)])),
            false,
        )
        .unwrap_err();
    assert!(e.reason.contains("only uniform sharding is supported"));
    assert!(!s.objs.keys().any(|k| k.starts_with("B2")));
}

#[test]
fn ep_scope_and_layout() {
    let mut s = MemStore::default();
    let ep7 = || RawAxis::new("ep", 1, 2).expert(7);
    put_par(&mut s, "C", p(&[ep7()]));
    assert_eq!(s.keys(), vec!["C__ep_1of2_eid7", "C__parallelism_manifest"]);
    let all: Vec<u32> = (0..24).collect();
    assert_eq!(
        read_vals(&s, &req("C", ReadMode::Shard, Some(p(&[ep7()])))),
        Some((vec![4, 6], all.clone()))
    );
    assert!(s
        .read(&req(
            "C",
            ReadMode::Shard,
            Some(p(&[RawAxis::new("ep", 1, 2).expert(8)]))
        ))
        .is_err());
    assert_eq!(
        read_vals(&s, &req("C", ReadMode::Full, Some(p(&[ep7()])))),
        Some((vec![4, 6], all.clone()))
    );
    for r in 0..2 {
        for t in 0..3 {
            put_par(
                &mut s,
                "E",
                p(&[RawAxis::new("ep", r, 2).expert(r).split(0), tp(t, 3, 1)]),
            );
        }
    }
    assert!(s.objs.contains_key("E__tp_1of3_sd1__ep_0of2_sd0"));
    for r in 0..2 {
        for t in 0..3 {
            let q = p(&[RawAxis::new("ep", r, 2).expert(r).split(0), tp(t, 3, 1)]);
            assert_eq!(
                read_vals(&s, &req("E", ReadMode::Full, Some(q))),
                Some((vec![4, 6], all.clone()))
            );
        }
    }
    let mut b = Region::whole(&SHAPE);
    b.origin = vec![2, 4];
    b.extent = vec![2, 2];
    assert_eq!(
        read_vals(
            &s,
            &req(
                "E",
                ReadMode::Shard,
                Some(p(&[
                    RawAxis::new("ep", 1, 2).expert(1).split(0),
                    tp(2, 3, 1)
                ]))
            )
        ),
        Some((vec![2, 2], expect_box(&SHAPE, &b)))
    );
    // one piece missing: the full read fails
    s.objs.remove("E__tp_2of3_sd1__ep_1of2_sd0");
    assert!(s
        .read(&req(
            "E",
            ReadMode::Full,
            Some(p(&[
                RawAxis::new("ep", 0, 2).expert(0).split(0),
                tp(0, 3, 1)
            ]))
        ))
        .is_err());
}

#[test]
fn pp_dp_scope_full_read() {
    let mut s = MemStore::default();
    let q = || p(&[RawAxis::new("pp", 0, 4).stage(2), dp(1, 2)]);
    put_par(&mut s, "D", q());
    assert_eq!(
        s.keys(),
        vec!["D__dp_1of2__pp_0of4_sid2", "D__parallelism_manifest"]
    );
    assert_eq!(
        read_vals(&s, &req("D", ReadMode::Full, Some(q()))).map(|v| v.0),
        Some(vec![4, 6])
    );
    // another pipeline stage (a re-partitioned pipeline) reads the same tensor
    assert_eq!(
        read_vals(
            &s,
            &req(
                "D",
                ReadMode::Full,
                Some(p(&[RawAxis::new("pp", 1, 8).stage(3), dp(0, 2)]))
            )
        ),
        Some((vec![4, 6], (0..24).collect()))
    );
}

fn writer(rank: i64, size: i64, split_dim: i64) -> WriterPartition {
    WriterPartition::new(RawWriterPartition {
        rank,
        size,
        split_dim,
    })
    .expect("valid")
}

#[test]
fn writer_partitions() {
    let mut s = MemStore::default();
    write_full(&mut s, "W", &WriteRoute::Writer(writer(1, 2, 1))).expect("write");
    assert_eq!(s.keys(), vec!["W__writer_1of2_sd1", "W__writer_manifest"]);
    assert!(
        s.read(&req("W", ReadMode::Full, None)).is_err(),
        "rank 0 is missing"
    );
    write_full(&mut s, "W", &WriteRoute::Writer(writer(0, 2, 1))).expect("write");
    assert_eq!(
        read_vals(&s, &req("W", ReadMode::Full, None)),
        Some((vec![4, 6], (0..24).collect()))
    );
    assert_eq!(
        read_vals(&s, &req("W", ReadMode::Shard, Some(p(&[tp(1, 2, 1)])))),
        Some((vec![4, 3], rows(&SHAPE, 1, 3, 6)))
    );
    // re-shard from the writer set
    assert_eq!(
        read_vals(&s, &req("W", ReadMode::Shard, Some(p(&[tp(0, 3, 1)])))),
        Some((vec![4, 2], rows(&SHAPE, 1, 0, 2)))
    );
    let e = write_full(&mut s, "W3", &WriteRoute::Writer(writer(0, 4, 1))).unwrap_err();
    assert!(e.reason.contains("uniform"));
    let e = write_full(&mut s, "W3", &WriteRoute::Writer(writer(0, 2, 2))).unwrap_err();
    assert!(e.reason.contains("outside"));
    let e =
        crate::write_plan::route_for(Some(p(&[tp(0, 2, 0)])), Some(writer(0, 2, 1))).unwrap_err();
    assert!(e.reason.contains("mutually exclusive"));
}

#[test]
fn legacy_tp_g_scenarios() {
    let mut s = MemStore::default();
    write_full(&mut s, "G", &route_for_tp(3, 1).expect("route")).expect("write");
    assert_eq!(s.keys(), vec!["G_tp_0", "G_tp_1", "G_tp_2"]);
    for i in 0..3 {
        let h = TensorHeader::decode(&s.objs[&format!("G_tp_{i}")], 304 + 32).expect("header");
        let a = h.axes[0];
        assert_eq!(a.fields(), (1, 0, i, 3, 1, 0, 2));
    }
    let r = ReadRequest::legacy_tp("G", 2, 3, Some(1)).expect("valid");
    assert_eq!(read_vals(&s, &r), Some((vec![4, 2], rows(&SHAPE, 1, 4, 6))));
    // tp_size differs from storage: re-sharded along the stored split dim
    let r = ReadRequest::legacy_tp("G", 0, 2, Some(0)).expect("valid");
    assert_eq!(read_vals(&s, &r), Some((vec![4, 3], rows(&SHAPE, 1, 0, 3))));
    let r = ReadRequest::legacy_tp("G", 1, 2, None).expect("valid");
    assert_eq!(read_vals(&s, &r), Some((vec![4, 3], rows(&SHAPE, 1, 3, 6))));
    // tp_size 1 is a plain FULL write
    assert_eq!(route_for_tp(1, 0).expect("route"), WriteRoute::Full);
    assert!(
        write_full(&mut s, "H", &route_for_tp(4, 1).expect("route")).is_err(),
        "non-uniform"
    );
    let zero_d = WriteSource::tensor(DType::Int32, &[]);
    assert!(s
        .write(
            "Z",
            &zero_d,
            &arange(1),
            &route_for_tp(2, 0).expect("route"),
            false
        )
        .is_err());
    assert!(route_for_tp(2, -1).is_err());
    // tp_size 4 over a not-divisible stored set -> S5 raw chunk
    let r = ReadRequest::legacy_tp("G", 1, 4, Some(1)).expect("valid");
    assert_eq!(read_vals(&s, &r), Some((vec![4, 2], rows(&SHAPE, 1, 2, 4))));
}

#[test]
fn s4_slices_a_full_object() {
    let mut s = MemStore::default();
    write_full(&mut s, "F", &WriteRoute::Full).expect("write");
    assert_eq!(
        read_vals(&s, &req("F", ReadMode::Shard, Some(p(&[tp(1, 2, 1)])))),
        Some((vec![4, 3], rows(&SHAPE, 1, 3, 6)))
    );
    assert_eq!(
        read_vals(&s, &req("F", ReadMode::Full, None)).map(|v| v.0),
        Some(vec![4, 6])
    );
    assert!(s
        .read(&req("F", ReadMode::Shard, None))
        .unwrap_err()
        .reason
        .contains("parallelism is required"));
}

#[test]
fn from_object_routes() {
    let (src, bytes) = full();
    let h = TensorHeader::full(DType::Int32, &SHAPE).expect("header");
    let mut obj = h.encode().to_vec();
    obj.extend_from_slice(&bytes);
    let (osrc, _) = WriteSource::from_object(&obj, obj.len() as u64).expect("valid object");
    assert_eq!(osrc.payload_offset, 304);
    assert_eq!(osrc.shape, SHAPE.to_vec());
    let mut s = MemStore::default();
    let route = route_for_object(Some(p(&[tp(1, 2, 0)])), None, obj.len() as u64).expect("route");
    s.write("X", &osrc, &obj, &route, false).expect("write");
    assert_eq!(s.keys(), vec!["X_tp_0", "X_tp_1"]);
    let route = route_for_object(None, None, obj.len() as u64).expect("route");
    s.write("V", &osrc, &obj, &route, false).expect("write");
    assert_eq!(s.objs["V"], obj, "stored byte for byte");
    // bad buffers
    assert!(WriteSource::from_object(&obj, obj.len() as u64 + 4).is_err());
    assert!(WriteSource::from_object(&obj[1..], obj.len() as u64 - 1).is_err());
    assert!(WriteSource::from_object(&obj[..100], 100)
        .unwrap_err()
        .reason
        .contains("smaller"));
    let _ = src;
}

#[test]
fn corrupt_and_inconsistent_sets_fail_without_panicking() {
    let mut s = MemStore::default();
    put_par(&mut s, "A", p(&[tp(0, 2, 0)]));
    put_par(&mut s, "A", p(&[tp(1, 2, 0)]));
    let good = s.clone();
    // a corrupted header byte
    s.objs.get_mut("A_tp_1").expect("present")[0] ^= 0xff;
    assert!(s
        .read(&req("A", ReadMode::Full, Some(p(&[tp(0, 2, 0)]))))
        .is_err());
    assert!(s.read(&ReadRequest::plain("A_tp_1")).is_err());
    // members disagree on dtype
    let mut s = good.clone();
    le::put_i32(
        s.objs.get_mut("A_tp_1").expect("present"),
        8,
        DType::Float32.code(),
    );
    let e = s
        .read(&req("A", ReadMode::Full, Some(p(&[tp(0, 2, 0)]))))
        .unwrap_err();
    assert!(e.reason.contains("dtype"), "{e}");
    // members disagree on the global shape
    let mut s = good.clone();
    le::put_i64(s.objs.get_mut("A_tp_1").expect("present"), 40, 6);
    let e = s
        .read(&req("A", ReadMode::Full, Some(p(&[tp(0, 2, 0)]))))
        .unwrap_err();
    assert!(
        e.reason.contains("global shape") || e.reason.contains("extent"),
        "{e}"
    );
    // a member missing
    let mut s = good.clone();
    s.objs.remove("A_tp_0");
    assert!(s.read(&req("A", ReadMode::Full, None)).is_err());
    // a non-tensor value
    let mut s = good;
    s.objs.insert("N".into(), vec![7u8; 400]);
    assert!(s
        .read(&ReadRequest::plain("N"))
        .unwrap_err()
        .reason
        .contains("not a tensor object"));
    // an absurd manifest count is refused, not enumerated
    // an absurd manifest count is refused, not enumerated; the set A_tp_0
    // names still serves the read
    let mf = Manifest {
        dtype: 6,
        split_dim: 0,
        shard_count: i32::MAX as u32,
        global_shape: vec![4, 6],
        layout: None,
    };
    s.objs
        .insert("A__parallelism_manifest".into(), mf.encode().to_vec());
    s.objs.remove("N");
    let b = s
        .read(&req("A", ReadMode::Full, Some(p(&[tp(0, 2, 0)]))))
        .expect("served by the A_tp_* set");
    assert_eq!(vals(&b.payload), (0..24).collect::<Vec<u32>>());
    s.objs.remove("A_tp_0");
    let e = s
        .read(&req("A", ReadMode::Full, Some(p(&[tp(0, 2, 0)]))))
        .unwrap_err();
    assert!(e.reason.contains("more than the"), "{e}");
}

#[test]
fn zero_d_and_empty_tensors() {
    let mut s = MemStore::default();
    let z = WriteSource::tensor(DType::Float64, &[]);
    s.write("Z", &z, &3.5f64.to_le_bytes(), &WriteRoute::Full, false)
        .expect("write");
    let b = s.read(&ReadRequest::plain("Z")).expect("read");
    assert_eq!(b.output.shape, Vec::<u64>::new());
    assert_eq!(b.payload, 3.5f64.to_le_bytes().to_vec());
    let e = WriteSource::tensor(DType::Float32, &[0, 4]);
    s.write("E0", &e, &[], &WriteRoute::Full, false)
        .expect("write");
    let b = s.read(&ReadRequest::plain("E0")).expect("read");
    assert_eq!(b.output.shape, vec![0, 4]);
    assert!(b.payload.is_empty());
    // an empty tensor split and rebuilt
    let e = WriteSource::tensor(DType::Float32, &[0, 4]);
    s.write("E1", &e, &[], &route_for_tp(2, 1).expect("route"), false)
        .expect("write");
    let b = s.read(&req("E1", ReadMode::Full, None)).expect("rebuild");
    assert_eq!(b.output.shape, vec![0, 4]);
}

#[test]
fn nine_dims_rejected_eight_accepted() {
    let nine = WriteSource::tensor(DType::Uint8, &[1; 9]);
    assert!(crate::plan_write("K", &nine, &WriteRoute::Full)
        .unwrap_err()
        .reason
        .contains("at most 8"));
    let eight = WriteSource::tensor(DType::Uint8, &[1; 8]);
    assert!(crate::plan_write("K", &eight, &WriteRoute::Full).is_ok());
    assert!(crate::plan_write("", &eight, &WriteRoute::Full).is_err());
}

/// Random shapes of 1-4 dims with small extents, a split dim and counts.
fn shape_and_split() -> impl Strategy<Value = (Vec<u64>, usize, u32, u32)> {
    (1usize..=4)
        .prop_flat_map(|nd| {
            (
                prop::collection::vec(1u64..=4, nd),
                0..nd,
                1u32..=4,
                1u32..=4,
            )
        })
        .prop_map(|(mut shape, d, m, n)| {
            // make the split dim divisible by both counts
            shape[d] *= u64::from(m * n);
            (shape, d, m, n)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Any uniform TP split of a random shape, re-sharded to any divisor,
    /// reassembles byte-exact (and the full rebuild equals the source).
    #[test]
    fn tp_split_reshards_exactly((shape, d, m, n) in shape_and_split(), r_seed in 0u32..64) {
        let total = crate::geometry::numel(&shape).expect("small");
        let src = WriteSource::tensor(DType::Int32, &shape);
        let bytes = arange(total);
        let mut s = MemStore::default();
        s.write("P", &src, &bytes, &route_for_tp(i64::from(m), d as i64).expect("route"), false).expect("write");
        if m == 1 {
            // tp_size 1 is a FULL write; re-shard by slicing it (S4)
            prop_assert!(s.objs.contains_key("P"));
        }
        let full = s.read(&req("P", ReadMode::Full, None)).expect("rebuild");
        prop_assert_eq!(&full.payload, &bytes);
        prop_assert!(full.rounds <= 2);
        let r = r_seed % n;
        let q = p(&[tp(i64::from(r), i64::from(n), d as i64)]);
        let got = s.read(&req("P", ReadMode::Shard, Some(q))).expect("reshard");
        let want = Region::whole(&shape).split(d, r, n).expect("uniform");
        prop_assert_eq!(&got.output.shape, &want.extent);
        prop_assert_eq!(vals(&got.payload), expect_box(&shape, &want));
        prop_assert!(got.rounds <= 2);
    }

    /// An EP layout x TP layout written from the full tensor by every rank
    /// pair rebuilds exactly, and each shard read returns its box.
    #[test]
    fn ep_tp_layout_rebuilds((shape, d, m, _n) in shape_and_split(), e in 1u32..=3) {
        prop_assume!(shape.len() >= 2);
        let de = (d + 1) % shape.len();
        let mut shape = shape;
        shape[de] *= u64::from(e);
        let total = crate::geometry::numel(&shape).expect("small");
        let src = WriteSource::tensor(DType::Int32, &shape);
        let bytes = arange(total);
        let mut s = MemStore::default();
        let par = |er: u32, t: u32| p(&[
            RawAxis::new("ep", i64::from(er), i64::from(e)).expert(i64::from(er)).split(de as i64),
            tp(i64::from(t), i64::from(m), d as i64),
        ]);
        for er in 0..e {
            for t in 0..m {
                s.write("L", &src, &bytes, &WriteRoute::Parallelism(par(er, t)), false).expect("write");
            }
        }
        let full = s.read(&req("L", ReadMode::Full, Some(par(0, 0)))).expect("rebuild");
        prop_assert_eq!(&full.payload, &bytes);
        let b = s.read(&req("L", ReadMode::Shard, Some(par(e - 1, m - 1)))).expect("shard");
        let want = Region::whole(&shape).split(de, e - 1, e).and_then(|x| x.split(d, m - 1, m)).expect("uniform");
        prop_assert_eq!(vals(&b.payload), expect_box(&shape, &want));
    }

    /// Header encode/decode round trip for arbitrary valid headers.
    #[test]
    fn header_round_trip(
        dt in 0i32..15,
        shape in prop::collection::vec(0u64..64, 0..=8),
        shard in any::<bool>(),
        nax in 0usize..=4,
    ) {
        let dtype = DType::from_code(dt).expect("valid code");
        let mut h = TensorHeader::full(dtype, &shape).expect("small");
        if shard && !shape.is_empty() {
            h.layout = Layout::Shard;
            h.global_shape = shape.iter().map(|d| d * 2).collect();
            h.axes = (0..nax).map(|i| crate::header::StoredAxis {
                kind: (i % 5) as i32,
                axis_index: i as i32,
                shard_rank: 1,
                shard_count: 2,
                split_dim: (i % shape.len()) as i32,
                reserved0: 7,
                reserved1: 3,
            }).collect();
        }
        let b = h.encode();
        prop_assert_eq!(TensorHeader::decode(&b, h.object_size()), Ok(h));
    }

    /// Decoding arbitrary bytes never panics (header and manifest).
    #[test]
    fn decode_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..400), total in any::<u64>()) {
        let _ = TensorHeader::decode(&bytes, total);
        let _ = Manifest::decode(&bytes);
        let _ = WriteSource::from_object(&bytes, total);
    }

    /// Decoding a valid header with one random byte changed never panics,
    /// and a read through the planner never panics either.
    #[test]
    fn corrupted_byte_never_panics(at in 0usize..352, v in any::<u8>()) {
        let mut s = MemStore::default();
        put_par(&mut s, "A", p(&[tp(0, 2, 0)]));
        put_par(&mut s, "A", p(&[tp(1, 2, 0)]));
        let obj = s.objs.get_mut("A_tp_0").expect("present");
        obj[at] = v;
        let _ = s.read(&req("A", ReadMode::Full, None));
        let _ = s.read(&req("A", ReadMode::Shard, Some(p(&[tp(1, 4, 0)]))));
        let _ = s.read(&ReadRequest::plain("A_tp_0"));
    }
}

/// One random stored layout: its axes with a writer's ranks; every
/// combination of layout-axis and DP ranks is one writer.
fn layout_writers(axes: &[RawAxis]) -> Vec<Parallelism> {
    let mut lists: Vec<Vec<RawAxis>> = vec![Vec::new()];
    for a in axes {
        let ranks: Vec<i64> = if a.split_dim.is_some() || a.kind == "dp" {
            (0..a.size).collect()
        } else {
            vec![a.rank]
        };
        lists = lists
            .into_iter()
            .flat_map(|l| {
                ranks.iter().map(move |&r| {
                    let mut l = l.clone();
                    let mut x = a.clone();
                    x.rank = r;
                    if x.kind == "ep" && x.split_dim.is_some() {
                        x.expert_id = Some(r);
                    }
                    l.push(x);
                    l
                })
            })
            .collect();
    }
    lists.iter().map(|l| p(l)).collect()
}

/// A random axis list over a tensor of `ndim` dims: each kind at most once,
/// layout axes (TP, EP with split dim) on distinct dims with counts that
/// divide `counts[d]`.
fn random_axes(ndim: usize) -> impl Strategy<Value = Vec<RawAxis>> {
    (
        prop::option::of((0usize..8, 1i64..=4)),
        prop::option::of((0usize..8, 1i64..=4, any::<bool>())),
        prop::option::of(1i64..=3),
        prop::option::of(0i64..2),
        any::<u64>(),
    )
        .prop_map(move |(tp_ax, ep_ax, dp_ax, pp_ax, seed)| {
            let mut v = Vec::new();
            let mut used = Vec::new();
            if let Some((d, n)) = tp_ax {
                let d = d % ndim;
                used.push(d);
                v.push(RawAxis::new("tp", (seed % n as u64) as i64, n).split(d as i64));
            }
            if let Some((d, n, layout)) = ep_ax {
                let d = d % ndim;
                let mut a = RawAxis::new("ep", (seed % n as u64) as i64, n).expert(0);
                if layout && !used.contains(&d) {
                    a = a.split(d as i64);
                }
                v.push(a);
            }
            if let Some(n) = dp_ax {
                v.push(RawAxis::new("dp", (seed % n as u64) as i64, n));
            }
            if let Some(s) = pp_ax {
                v.push(RawAxis::new("pp", s, 2).stage(s));
            }
            // caller order is free: rotate by the seed
            let len = v.len().max(1);
            v.rotate_left((seed as usize) % len);
            v
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Any stored layout written by all its writers, read with any target
    /// layout (same EP expert), returns exactly the target box:
    /// shard reads the box of the target's layout axes, full reads the whole.
    #[test]
    fn any_layout_reads_any_target(
        ndim in 1usize..=3,
        src in random_axes(3),
        dst in random_axes(3),
        ext in prop::collection::vec(1u64..=3, 3),
        full_mode in any::<bool>(),
    ) {
        let fix = |axes: &[RawAxis]| -> Vec<RawAxis> {
            axes.iter().cloned().map(|mut a| {
                if let Some(d) = a.split_dim {
                    a.split_dim = Some(d % ndim as i64);
                }
                if a.kind == "ep" && a.split_dim.is_none() {
                    a.expert_id = Some(0);
                }
                a
            }).collect()
        };
        let (src, dst) = (fix(&src), fix(&dst));
        prop_assume!(!src.is_empty() && !dst.is_empty());
        prop_assume!(Parallelism::new(&src).is_ok() && Parallelism::new(&dst).is_ok());
        // every extent divisible by every count: 12 = lcm(1..=4)
        let shape: Vec<u64> = ext[..ndim].iter().map(|e| e * 12).collect();
        let total = crate::geometry::numel(&shape).expect("small");
        let bytes = arange(total);
        let fsrc = WriteSource::tensor(DType::Int32, &shape);
        let mut s = MemStore::default();
        for w in layout_writers(&src) {
            if w.is_single_tp() {
                let b = narrow(&shape, &w).expect("uniform");
                let shard: Vec<u8> = expect_box(&shape, &b).iter().flat_map(|v| v.to_le_bytes()).collect();
                s.write("R", &WriteSource::tensor(DType::Int32, &b.extent), &shard, &WriteRoute::Parallelism(w), false).expect("write");
            } else {
                s.write("R", &fsrc, &bytes, &WriteRoute::Parallelism(w), false).expect("write");
            }
        }
        let q = p(&dst);
        let (mode, want) = if full_mode {
            (ReadMode::Full, Region::whole(&shape))
        } else {
            (ReadMode::Shard, narrow(&shape, &q).expect("uniform"))
        };
        let got = s.read(&req("R", mode, Some(q))).map_err(|e| TestCaseError::fail(format!("{src:?} -> {dst:?}: {e}")))?;
        prop_assert!(got.rounds <= 2);
        prop_assert_eq!(&got.output.shape, &want.extent);
        prop_assert_eq!(vals(&got.payload), expect_box(&shape, &want));
    }
}

#[test]
fn many_dp_replicas_use_the_named_ones() {
    let mut s = MemStore::default();
    for t in 0..2 {
        put_par(&mut s, "M", p(&[dp(5, 16), tp(t, 2, 0)]));
    }
    for target in [p(&[dp(9, 16), tp(1, 2, 0)]), p(&[tp(1, 2, 0)])] {
        let b = s
            .read(&req("M", ReadMode::Shard, Some(target)))
            .expect("served by replica 5");
        assert_eq!(vals(&b.payload), rows(&SHAPE, 0, 2, 4));
        assert!(b.rounds <= 2);
    }
}

#[test]
fn preferences_scope_then_fewest_pieces() {
    let mut s = MemStore::default();
    // a full object beside a TP=2 set: a TP=4 shard reads the one object
    write_full(&mut s, "F", &WriteRoute::Full).expect("write");
    put_par(&mut s, "F", p(&[tp(0, 2, 0)]));
    put_par(&mut s, "F", p(&[tp(1, 2, 0)]));
    let b = s
        .read(&req("F", ReadMode::Shard, Some(p(&[tp(1, 2, 1)]))))
        .expect("read");
    assert_eq!(
        b.rounds, 1,
        "the object at F serves it without probing the set"
    );
    assert_eq!(vals(&b.payload), rows(&SHAPE, 1, 3, 6));
    // two DP replicas: the requested one serves the read
    let mut s = MemStore::default();
    for r in 0..2 {
        for t in 0..2 {
            put_par(&mut s, "D", p(&[dp(r, 2), tp(t, 2, 0)]));
        }
    }
    let plan = |q: Parallelism| match resolve_all(&s, &req("D", ReadMode::Full, Some(q))) {
        Step::Read(plan) => plan
            .sources
            .iter()
            .map(|x| x.key.clone())
            .collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        plan(p(&[dp(0, 2), tp(0, 2, 0)])),
        vec!["D__dp_0of2__tp_0of2_sd0", "D__dp_0of2__tp_1of2_sd0"]
    );
    assert_eq!(
        plan(p(&[dp(1, 2), tp(0, 2, 0)])),
        vec!["D__dp_1of2__tp_0of2_sd0", "D__dp_1of2__tp_1of2_sd0"]
    );
}

/// Run the probe loop and return the final step.
fn resolve_all(s: &MemStore, r: &ReadRequest) -> Step {
    let mut obs = Observations::new();
    loop {
        match resolve(r, &obs) {
            Step::Probe(keys) => {
                for k in keys {
                    let o = s.observe(&k);
                    obs.insert(k, o);
                }
            }
            other => return other,
        }
    }
}
