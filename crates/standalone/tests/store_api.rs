//! A dummy client is a `StoreApi` like the in-process client: every query
//! of the store's list (`mooncake_client::store_queries!`) reaches the
//! daemon through the trait and answers what the daemon's own client
//! answers, with no code written for the dummy per query.

use mooncake_client::{Client, ClientConfig, ReplicateConfig, StoreApi};
use mooncake_master::config::MasterConfig;
use mooncake_standalone::{setup_dummy, DummyServer};
use std::sync::Arc;

/// A master, an in-process client, a daemon serving it and a dummy client
/// of that daemon. The daemon's port only names its socket on this host;
/// each test of this process passes its own `n`.
fn daemon(n: u16) -> (DummyServer, Arc<dyn StoreApi>, Arc<dyn StoreApi>) {
    let master =
        mooncake_master::embedded::spawn_loopback(MasterConfig::default()).expect("master");
    let client = Client::setup(ClientConfig::loopback(&master, 64 << 20)).expect("client");
    let port = 20_000 + n + (std::process::id() % 40_000) as u16;
    let server = DummyServer::start(Arc::clone(&client), port).expect("daemon");
    let dummy = setup_dummy(0, 16 << 20, &format!("127.0.0.1:{port}")).expect("setup_dummy");
    (server, client, dummy)
}

/// The lookups among the listed queries of `s` about `keys`, rendered for
/// comparison.
fn queries(s: &dyn StoreApi, keys: &[String]) -> Vec<String> {
    vec![
        format!("{:?}", s.get_size(&keys[0])),
        format!("{:?}", s.is_exist(&keys[0])),
        format!("{:?}", s.batch_is_exist(keys)),
        format!("{:?}", s.replica_descs(keys)),
        format!("{:?}", s.create_copy_task(&keys[1], &keys[..1])),
        format!("{:?}", s.create_move_task(&keys[0], "nowhere", &keys[1])),
        format!("{:?}", s.query_task(7)),
    ]
}

#[test]
fn a_dummy_serves_every_query_through_the_trait() {
    let (server, local, dummy) = daemon(0);
    let cfg = ReplicateConfig::default();

    let keys: Vec<String> = vec!["a".into(), "missing".into()];
    local.put("a", b"hello", &cfg, false).expect("put");
    let seen = queries(&*local, &keys);
    assert_eq!(queries(&*dummy, &keys), seen);
    assert_eq!(seen[0], "Ok(5)");
    assert_eq!(seen[1], "Ok(true)");
    assert!(seen[4].contains("ObjectNotFound"), "{}", seen[4]);
    assert!(seen[5].contains("InvalidParams"), "{}", seen[5]);
    assert!(seen[6].contains("TaskNotFound"), "{}", seen[6]);
    // A copy task through the dummy, onto the segment that holds the
    // object: created, nothing to copy, queryable on both.
    let endpoint = match local.replica_descs(&keys[..1]).pop() {
        Some(Ok(mut d)) => match d.pop() {
            Some(mooncake_client::ReplicaDesc::Memory {
                transport_endpoint, ..
            }) => transport_endpoint,
            other => panic!("not a memory replica: {other:?}"),
        },
        other => panic!("no replicas: {other:?}"),
    };
    let id = dummy.create_copy_task("a", &[endpoint]).expect("copy task");
    let info = dummy.query_task(id).expect("query");
    assert_eq!(info.state, mooncake_client::TaskState::Success);
    assert_eq!(local.query_task(id), Ok(info));

    // Removals through the dummy are the daemon client's (the lookups
    // leased "a": only a forced removal takes it).
    assert_eq!(
        format!("{:?}", dummy.remove("a", false)),
        format!("{:?}", local.remove("a", false))
    );
    assert_eq!(dummy.remove("a", true), Ok(()));
    assert_eq!(local.is_exist("a"), Ok(false));
    dummy.put("b1", b"x", &cfg, false).expect("put b1");
    dummy.put("b2", b"y", &cfg, false).expect("put b2");
    dummy.put("c", b"z", &cfg, false).expect("put c");
    let batch: Vec<String> = vec!["b1".into(), "missing".into()];
    assert_eq!(
        format!("{:?}", dummy.batch_remove(&batch, false)),
        format!("{:?}", vec![Ok(()), local.remove("missing", false)])
    );
    assert_eq!(dummy.remove_by_regex("^b", false), Ok(1));
    assert_eq!(dummy.remove_all(false), Ok(1));
    assert_eq!(local.is_exist("c"), Ok(false));

    // A query the daemon cannot be asked fails: one error, or one per key.
    dummy.close();
    assert!(dummy.get_size("a").is_err());
    let per_key = dummy.batch_is_exist(&keys);
    assert_eq!(per_key.len(), keys.len());
    assert!(per_key.iter().all(Result::is_err));
    server.stop();
    local.close();
}

/// The listed memory-moving calls, by name.
macro_rules! move_names {
    (unsafe { $($(#[$m:meta])* fn $n:ident(&self $(, $a:ident: $t:ty)* $(,)?) -> $r:ty;)* }) => {
        vec![$(stringify!($n)),*]
    };
}

/// Every memory-moving call of the list on `s`, under keys starting with
/// `p`: sources in `shared` (a caller buffer that lies in the dummy's
/// shared memory when `s` is one) and in plain heap memory, destinations
/// in both. Returns the calls made, and their results and the bytes the
/// destinations hold, rendered for comparison.
fn moves(s: &dyn StoreApi, p: &str, shared: &mut [u8]) -> (Vec<&'static str>, Vec<String>) {
    use mooncake_client::{Dst, DstLists, Dsts, Src, SrcLists, Srcs};
    let cfg = ReplicateConfig::default();
    let k = |n: &str| format!("{p}{n}");
    let mut made = Vec::new();
    let mut seen = Vec::new();
    let heap: Vec<u8> = (0..64u8).collect();
    let (hp, sp) = (heap.as_ptr() as usize, shared.as_mut_ptr() as usize);
    shared[..64].copy_from_slice(&[9u8; 64]);
    let src = |ptr, len| Src { ptr, len };
    // SAFETY: `heap` and `shared` outlive every call below and every range
    // lies inside them; the destinations are `shared[64..]` and `out`,
    // which nothing else uses meanwhile.
    unsafe {
        made.push("put_from");
        seen.push(format!(
            "{:?}",
            s.put_from(&k("a"), src(hp, 10), &cfg, false)
        ));
        made.push("put_from_with_metadata");
        seen.push(format!(
            "{:?}",
            s.put_from_with_metadata(&k("m"), src(sp, 8), src(hp, 4), &cfg)
        ));
        made.push("batch_put_from");
        let srcs = Srcs {
            ptrs: &[hp, sp, hp],
            sizes: &[16, 24, 0],
        };
        seen.push(format!(
            "{:?}",
            s.batch_put_from(&[k("b1"), k("b2"), k("b3")], srcs, &cfg, false)
        ));
        let mismatch = Srcs {
            ptrs: &[hp],
            sizes: &[1, 2],
        };
        seen.push(format!(
            "{:?}",
            s.batch_put_from(&[k("x"), k("y")], mismatch, &cfg, false)
        ));
        made.push("batch_put_from_multi_buffers");
        let bufs = SrcLists {
            ptrs: &[vec![hp, sp], vec![sp]],
            sizes: &[vec![5, 6], vec![7]],
        };
        seen.push(format!(
            "{:?}",
            s.batch_put_from_multi_buffers(&[k("mb1"), k("mb2")], bufs, &cfg)
        ));

        let mut out = vec![0u8; 64];
        let op = out.as_mut_ptr() as usize;
        made.push("get_into");
        seen.push(format!(
            "{:?}",
            s.get_into(&k("m"), Dst { ptr: op, len: 64 })
        ));
        seen.push(format!(
            "{:?}",
            s.get_into(
                &k("a"),
                Dst {
                    ptr: sp + 64,
                    len: 4
                }
            )
        ));
        made.push("batch_get_into");
        let dsts = Dsts {
            ptrs: &[op + 16, sp + 64, op],
            sizes: &[16, 32, 8],
        };
        seen.push(format!(
            "{:?}",
            s.batch_get_into(&[k("b1"), k("b2"), k("missing")], dsts)
        ));
        made.push("batch_get_into_multi_buffers");
        let bufs = DstLists {
            ptrs: &[vec![op + 40, sp + 100]],
            sizes: &[vec![3, 8]],
        };
        seen.push(format!(
            "{:?}",
            s.batch_get_into_multi_buffers(&[k("mb1")], bufs, false)
        ));

        seen.push(format!(
            "{:?}",
            s.batch_put_session_start(&[k("s")], &[12], &cfg)
        ));
        made.push("batch_put_from_multi_buffer_ranges");
        let bufs = SrcLists {
            ptrs: &[vec![hp + 3, sp]],
            sizes: &[vec![6, 6]],
        };
        let offsets = [vec![6, 0]];
        seen.push(format!(
            "{:?}",
            s.batch_put_from_multi_buffer_ranges(&[k("s")], bufs, &offsets)
        ));
        seen.push(format!("{:?}", s.batch_put_session_end(&[k("s")])));
        seen.push(format!("{:?}", s.batch_get_session_start(&[k("s")])));
        made.push("batch_get_into_multi_buffer_ranges");
        let bufs = DstLists {
            ptrs: &[vec![op + 50, sp + 120]],
            sizes: &[vec![4, 4]],
        };
        let offsets = [vec![0, 8]];
        seen.push(format!(
            "{:?}",
            s.batch_get_into_multi_buffer_ranges(&[k("s")], bufs, &offsets)
        ));
        seen.push(format!("{:?}", s.batch_get_session_end(&[k("s")])));
        seen.push(format!("{:?} {:?}", out, &shared[64..128]));
    }
    (made, seen)
}

#[test]
fn a_dummy_serves_every_memory_moving_call_through_the_trait() {
    let (server, local, dummy) = daemon(1);

    let mut heap_shared = vec![0u8; 256];
    let (made, seen) = moves(&*local, "local/", &mut heap_shared);
    let size = 256u64;
    let at = mooncake_standalone::host_alloc(size);
    assert_ne!(at, 0, "host_alloc");
    // SAFETY: `host_alloc` gave `size` bytes at `at`, freed below.
    let shared = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, size as usize) };
    shared.fill(0);
    let (_, through_dummy) = moves(&*dummy, "dummy/", shared);
    assert_eq!(mooncake_standalone::host_free(at), 0);

    // Every listed call was made, and answered as the daemon's own client
    // answers, with the same bytes in the destinations.
    let mut listed: Vec<&str> = mooncake_client::store_moves!(move_names);
    let mut made = made;
    listed.sort_unstable();
    made.sort_unstable();
    assert_eq!(made, listed);
    assert_eq!(through_dummy, seen);
    assert_eq!(seen[0], "Ok(())");
    assert!(
        seen[2].contains("Err") && seen[2].starts_with("Ok(["),
        "{}",
        seen[2]
    );
    assert!(seen[3].contains("InvalidParams"), "{}", seen[3]);
    assert_eq!(seen[5], "Ok(12)");
    assert!(
        seen[6].contains("InvalidParams"),
        "a too-short destination: {}",
        seen[6]
    );
    server.stop();
    local.close();
}
