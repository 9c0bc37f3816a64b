//! End-to-end: a real master RPC server (in-process) and real clients.

use mooncake_client::{Client, ClientConfig, WriteConfig};
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
        protocol: "tcp".into(),
        master_server_addr: master.into(),
    })
    .unwrap()
}

#[test]
fn put_get_remove_ranges() {
    let m = start_master(MasterConfig {
        default_kv_lease_ttl_ms: 500,
        ..MasterConfig::default()
    });
    let a = client(&m, 64 << 20);
    let b = client(&m, 0);
    let cfg = WriteConfig::default();
    assert_eq!(a.put_parts("k1", &[b"hello"], &cfg, false), 0);
    assert_eq!(a.put_parts("k1", &[b"world!!"], &cfg, false), 0);
    assert_eq!(b.get("k1").unwrap().data, b"hello");
    assert_eq!(a.get("k1").unwrap().data, b"hello");
    assert_eq!(a.remove(&["k1".into()], false), vec![-706]);
    assert_eq!(a.remove(&["k1".into()], true), vec![0]);
    assert_eq!(a.get_size("k1"), -704);
    // upsert
    assert_eq!(a.put_parts("u", &[b"v1"], &cfg, true), 0);
    assert_eq!(a.put_parts("u", &[b"v2-longer"], &cfg, true), 0);
    assert_eq!(b.get("u").unwrap().data, b"v2-longer");
    // ranges
    let v: Vec<u8> = (0..36u8).collect();
    assert_eq!(a.put_parts("r", &[&v], &cfg, false), 0);
    let mut buf = vec![0u8; 32];
    let p = buf.as_mut_ptr() as usize;
    assert_eq!(b.register_buffer(p, 32), 0);
    let res = unsafe {
        b.get_into_ranges(
            &[p],
            &[vec!["r".into(), "missing".into()]],
            &[vec![vec![0, 10], vec![20]]],
            &[vec![vec![4, 30], vec![0]]],
            &[vec![vec![4, 3], vec![4]]],
        )
    };
    assert_eq!(res, vec![vec![vec![4, 3], vec![-704]]]);
    assert_eq!(&buf[0..4], &[4, 5, 6, 7]);
    assert_eq!(&buf[10..13], &[30, 31, 32]);
    let stats: std::collections::HashMap<_, _> = b.stats().into_iter().collect();
    assert_eq!(stats["bytes_read_local"], 7 + 5 + 9);
    // big value, direct path
    let big: Vec<u8> = (0..(8usize << 20)).map(|i| (i % 251) as u8).collect();
    assert_eq!(
        unsafe { a.put_from("big", big.as_ptr() as usize, big.len(), &cfg, false) },
        0
    );
    let mut out = vec![0u8; big.len()];
    assert_eq!(
        unsafe { b.get_into("big", out.as_mut_ptr() as usize, out.len()) },
        big.len() as i64
    );
    assert!(out == big);
    let mut small = vec![0u8; 10];
    assert_eq!(
        unsafe { b.get_into("big", small.as_mut_ptr() as usize, 10) },
        -600
    );
    a.close();
    assert_eq!(b.get_size("big"), -704);
    b.close();
}
