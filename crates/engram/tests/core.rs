//! EngramCore against a real in-process master and real clients:
//! populate (create-only, rollback), lookup (cache, invalidation, size
//! check, zero-fill), remove, and the create-only client put.

use mooncake_client::{Client, ClientConfig, WriteConfig};
use mooncake_engram::{validate_layout, EngramCore, OutBuf, OutKind};
use mooncake_master::config::MasterConfig;
use std::sync::Arc;

fn start_master(lease_ms: u64) -> String {
    let cfg = MasterConfig {
        default_kv_lease_ttl_ms: lease_ms,
        ..MasterConfig::default()
    };
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

const VOCAB: [i64; 3] = [5, 7, 11];
const D: usize = 4;

fn tables(offset: f32) -> Vec<Vec<f32>> {
    VOCAB
        .iter()
        .enumerate()
        .map(|(h, &n)| {
            (0..n as usize * D)
                .map(|i| i as f32 + 1000.0 * h as f32 + offset)
                .collect()
        })
        .collect()
}

fn spans(t: &[Vec<f32>]) -> Vec<(usize, usize)> {
    t.iter()
        .map(|v| (v.as_ptr() as usize, v.len() * 4))
        .collect()
}

fn lookup(core: &EngramCore, c: &Arc<Client>, ids: &[i64], b: usize) -> Result<Vec<f32>, ()> {
    let mut out = vec![1.0f32; ids.len() * D];
    let buf = OutBuf {
        ptr: out.as_mut_ptr() as usize,
        len: out.len() * 4,
        kind: OutKind::Float32,
    };
    let r = unsafe { core.lookup_into(Some(c), ids, b, 1, buf) };
    match r {
        Ok(()) => Ok(out),
        Err(_) => {
            assert!(out.iter().all(|&x| x == 0.0), "zero-filled on failure");
            Err(())
        }
    }
}

fn expect(t: &[Vec<f32>], ids: &[i64]) -> Vec<f32> {
    let h_n = VOCAB.len();
    let mut v = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        let h = i % h_n;
        v.extend_from_slice(&t[h][id as usize * D..(id as usize + 1) * D]);
    }
    v
}

#[test]
fn populate_lookup_remove() {
    let m = start_master(500);
    let a = client(&m, 16 << 20);
    let layout = validate_layout(&VOCAB, D as i64, "float32").unwrap();
    let core = EngramCore::new(3, layout);
    let t = tables(0.0);
    let cfg = WriteConfig::default();
    assert!(unsafe { core.populate(&a, &spans(&t), &cfg) });
    // Create-only: a second populate fails and leaves the data.
    assert!(!unsafe { core.populate(&a, &spans(&tables(0.5)), &cfg) });
    let ids = [0, 6, 10, 4, 0, 0, 4, 6, 10];
    assert_eq!(lookup(&core, &a, &ids, 3).unwrap(), expect(&t, &ids));
    // Out of range -> failure, zero-filled.
    assert!(lookup(&core, &a, &[5, 0, 0], 1).is_err());
    assert!(lookup(&core, &a, &[-1, 0, 0], 1).is_err());
    // Cached: no master RPC per lookup.
    let rpcs = |c: &Client| c.stats().iter().find(|e| e.0 == "master_rpcs").unwrap().1;
    let before = rpcs(&a);
    for _ in 0..20 {
        lookup(&core, &a, &ids, 3).unwrap();
    }
    assert!(rpcs(&a) - before <= 1);
    // A forced remove through the same client invalidates the cache.
    assert_eq!(a.remove(&[core.keys()[1].clone()], true), vec![0]);
    assert!(lookup(&core, &a, &ids, 3).is_err());
    assert_eq!(core.remove(&a, true), Ok(2));
    assert_eq!(core.remove(&a, true), Ok(0));
    // Repopulate with new values: the next lookup sees them.
    let t2 = tables(0.5);
    assert!(unsafe { core.populate(&a, &spans(&t2), &cfg) });
    assert_eq!(lookup(&core, &a, &ids, 3).unwrap(), expect(&t2, &ids));
    // Non-forced remove right after a lookup hits the lease.
    assert_eq!(core.remove(&a, false), Err(-706));
}

#[test]
fn create_only_put_reports_existing_and_rollback_keeps_it() {
    let m = start_master(500);
    let a = client(&m, 16 << 20);
    let layout = validate_layout(&VOCAB, D as i64, "float32").unwrap();
    let core = EngramCore::new(4, layout);
    let t = tables(0.0);
    let cfg = WriteConfig::default();
    let other = vec![9u8; VOCAB[2] as usize * D * 4];
    let key = core.keys()[2].clone();
    let codes = unsafe {
        a.batch_create_from(
            std::slice::from_ref(&key),
            &[other.as_ptr() as usize],
            &[other.len()],
            &cfg,
        )
    };
    assert_eq!(codes, vec![0]);
    let again = unsafe {
        a.batch_create_from(
            std::slice::from_ref(&key),
            &[other.as_ptr() as usize],
            &[other.len()],
            &cfg,
        )
    };
    assert_eq!(again, vec![-705]);
    // Populate refuses (key exists), writes nothing, keeps the other table.
    assert!(!unsafe { core.populate(&a, &spans(&t), &cfg) });
    let keys = core.keys().to_vec();
    assert_eq!(a.is_exist(&keys), vec![0, 0, 1]);
    assert_eq!(a.get(&key).unwrap().data, other);
}

#[test]
fn size_check_and_half_tables() {
    let m = start_master(500);
    let a = client(&m, 16 << 20);
    let cfg = WriteConfig::default();
    // A bf16 layer over the same keys has half-size tables.
    let bf = EngramCore::new(5, validate_layout(&VOCAB, D as i64, "bfloat16").unwrap());
    let bits: Vec<Vec<u16>> = tables(0.0)
        .iter()
        .map(|t| {
            t.iter()
                .map(|&x| mooncake_engram::convert::f32_to_bf16(x))
                .collect()
        })
        .collect();
    let sp: Vec<(usize, usize)> = bits
        .iter()
        .map(|v| (v.as_ptr() as usize, v.len() * 2))
        .collect();
    assert!(unsafe { bf.populate(&a, &sp, &cfg) });
    let ids = [1, 2, 3];
    let out = lookup(&bf, &a, &ids, 1).unwrap();
    let exp: Vec<f32> = expect(&tables(0.0), &ids)
        .iter()
        .map(|&x| mooncake_engram::convert::bf16_to_f32(mooncake_engram::convert::f32_to_bf16(x)))
        .collect();
    assert_eq!(out, exp);
    // A float32 layer over the bf16-sized tables fails the size check.
    let f32core = EngramCore::new(5, validate_layout(&VOCAB, D as i64, "float32").unwrap());
    assert!(lookup(&f32core, &a, &ids, 1).is_err());
}
