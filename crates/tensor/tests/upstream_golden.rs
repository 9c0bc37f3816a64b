//! Byte-for-byte compatibility with upstream Mooncake 0.3.13: the objects in
//! `data/upstream_golden.json` were written by the upstream wheel
//! (`benchmarks/upstream_tensor_golden.py`) and read back raw with `get`.
//! Planning the same writes here must produce identical keys and bytes, and
//! the read planner must decode upstream's objects.

use mooncake_tensor::{
    plan_write, route_for_object, route_for_tp, DType, Manifest, Parallelism, RawAxis,
    RawWriterPartition, TensorHeader, WriteRoute, WriteSource, WriterPartition,
};
use std::collections::BTreeMap;

fn golden() -> BTreeMap<String, Vec<u8>> {
    let text = include_str!("data/upstream_golden.json");
    let v: serde_json::Value = serde_json::from_str(text).expect("valid json");
    let objs = v["objects"].as_object().expect("objects map");
    objs.iter()
        .map(|(k, hex)| {
            let s = hex.as_str().expect("hex string");
            let bytes = (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
                .collect();
            (k.clone(), bytes)
        })
        .collect()
}

fn f32_bytes(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(f32::to_le_bytes).collect()
}

/// Apply a write plan to a map (write-once, as upstream's put).
fn write(
    out: &mut BTreeMap<String, Vec<u8>>,
    key: &str,
    src: &WriteSource,
    bytes: &[u8],
    route: WriteRoute,
) {
    let plan = plan_write(key, src, &route).expect("plan");
    for o in plan.objects {
        let mut v = o.inline.clone();
        for (off, len) in &o.runs {
            v.extend_from_slice(&bytes[*off as usize..(*off + *len) as usize]);
        }
        out.entry(o.key).or_insert(v);
    }
}

fn par(raw: &[RawAxis]) -> Parallelism {
    Parallelism::new(raw).expect("valid")
}

#[test]
fn our_writes_match_upstream_bytes() {
    let g = golden();
    let full = f32_bytes((0..24).map(|i| i as f32));
    let full_src = WriteSource::tensor(DType::Float32, &[4, 6]);
    let mut ours = BTreeMap::new();
    write(
        &mut ours,
        "T",
        &WriteSource::tensor(DType::Float32, &[3, 4]),
        &f32_bytes((0..12).map(|i| i as f32)),
        WriteRoute::Full,
    );
    write(
        &mut ours,
        "Z",
        &WriteSource::tensor(DType::Float32, &[]),
        &f32_bytes([3.5]),
        WriteRoute::Full,
    );
    let bf: Vec<u8> = (0..6)
        .flat_map(|i| (((i as f32).to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    write(
        &mut ours,
        "BF",
        &WriteSource::tensor(DType::BFloat16, &[2, 3]),
        &bf,
        WriteRoute::Full,
    );
    write(
        &mut ours,
        "BOOL",
        &WriteSource::tensor(DType::Bool, &[3]),
        &[1, 0, 1],
        WriteRoute::Full,
    );
    let u16s: Vec<u8> = (0u16..6).flat_map(u16::to_le_bytes).collect();
    write(
        &mut ours,
        "U16",
        &WriteSource::tensor(DType::Uint16, &[6]),
        &u16s,
        WriteRoute::Full,
    );
    // e4m3fn codes of 0..5
    let f8 = [0x00, 0x38, 0x40, 0x44, 0x48, 0x4a];
    write(
        &mut ours,
        "F8",
        &WriteSource::tensor(DType::Float8E4M3Fn, &[2, 3]),
        &f8,
        WriteRoute::Full,
    );
    // single-axis TP: shard input
    for r in 0..2u64 {
        let rows = &full[(r * 48) as usize..((r + 1) * 48) as usize];
        write(
            &mut ours,
            "A",
            &WriteSource::tensor(DType::Float32, &[2, 6]),
            rows,
            WriteRoute::Parallelism(par(&[RawAxis::new("tp", r as i64, 2).split(0)])),
        );
    }
    let multi = |r: &[RawAxis]| WriteRoute::Parallelism(par(r));
    write(
        &mut ours,
        "B",
        &full_src,
        &full,
        multi(&[RawAxis::new("tp", 1, 3).split(1), RawAxis::new("dp", 1, 2)]),
    );
    write(
        &mut ours,
        "C",
        &full_src,
        &full,
        multi(&[RawAxis::new("ep", 1, 2).expert(7)]),
    );
    write(
        &mut ours,
        "D",
        &full_src,
        &full,
        multi(&[RawAxis::new("pp", 0, 4).stage(2), RawAxis::new("dp", 1, 2)]),
    );
    write(
        &mut ours,
        "K2",
        &full_src,
        &full,
        multi(&[RawAxis::new("dp", 0, 2), RawAxis::new("tp", 1, 2).split(1)]),
    );
    let w = WriterPartition::new(RawWriterPartition {
        rank: 1,
        size: 2,
        split_dim: 1,
    })
    .expect("valid");
    write(&mut ours, "W", &full_src, &full, WriteRoute::Writer(w));
    write(
        &mut ours,
        "G",
        &full_src,
        &full,
        route_for_tp(3, 1).expect("route"),
    );
    write(
        &mut ours,
        "H",
        &full_src,
        &full,
        route_for_tp(1, 0).expect("route"),
    );
    // _from with a TP request: the buffer is a whole FULL object
    let mut obj = TensorHeader::full(DType::Float32, &[4, 6])
        .expect("header")
        .encode()
        .to_vec();
    obj.extend_from_slice(&full);
    let (osrc, _) = WriteSource::from_object(&obj, obj.len() as u64).expect("valid object");
    let route = route_for_object(
        Some(par(&[RawAxis::new("tp", 1, 2).split(0)])),
        None,
        obj.len() as u64,
    )
    .expect("route");
    write(&mut ours, "X", &osrc, &obj, route);

    // Every upstream object exists with upstream's bytes. A set written with
    // more than a single TP axis also has a parallelism manifest carrying
    // the layout record after upstream's 96 bytes (upstream readers accept
    // longer manifests and ignore the rest); nothing else differs.
    for (k, v) in &g {
        let o = ours.get(k).unwrap_or_else(|| panic!("{k}: not written"));
        if o.len() != v.len() {
            assert!(k.ends_with("__parallelism_manifest"), "{k}: size");
            assert_eq!(&o[96..100], b"LAYT", "{k}: layout record");
        }
        assert_eq!(
            &o[..v.len()],
            v.as_slice(),
            "{k}: bytes differ from upstream"
        );
    }
    for k in ours.keys().filter(|k| !g.contains_key(*k)) {
        assert!(k.ends_with("__parallelism_manifest"), "{k}: extra key");
        let m = Manifest::decode(&ours[k]).expect("manifest");
        assert!(
            m.layout.is_some(),
            "{k}: an extra manifest carries a layout"
        );
    }
}

#[test]
fn upstream_objects_decode() {
    for (k, v) in golden() {
        if k.ends_with("_manifest") {
            let m = Manifest::decode(&v).expect("upstream manifest decodes");
            assert_eq!(m.global_shape, vec![4, 6], "{k}");
        } else {
            let h = TensorHeader::decode(&v, v.len() as u64).expect("upstream header decodes");
            assert_eq!(
                h.encode().as_slice(),
                &v[..304],
                "{k}: re-encoding is identical"
            );
        }
    }
}
