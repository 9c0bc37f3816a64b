//! STUB — replaced by the lead.
//!
//! Stand-in RPC server: accepts TCP connections and closes them.

use std::sync::Arc;

use crate::state::MasterState;

/// Serve client RPCs on an already-bound listener (stub: accept and drop).
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<MasterState>) {
    let _state = state;
    loop {
        match listener.accept().await {
            Ok((conn, _)) => drop(conn),
            Err(e) => {
                tracing::warn!("RPC accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}
