//! EngramCore against a real in-process master and real clients:
//! populate (create-only, rollback), lookup (cache, invalidation, size
//! check, zero-fill), remove, and the create-only client put.

use mooncake_client::{Client, ClientConfig, ErrorCode, ReplicateConfig};
use mooncake_engram::{validate_layout, EngramCore, Error, OutBuf, OutKind, Table};
use mooncake_master::config::MasterConfig;
use std::sync::Arc;

/// A client (16 MiB segment) of a fresh in-process master with 500 ms
/// leases.
fn client() -> Arc<Client> {
    let cfg = MasterConfig {
        default_kv_lease_ttl_ms: 500,
        ..MasterConfig::default()
    };
    let master = mooncake_master::embedded::spawn_loopback(cfg).expect("start master");
    Client::setup(ClientConfig::loopback(&master, 16 << 20)).expect("client setup")
}

/// Engram layer `layer_id` over the [`VOCAB`] x [`D`] tables, stored as `dtype`.
fn layer(layer_id: i32, dtype: &str) -> EngramCore {
    EngramCore::new(
        layer_id,
        validate_layout(&VOCAB, D as i64, dtype).expect("layout"),
    )
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

fn spans(t: &[Vec<f32>]) -> Vec<Table<'_>> {
    t.iter().map(|v| Table::F32(v)).collect()
}

fn lookup(core: &EngramCore, c: &Arc<Client>, ids: &[i64], b: usize) -> Result<Vec<f32>, String> {
    let mut out = vec![1.0f32; ids.len() * D];
    let buf = OutBuf {
        ptr: out.as_mut_ptr() as usize,
        len: out.len() * 4,
        kind: OutKind::Float32,
    };
    // SAFETY: `out` is writable for `buf.len` bytes.
    let r = unsafe { core.lookup_into(Some(c), ids, b, 1, buf) };
    match r {
        Ok(()) => Ok(out),
        Err(e) => {
            assert!(out.iter().all(|&x| x == 0.0), "zero-filled on failure");
            assert_eq!(e.message(), "EngramStore lookup failed");
            Err(e.to_string())
        }
    }
}

/// Which of `core`'s table keys `a` finds stored.
fn stored(a: &Client, core: &EngramCore) -> Vec<bool> {
    a.batch_is_exist(core.keys())
        .into_iter()
        .map(|r| r.expect("exist query"))
        .collect()
}

/// A [`client`] and a float32 [`layer`] `layer_id`.
fn client_and_layer(layer_id: i32) -> (Arc<Client>, EngramCore) {
    (client(), layer(layer_id, "float32"))
}

/// [`expect`] with every value rounded by `round` (through a narrower type).
fn expect_rounded(t: &[Vec<f32>], ids: &[i64], round: impl Fn(f32) -> f32) -> Vec<f32> {
    expect(t, ids).into_iter().map(round).collect()
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
    let (a, core) = client_and_layer(3);
    let t = tables(0.0);
    let cfg = ReplicateConfig::default();
    assert_eq!(core.populate(Some(&a), &spans(&t), &cfg), Ok(()));
    // Create-only: a second populate fails and leaves the data.
    let again = core.populate(Some(&a), &spans(&tables(0.5)), &cfg);
    assert!(
        matches!(&again, Err(Error::Populate(e)) if e.code() == ErrorCode::ObjectAlreadyExists)
    );
    assert!(again
        .expect_err("exists")
        .reason()
        .contains("requires empty destination key"));
    let ids = [0, 6, 10, 4, 0, 0, 4, 6, 10];
    assert_eq!(lookup(&core, &a, &ids, 3), Ok(expect(&t, &ids)));
    // Out of range -> failure, zero-filled.
    assert!(lookup(&core, &a, &[5, 0, 0], 1).is_err());
    assert!(lookup(&core, &a, &[-1, 0, 0], 1).is_err());
    // Cached: no master RPC per lookup.
    let rpcs = |c: &Client| {
        c.stats()
            .iter()
            .find(|e| e.0 == "master_rpcs")
            .map_or(0, |e| e.1)
    };
    let before = rpcs(&a);
    for _ in 0..20 {
        lookup(&core, &a, &ids, 3).expect("lookup");
    }
    assert!(rpcs(&a) - before <= 1);
    // A forced remove through the same client invalidates the cache.
    assert_eq!(a.remove(&core.keys()[1], true), Ok(()));
    assert!(lookup(&core, &a, &ids, 3).is_err());
    assert_eq!(core.remove(Some(&a), true), Ok(2));
    assert_eq!(core.remove(Some(&a), true), Ok(0));
    // Repopulate with new values: the next lookup sees them.
    let t2 = tables(0.5);
    assert_eq!(core.populate(Some(&a), &spans(&t2), &cfg), Ok(()));
    assert_eq!(lookup(&core, &a, &ids, 3), Ok(expect(&t2, &ids)));
    // Non-forced remove right after a lookup hits the lease.
    let leased = core.remove(Some(&a), false).expect_err("leased");
    assert_eq!(leased.message(), "remove_from_store failed, rc=-706");
    // No store: metadata-only failures.
    assert_eq!(
        core.remove(None, true).expect_err("no store").message(),
        "remove_from_store failed, rc=-600"
    );
    assert!(matches!(
        core.populate(None, &spans(&t2), &cfg),
        Err(Error::Populate(_))
    ));
}

#[test]
fn populate_rejects_an_invalid_replicate_config() {
    let (a, core) = client_and_layer(6);
    let t = tables(0.0);
    // A soft-pin TTL without SoftPin::Enable and a group_ids list that does
    // not have one entry per head are rejected as for any batch write.
    for cfg in [
        ReplicateConfig {
            soft_pin_ttl_ms: Some(1000),
            ..ReplicateConfig::default()
        },
        ReplicateConfig {
            group_ids: Some(vec!["g".into()]),
            ..ReplicateConfig::default()
        },
        ReplicateConfig {
            replica_num: 0,
            ..ReplicateConfig::default()
        },
    ] {
        let e = core
            .populate(Some(&a), &spans(&t), &cfg)
            .expect_err("rejected");
        assert_eq!(e.code(), ErrorCode::InvalidParams, "{cfg:?}");
        assert_eq!(e.message(), "populate failed");
    }
    let exists = stored(&a, &core);
    assert_eq!(exists, vec![false; VOCAB.len()], "nothing was written");
    let groups = ReplicateConfig {
        group_ids: Some(vec!["g".into(); VOCAB.len()]),
        ..ReplicateConfig::default()
    };
    assert_eq!(core.populate(Some(&a), &spans(&t), &groups), Ok(()));
}

#[test]
fn create_only_put_reports_existing_and_rollback_keeps_it() {
    let (a, core) = client_and_layer(4);
    let t = tables(0.0);
    let cfg = ReplicateConfig::default();
    let other = vec![9u8; VOCAB[2] as usize * D * 4];
    let key = core.keys()[2].clone();
    let create = || {
        // SAFETY: `other` outlives the call.
        unsafe {
            a.batch_create_from(
                std::slice::from_ref(&key),
                &[other.as_ptr() as usize],
                &[other.len()],
                &cfg,
            )
        }
    };
    assert_eq!(create(), Ok(vec![Ok(())]));
    let again = create().expect("call");
    assert_eq!(
        again[0].as_ref().map_err(|e| e.code()),
        Err(ErrorCode::ObjectAlreadyExists)
    );
    // Populate refuses (key exists), writes nothing, keeps the other table.
    assert!(core.populate(Some(&a), &spans(&t), &cfg).is_err());
    let exists = stored(&a, &core);
    assert_eq!(exists, vec![false, false, true]);
    assert_eq!(a.get(&key).expect("get").data, other);
}

#[test]
fn size_check_and_half_tables() {
    let a = client();
    let cfg = ReplicateConfig::default();
    // A bf16 layer over the same keys has half-size tables; float32 input
    // is narrowed by populate.
    let bf = layer(5, "bfloat16");
    let t = tables(0.0);
    assert_eq!(bf.populate(Some(&a), &spans(&t), &cfg), Ok(()));
    let stored = a.get(&bf.keys()[0]).expect("get").data;
    assert_eq!(stored.len(), VOCAB[0] as usize * D * 2);
    let ids = [1, 2, 3];
    let out = lookup(&bf, &a, &ids, 1).expect("lookup");
    let exp = expect_rounded(&t, &ids, |x| half::bf16::from_f32(x).to_f32());
    assert_eq!(out, exp);
    // A float32 layer over the bf16-sized tables fails the size check.
    let f32core = layer(5, "float32");
    assert!(lookup(&f32core, &a, &ids, 1).is_err());
    // A float16 layer given raw bits of the wrong size is refused before
    // anything is written.
    let f16core = layer(7, "float16");
    let short = vec![0u8; 6];
    let raw: Vec<Table<'_>> = (0..VOCAB.len()).map(|_| Table::Raw(&short)).collect();
    let e = f16core
        .populate(Some(&a), &raw, &cfg)
        .expect_err("wrong size");
    assert!(e.reason().contains("the layout needs"), "{e}");
    let f16t: Vec<Vec<u16>> = t
        .iter()
        .map(|v| {
            v.iter()
                .map(|&x| half::f16::from_f32(x).to_bits())
                .collect()
        })
        .collect();
    let bytes: Vec<Vec<u8>> = f16t
        .iter()
        .map(|v| v.iter().flat_map(|b| b.to_le_bytes()).collect())
        .collect();
    let raw: Vec<Table<'_>> = bytes.iter().map(|b| Table::Raw(b)).collect();
    assert_eq!(f16core.populate(Some(&a), &raw, &cfg), Ok(()));
    let out = lookup(&f16core, &a, &ids, 1).expect("lookup");
    let exp = expect_rounded(&t, &ids, |x| half::f16::from_f32(x).to_f32());
    assert_eq!(out, exp);
}
