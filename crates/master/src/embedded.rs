//! An RPC-only master running inside the calling process, for embedding and
//! for Rust integration tests that need a real master without a subprocess.

use crate::config::MasterConfig;
use crate::metrics::MasterMetrics;
use crate::state::MasterState;
use std::io;
use std::sync::Arc;

/// Start a master RPC server with `cfg` on a free `127.0.0.1` port, on its
/// own thread and tokio runtime (with its background sweeps), and return its
/// `host:port`. It serves until the process exits.
pub fn spawn_loopback(cfg: MasterConfig) -> io::Result<String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?.to_string();
    listener.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("embedded-master".into())
        .spawn(move || {
            rt.block_on(async move {
                let l = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(error = %e, "embedded master cannot listen");
                        return;
                    }
                };
                let st = MasterState::new(cfg, Arc::new(MasterMetrics::default()), None);
                st.start_background();
                crate::rpc::serve(l, crate::gate::Gate::single(st)).await;
            })
        })?;
    Ok(addr)
}
