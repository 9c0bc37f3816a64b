//! A dummy client is a `StoreApi` like the in-process client: every query
//! of the store's list (`mooncake_client::store_queries!`) reaches the
//! daemon through the trait and answers what the daemon's own client
//! answers, with no code written for the dummy per query.

use mooncake_client::{Client, ClientConfig, ReplicateConfig, StoreApi};
use mooncake_master::config::MasterConfig;
use mooncake_standalone::{setup_dummy, DummyServer};
use std::sync::Arc;

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
    let master =
        mooncake_master::embedded::spawn_loopback(MasterConfig::default()).expect("master");
    let client = Client::setup(ClientConfig::loopback(&master, 64 << 20)).expect("client");
    // The port only names the daemon's socket on this host.
    let port = 20_000 + (std::process::id() % 40_000) as u16;
    let server = DummyServer::start(Arc::clone(&client), port).expect("daemon");
    let dummy = setup_dummy(0, 16 << 20, &format!("127.0.0.1:{port}")).expect("setup_dummy");
    let local: Arc<dyn StoreApi> = client;
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
