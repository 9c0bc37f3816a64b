//! End-to-end: a real master RPC server (in-process) and real clients.

use mooncake_client::{Client, ClientConfig, Dst, Dsts, ErrorCode, ReplicateConfig, Src, Srcs};
use mooncake_master::config::MasterConfig;
use std::sync::Arc;

fn start_master(cfg: MasterConfig) -> String {
    mooncake_master::embedded::spawn_loopback(cfg).expect("start master")
}

fn client(master: &str, seg: u64) -> Arc<Client> {
    Client::setup(ClientConfig::loopback(master, seg)).expect("client setup")
}

fn code<T>(r: mooncake_client::Result<T>) -> i32 {
    r.map_or_else(|e| e.code().code(), |_| 0)
}

#[test]
fn put_get_remove_ranges() {
    let m = start_master(MasterConfig {
        default_kv_lease_ttl_ms: 500,
        ..MasterConfig::default()
    });
    let a = client(&m, 64 << 20);
    let b = client(&m, 0);
    let cfg = ReplicateConfig::default();
    assert_eq!(a.put("k1", b"hello", &cfg, false), Ok(()));
    assert_eq!(a.put("k1", b"world!!", &cfg, false), Ok(()));
    assert_eq!(b.get("k1").expect("get").data, b"hello");
    assert_eq!(a.get("k1").expect("get").data, b"hello");
    assert_eq!(code(a.remove("k1", false)), -706);
    assert_eq!(a.remove("k1", true), Ok(()));
    assert_eq!(code(a.get_size("k1")), -704);
    // upsert
    assert_eq!(a.put("u", b"v1", &cfg, true), Ok(()));
    assert_eq!(a.put("u", b"v2-longer", &cfg, true), Ok(()));
    assert_eq!(b.get("u").expect("get").data, b"v2-longer");
    // ranges
    let v: Vec<u8> = (0..36u8).collect();
    assert_eq!(a.put("r", &v, &cfg, false), Ok(()));
    let mut buf = vec![0u8; 32];
    let p = buf.as_mut_ptr() as usize;
    assert_eq!(b.register_buffer(p, 32), Ok(()));
    // SAFETY: `buf` is registered and outlives the call.
    let res = unsafe {
        b.get_into_ranges(
            &[p],
            &[vec!["r".into(), "missing".into()]],
            &[vec![vec![0, 10], vec![20]]],
            &[vec![vec![4, 30], vec![0]]],
            &[vec![vec![4, 3], vec![4]]],
        )
    };
    let codes: Vec<Vec<Vec<i64>>> = res
        .into_iter()
        .map(|g| {
            g.into_iter()
                .map(|f| {
                    f.into_iter()
                        .map(|r| r.map_or_else(|e| e.code().code() as i64, |n| n as i64))
                        .collect()
                })
                .collect()
        })
        .collect();
    assert_eq!(codes, vec![vec![vec![4, 3], vec![-704]]]);
    assert_eq!(&buf[0..4], &[4, 5, 6, 7]);
    assert_eq!(&buf[10..13], &[30, 31, 32]);
    let stats: std::collections::HashMap<_, _> = b.stats().into_iter().collect();
    assert_eq!(stats["bytes_read_local"], 7 + 5 + 9);
    // big value, direct path
    let big: Vec<u8> = (0..(8usize << 20)).map(|i| (i % 251) as u8).collect();
    // SAFETY: `big` outlives the call.
    let put = unsafe {
        let src = Src::new(big.as_ptr() as usize, big.len());
        a.put_from("big", src, &cfg, false)
    };
    assert_eq!(put, Ok(()));
    let mut out = vec![0u8; big.len()];
    // SAFETY: `out` is writable for its length.
    let got = unsafe {
        let dst = Dst::new(out.as_mut_ptr() as usize, out.len());
        b.get_into("big", dst)
    };
    assert_eq!(got, Ok(big.len() as u64));
    assert!(out == big);
    let mut small = vec![0u8; 10];
    // SAFETY: `small` is writable for 10 bytes.
    let got = unsafe { b.get_into("big", Dst::new(small.as_mut_ptr() as usize, 10)) };
    assert_eq!(code(got), -600);
    assert!(
        small.iter().all(|&x| x == 0),
        "a too-small buffer stays untouched"
    );
    a.close();
    assert_eq!(
        b.get_size("big").map_err(|e| e.code()),
        Err(ErrorCode::ObjectNotFound)
    );
    b.close();
}

/// Per-key and per-batch argument rules: an empty key fails only its own item and
/// is never sent; lists of different lengths fail the whole call; a
/// duplicated key in a staged batch is written once with its first value;
/// `put_parts` of zero bytes stores nothing; `get_into_ranges` answers in
/// the shape of its destination offsets whatever fails.
#[test]
fn batch_and_key_rules() {
    let m = start_master(MasterConfig::default());
    let a = client(&m, 16 << 20);
    let cfg = ReplicateConfig::default();
    let keys = |ks: &[&str]| -> Vec<String> { ks.iter().map(|k| k.to_string()).collect() };
    let codes = |rs: Vec<mooncake_client::Result<bool>>| -> Vec<i32> {
        rs.into_iter()
            .map(|r| r.map_or_else(|e| e.code().code(), i32::from))
            .collect()
    };
    // Empty keys.
    assert_eq!(code(a.put("", b"v", &cfg, false)), -600);
    assert_eq!(code(a.put("k", b"", &cfg, false)), -600);
    assert_eq!(a.put("k", b"v", &cfg, false), Ok(()));
    assert_eq!(
        codes(a.batch_is_exist(&keys(&["k", "", "nope"]))),
        vec![1, -600, 0]
    );
    assert_eq!(codes(a.batch_is_exist(&keys(&["", ""]))), vec![-600, -600]);
    assert!(a.batch_is_exist(&[]).is_empty());
    let removed: Vec<i32> = a
        .batch_remove(&keys(&["", "nope"]), true)
        .into_iter()
        .map(code)
        .collect();
    assert_eq!(removed, vec![-600, -704]);
    let got: Vec<i32> = a
        .get_batch(&keys(&["k", ""]))
        .into_iter()
        .map(code)
        .collect();
    assert_eq!(got, vec![0, -600]);
    // put_parts of nothing stores nothing; put_batch's first value wins.
    assert_eq!(a.put_parts("empty", &[b"", b""], &cfg, false), Ok(0));
    assert_eq!(a.is_exist("empty"), Ok(false));
    assert_eq!(a.put_parts("two", &[b"ab", b"c"], &cfg, false), Ok(3));
    assert_eq!(
        a.put_batch(&keys(&["d", "d"]), &[b"first", b"second"], &cfg, false),
        Ok(())
    );
    assert_eq!(a.get("d").expect("get").data, b"first");
    assert_eq!(code(a.put_batch(&keys(&["x"]), &[], &cfg, false)), -600);
    assert_eq!(
        code(a.put_batch(&keys(&["x", ""]), &[b"1", b"2"], &cfg, false)),
        -600
    );
    assert_eq!(
        a.is_exist("x"),
        Ok(false),
        "a rejected batch writes nothing"
    );
    // Lengths that differ fail the whole call; per-item rules fail one item.
    let buf = [7u8; 16];
    let p = buf.as_ptr() as usize;
    // SAFETY: `buf` outlives the calls; every size is within it.
    let mismatch = unsafe {
        a.batch_put_from(
            &keys(&["a", "b"]),
            Srcs {
                ptrs: &[p],
                sizes: &[16, 16],
            },
            &cfg,
            false,
        )
    };
    assert_eq!(code(mismatch), -600);
    // SAFETY: as above.
    let items = unsafe {
        a.batch_put_from(
            &keys(&["a", "", "c", "d2"]),
            Srcs {
                ptrs: &[p, p, 0, p],
                sizes: &[16, 16, 16, 0],
            },
            &cfg,
            false,
        )
    }
    .expect("call");
    let items: Vec<i32> = items.into_iter().map(code).collect();
    assert_eq!(items, vec![0, -600, -600, -600]);
    let mut out = [0u8; 16];
    let q = out.as_mut_ptr() as usize;
    // SAFETY: `out` is writable for 16 bytes.
    let mismatch = unsafe {
        a.batch_get_into(
            &keys(&["a"]),
            Dsts {
                ptrs: &[q, q],
                sizes: &[16],
            },
        )
    };
    assert_eq!(code(mismatch), -600);
    // SAFETY: as above.
    let got = unsafe {
        a.batch_get_into(
            &keys(&["a", ""]),
            Dsts {
                ptrs: &[q, q],
                sizes: &[16, 16],
            },
        )
    }
    .expect("call");
    assert_eq!(got[0], Ok(16));
    assert_eq!(
        got[1].as_ref().map_err(|e| e.code()),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(out, buf);
    // Ranges: shapes survive every failure.
    let mut region = vec![0u8; 64];
    let r = region.as_mut_ptr() as usize;
    assert_eq!(a.register_buffer(r, 64), Ok(()));
    assert_eq!(code(a.register_buffer(r + 8, 8)), -600, "overlap");
    let ranges = |ptrs: &[usize], ks: Vec<Vec<String>>, dst: Vec<Vec<Vec<u64>>>| {
        let src: Vec<Vec<Vec<u64>>> = dst
            .iter()
            .map(|g| g.iter().map(|f| vec![0; f.len()]).collect())
            .collect();
        let sz: Vec<Vec<Vec<u64>>> = dst
            .iter()
            .map(|g| g.iter().map(|f| vec![1; f.len()]).collect())
            .collect();
        // SAFETY: every destination is checked against the registered region.
        let res = unsafe { a.get_into_ranges(ptrs, &ks, &dst, &src, &sz) };
        res.into_iter()
            .map(|g| {
                g.into_iter()
                    .map(|f| {
                        f.into_iter()
                            .map(|x| x.map_or_else(|e| e.code().code() as i64, |n| n as i64))
                            .collect::<Vec<_>>()
                    })
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    // Outer lists of different lengths: every fragment -600, one entry per buffer.
    assert_eq!(
        ranges(&[r, r], vec![keys(&["a"])], vec![vec![vec![0, 1]]]),
        vec![vec![vec![-600, -600]], vec![]]
    );
    // A buffer whose key list is longer than its groups fails as a whole;
    // an empty key fails its group only; an unregistered buffer fails whole.
    assert_eq!(
        ranges(
            &[r, r, 1],
            vec![keys(&["a", "k"]), keys(&["", "a"]), keys(&["a"])],
            vec![vec![vec![0]], vec![vec![2], vec![3]], vec![vec![0]]]
        ),
        vec![
            vec![vec![-600]],
            vec![vec![-600], vec![1]],
            vec![vec![-600]]
        ]
    );
    assert_eq!(region[3], 7);
    assert_eq!(a.unregister_buffer(r), Ok(()));
    assert_eq!(code(a.unregister_buffer(r)), -600);
    a.close();
}
