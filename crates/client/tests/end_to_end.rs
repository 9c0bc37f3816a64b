//! End-to-end: a real master RPC server (in-process) and real clients.

use mooncake_client::{Client, ClientConfig, ErrorCode, ReplicateConfig};
use mooncake_master::config::MasterConfig;
use std::sync::Arc;

fn start_master(cfg: MasterConfig) -> String {
    mooncake_master::embedded::spawn_loopback(cfg).expect("start master")
}

fn client(master: &str, seg: u64) -> Arc<Client> {
    Client::setup(ClientConfig {
        local_hostname: "127.0.0.1".into(),
        metadata_server: "P2PHANDSHAKE".into(),
        global_segment_size: seg,
        local_buffer_size: 16 << 20,
        master_server_addr: master.into(),
        ..ClientConfig::default()
    })
    .expect("client setup")
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
    let put = unsafe { a.put_from("big", big.as_ptr() as usize, big.len(), &cfg, false) };
    assert_eq!(put, Ok(()));
    let mut out = vec![0u8; big.len()];
    // SAFETY: `out` is writable for its length.
    let got = unsafe { b.get_into("big", out.as_mut_ptr() as usize, out.len()) };
    assert_eq!(got, Ok(big.len() as u64));
    assert!(out == big);
    let mut small = vec![0u8; 10];
    // SAFETY: `small` is writable for 10 bytes.
    let got = unsafe { b.get_into("big", small.as_mut_ptr() as usize, 10) };
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
