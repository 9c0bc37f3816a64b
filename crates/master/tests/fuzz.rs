//! Fuzz targets for the master's decoders of untrusted input:
//! RPC request frames decoded and executed against the master state, and
//! arbitrary HTTP requests through the metadata and admin routers (driven
//! in memory). The budget per target is `MC_FUZZ_SECS` (see
//! `mooncake_common::fuzz`).

use axum::body::Body;
use axum::http::Request;
use axum::Router;
use mooncake_common::auth::HTTP_AUTH_HEADER;
use mooncake_common::framing;
use mooncake_common::fuzz;
use mooncake_common::proto::{
    encode_request, MasterRequest, MasterResponse, RequestFrame, SegmentDesc, SoftPin, WriteConfig,
};
use mooncake_common::AuthKey;
use mooncake_master::admin::{admin_router, AdminView};
use mooncake_master::config::MasterConfig;
use mooncake_master::http_meta::metadata_router;
use mooncake_master::metadata_kv::MetadataKv;
use mooncake_master::metrics::MasterMetrics;
use mooncake_master::rpc::dispatch;
use mooncake_master::state::MasterState;
use proptest::prelude::*;
use std::sync::Arc;
use tower::ServiceExt;

fn names() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-c]{1,2}",
        "h:[0-9]",
        any::<String>()
    ]
}

fn sizes() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(u64::MAX),
        Just(1u64 << 47),
        Just((1u64 << 47) + 1),
        1u64..1 << 22,
        any::<u64>()
    ]
}

fn segment() -> impl Strategy<Value = SegmentDesc> {
    (names(), names(), sizes(), any::<u64>()).prop_map(|(name, uuid, size, base_addr)| {
        SegmentDesc {
            endpoint: name.clone(),
            name,
            uuid,
            size,
            base_addr,
            host_id: "h".into(),
            pid: 1,
            socket_name: String::new(),
        }
    })
}

/// The 1 MiB segment `h:1` of host `h`, at `base_addr` in its owner.
fn segment_at(base_addr: u64) -> SegmentDesc {
    SegmentDesc {
        name: "h:1".into(),
        uuid: "u".into(),
        size: 1 << 20,
        base_addr,
        host_id: "h".into(),
        pid: 1,
        endpoint: "h:1".into(),
        socket_name: String::new(),
    }
}

fn write_config() -> impl Strategy<Value = WriteConfig> {
    (
        0u32..4,
        prop_oneof![
            Just(SoftPin::Preserve),
            Just(SoftPin::Enable),
            Just(SoftPin::Disable)
        ],
        proptest::option::of(sizes()),
        any::<bool>(),
        proptest::collection::vec(names(), 0..3),
    )
        .prop_map(
            |(replica_num, soft_pin, ttl, hard_pin, preferred)| WriteConfig {
                replica_num,
                soft_pin,
                soft_pin_ttl_ms: ttl,
                hard_pin,
                preferred_segments: preferred,
                ..WriteConfig::default()
            },
        )
}

fn request() -> impl Strategy<Value = MasterRequest> {
    let keys = || proptest::collection::vec(names(), 0..4);
    prop_oneof![
        names().prop_map(|client_id| MasterRequest::Ping { client_id }),
        (names(), segment())
            .prop_map(|(client_id, segment)| MasterRequest::MountSegment { client_id, segment }),
        (names(), names()).prop_map(|(client_id, segment_name)| {
            MasterRequest::UnmountSegment {
                client_id,
                segment_name,
            }
        }),
        names().prop_map(|client_id| MasterRequest::Disconnect { client_id }),
        (
            keys(),
            proptest::collection::vec(sizes(), 0..4),
            write_config(),
            any::<bool>(),
            keys()
        )
            .prop_map(|(keys, sizes, config, upsert, exclude)| {
                MasterRequest::PutStart {
                    keys,
                    sizes,
                    config,
                    upsert,
                    exclude,
                }
            }),
        (keys(), proptest::collection::vec(any::<u64>(), 0..4))
            .prop_map(|(keys, versions)| MasterRequest::PutEnd { keys, versions }),
        (keys(), proptest::collection::vec(any::<u64>(), 0..4))
            .prop_map(|(keys, versions)| MasterRequest::PutRevoke { keys, versions }),
        (keys(), any::<bool>())
            .prop_map(|(keys, track)| MasterRequest::GetReplicaList { keys, track }),
        proptest::collection::vec(any::<u64>(), 0..4)
            .prop_map(|tickets| MasterRequest::ReadsDone { tickets }),
        keys().prop_map(|keys| MasterRequest::Exist { keys }),
        (keys(), any::<bool>()).prop_map(|(keys, force)| MasterRequest::Remove { keys, force }),
        (names(), any::<bool>())
            .prop_map(|(pattern, force)| MasterRequest::RemoveByRegex { pattern, force }),
        any::<bool>().prop_map(|force| MasterRequest::RemoveAll { force }),
    ]
}

fn state(auth: Option<AuthKey>) -> Arc<MasterState> {
    MasterState::new(
        MasterConfig {
            auth,
            ..MasterConfig::default()
        },
        Arc::new(MasterMetrics::default()),
        Some(Arc::new(MetadataKv::new())),
    )
}

fn check_invariants(st: &MasterState) -> Result<(), TestCaseError> {
    let (used, total) = st.usage();
    prop_assert!(used <= total, "used {used} > total {total}");
    let g = st.gauges();
    prop_assert_eq!(g.total_capacity_bytes, total);
    Ok(())
}

/// Sequences of well-formed but hostile requests: the master state never
/// panics, never counts more bytes used than mounted, and never lets the
/// capacity sum wrap.
#[test]
fn fuzz_rpc_dispatch_sequences() {
    let key = AuthKey::new("k").expect("key");
    fuzz::run(
        "rpc_dispatch",
        proptest::collection::vec(request(), 1..24),
        |reqs| {
            let st = state(Some(key.clone()));
            for r in reqs {
                let resp = dispatch(&st, r);
                if let MasterResponse::PutStart(items) = resp {
                    for it in items {
                        if let mooncake_common::proto::PutStartItem::Write { replicas, .. } = it {
                            prop_assert!(replicas.iter().all(|l| l.ticket.is_some()));
                        }
                    }
                }
                check_invariants(&st)?;
            }
            Ok(())
        },
    );
}

/// Raw and mutated request frames: whatever decodes is executed.
#[test]
fn fuzz_rpc_frames() {
    let seeds: Vec<Vec<u8>> = [
        MasterRequest::MountSegment {
            client_id: "c".into(),
            segment: segment_at(0),
        },
        MasterRequest::PutStart {
            keys: vec!["a".into()],
            sizes: vec![100],
            config: WriteConfig::default(),
            upsert: false,
            exclude: Vec::new(),
        },
        MasterRequest::GetReplicaList {
            keys: vec!["a".into()],
            track: true,
        },
    ]
    .iter()
    .map(|r| encode_request(r, &[1]).expect("encode")[4..].to_vec())
    .collect();
    let st = state(None);
    fuzz::run("rpc_frames", fuzz::inputs(seeds, 512), |b| {
        if let Ok(f) = framing::decode::<RequestFrame>(&b) {
            st.reads_done(&f.done);
            let _ = dispatch(&st, f.req);
            check_invariants(&st)?;
        }
        Ok(())
    });
}

fn http_request() -> impl Strategy<Value = (String, String, Option<String>, Vec<u8>)> {
    let method = prop_oneof![
        Just("GET".to_string()),
        Just("PUT".to_string()),
        Just("DELETE".to_string()),
        Just("POST".to_string()),
        "[A-Z]{1,8}",
    ];
    let uri = prop_oneof![
        "/metadata\\?key=[a-z/%0-9]{0,12}",
        "/(metadata|health|auth/challenge|query_key|metrics|get_all_keys|get_all_segments)(\\?[a-z=&%]{0,16})?",
        "/[ -~]{0,40}",
    ];
    let auth = proptest::option::of(prop_oneof!["[0-9a-f]{64}:[0-9a-f]{64}", "[ -~]{0,140}",]);
    (method, uri, auth, fuzz::bytes(256))
}

fn send(
    rt: &tokio::runtime::Runtime,
    app: &Router,
    method: &str,
    uri: &str,
    auth: &Option<String>,
    body: &[u8],
) -> Option<u16> {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(a) = auth {
        req = req.header(HTTP_AUTH_HEADER, a.as_str());
    }
    let req = req.body(Body::from(body.to_vec())).ok()?;
    let resp = rt.block_on(app.clone().oneshot(req)).ok()?;
    Some(resp.status().as_u16())
}

/// Arbitrary requests to the metadata server: it always answers, and with
/// a token no unsigned or forged write succeeds.
#[test]
fn fuzz_metadata_http() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let kv = Arc::new(MetadataKv::new());
    let keyed = metadata_router(kv.clone(), Some(AuthKey::new("k").expect("key")));
    let open = metadata_router(Arc::new(MetadataKv::new()), None);
    fuzz::run("metadata_http", http_request(), |(m, uri, auth, body)| {
        if let Some(status) = send(&rt, &keyed, &m, &uri, &auth, &body) {
            if m == "PUT" || m == "DELETE" {
                prop_assert!(
                    status != 200,
                    "{m} {uri} succeeded without a valid signature"
                );
            }
        }
        let _ = send(&rt, &open, &m, &uri, &auth, &body);
        prop_assert_eq!(kv.len(), 0);
        Ok(())
    });
}

/// Arbitrary requests to the admin server over a master with objects.
#[test]
fn fuzz_admin_http() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let st = state(None);
    st.mount_segment("c", segment_at(u64::MAX - 10))
        .expect("mount");
    let keys = vec!["a".to_string(), "b/c".to_string()];
    st.put_start(&keys, &[100, 1000], &WriteConfig::default(), false);
    // No owner process keeps this segment's ledger, so the commit is not
    // confirmed and the objects are revoked (RPC_TIMEOUT): the admin routes
    // are fuzzed over a mounted segment and keys that were just dropped.
    let _ = st.put_end(&keys, &[]);
    let view: Arc<dyn AdminView> = st.clone();
    let app = admin_router(view, Arc::new(MasterMetrics::default()));
    fuzz::run("admin_http", http_request(), |(m, uri, auth, body)| {
        let _ = send(&rt, &app, &m, &uri, &auth, &body);
        Ok(())
    });
}
