//! `Client::setup` applies `setup`'s argument rules itself, so the binding
//! and a Rust caller get the same answer: the protocol must be one of
//! upstream's store protocols, exactly as upstream spells it (device
//! protocols run over TCP), and `MC_FORCE_TCP` counts when its trimmed value is `1`, as the Python
//! `setup` always treated it. One test in its own binary: it sets
//! `MC_FORCE_TCP` for the whole process.

use mooncake_client::{Client, ClientConfig, ErrorCode};
use mooncake_master::config::MasterConfig;

fn config(master: &str, protocol: &str) -> ClientConfig {
    ClientConfig {
        local_buffer_size: 1 << 20,
        protocol: protocol.into(),
        ..ClientConfig::loopback(master, 0)
    }
}

fn setup_code(master: &str, protocol: &str) -> i32 {
    match Client::setup(config(master, protocol)) {
        Ok(c) => {
            c.close();
            0
        }
        Err(e) => e.code().code(),
    }
}

#[test]
fn protocol_and_force_tcp_rules() {
    let m = mooncake_master::embedded::spawn_loopback(MasterConfig::default()).expect("master");
    std::env::remove_var("MC_FORCE_TCP");
    assert_eq!(setup_code(&m, "tcp"), 0);
    // Upstream's device protocols run over TCP; only its exact names are
    // known: "TCP" is refused.
    assert_eq!(setup_code(&m, "rdma"), 0);
    assert_eq!(setup_code(&m, "efa"), 0);
    assert_eq!(setup_code(&m, "TCP"), ErrorCode::InternalError.code());
    // MC_FORCE_TCP=1 makes any protocol tcp; surrounding whitespace is ignored.
    std::env::set_var("MC_FORCE_TCP", " 1\n");
    assert_eq!(setup_code(&m, "rdma"), 0);
    assert_eq!(setup_code(&m, "TCP"), 0);
    std::env::set_var("MC_FORCE_TCP", "0");
    assert_eq!(setup_code(&m, "TCP"), ErrorCode::InternalError.code());
    std::env::remove_var("MC_FORCE_TCP");
    // The other checks before the master is contacted, with their codes.
    let rejected = |f: &dyn Fn(&mut ClientConfig)| {
        let mut c = config(&m, "tcp");
        f(&mut c);
        Client::setup(c).map(|_| ()).map_err(|e| e.code())
    };
    assert_eq!(
        rejected(&|c| c.tenant_id = "_t".into()),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(
        rejected(&|c| c.local_buffer_size = 10),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(
        rejected(&|c| c.metadata_server = "etcd://x".into()),
        Err(ErrorCode::InternalError)
    );
}
