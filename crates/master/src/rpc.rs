//! The master's RPC server: length-prefixed bincode frames over TCP, one
//! request/response at a time per connection, a version handshake first.

use crate::state::MasterState;
use mooncake_common::framing::{self, Hello, Service, MAX_CONTROL_FRAME};
use mooncake_common::proto::{MasterRequest, MasterResponse};
use std::io;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Accept connections forever, one task per connection.
pub async fn serve(listener: TcpListener, state: Arc<MasterState>) {
    loop {
        match listener.accept().await {
            Ok((sock, peer)) => {
                let st = Arc::clone(&state);
                tokio::spawn(async move {
                    if let Err(e) = handle_conn(sock, st).await {
                        if e.kind() != io::ErrorKind::UnexpectedEof {
                            tracing::warn!(%peer, error = %e, "rpc connection closed");
                        }
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

async fn read_frame(sock: &mut TcpStream, max: usize) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    sock.read_exact(&mut len).await?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds limit"),
        ));
    }
    let mut body = vec![0u8; len];
    sock.read_exact(&mut body).await?;
    Ok(body)
}

async fn write_frame(sock: &mut TcpStream, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "response too large"))?;
    let mut buf = Vec::with_capacity(body.len() + 4);
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(body);
    sock.write_all(&buf).await
}

async fn handle_conn(mut sock: TcpStream, state: Arc<MasterState>) -> io::Result<()> {
    let _ = sock.set_nodelay(state.config().rpc_enable_tcp_no_delay);
    let idle = state.config().rpc_conn_timeout_seconds;
    let hello_body = read_frame(&mut sock, 1024).await?;
    let hello: Hello = framing::decode(&hello_body)?;
    let ours = framing::encode(&Hello::new(Service::Master))?;
    if let Err(e) = hello.check(Service::Master) {
        tracing::warn!(error = %e, "refusing rpc connection");
        let _ = write_frame(&mut sock, &ours).await;
        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
    }
    write_frame(&mut sock, &ours).await?;
    loop {
        let body = if idle > 0 {
            match tokio::time::timeout(
                std::time::Duration::from_secs(idle as u64),
                read_frame(&mut sock, MAX_CONTROL_FRAME),
            )
            .await
            {
                Ok(r) => r?,
                Err(_) => return Ok(()),
            }
        } else {
            read_frame(&mut sock, MAX_CONTROL_FRAME).await?
        };
        let req: MasterRequest = framing::decode(&body)?;
        let resp = dispatch(&state, req);
        write_frame(&mut sock, &framing::encode(&resp)?).await?;
    }
}

/// Execute one request against the state.
pub fn dispatch(state: &MasterState, req: MasterRequest) -> MasterResponse {
    match req {
        MasterRequest::Ping { client_id } => MasterResponse::Pong {
            need_remount: state.ping(&client_id),
        },
        MasterRequest::MountSegment { client_id, segment } => {
            match state.mount_segment(&client_id, segment) {
                Ok(()) => MasterResponse::Ok,
                Err(e) => MasterResponse::Err(e),
            }
        }
        MasterRequest::UnmountSegment {
            client_id,
            segment_name,
        } => match state.unmount_segment(&client_id, &segment_name) {
            Ok(()) => MasterResponse::Ok,
            Err(e) => MasterResponse::Err(e),
        },
        MasterRequest::Disconnect { client_id } => {
            state.disconnect(&client_id);
            MasterResponse::Ok
        }
        MasterRequest::PutStart {
            keys,
            sizes,
            config,
            upsert,
        } => MasterResponse::PutStart(state.put_start(&keys, &sizes, &config, upsert)),
        MasterRequest::PutEnd { keys } => {
            state.put_end(&keys);
            MasterResponse::Ok
        }
        MasterRequest::PutRevoke { keys } => {
            state.put_revoke(&keys);
            MasterResponse::Ok
        }
        MasterRequest::GetReplicaList { keys } => {
            MasterResponse::Objects(state.get_replica_list(&keys))
        }
        MasterRequest::Exist { keys } => MasterResponse::Codes(state.exist(&keys)),
        MasterRequest::Remove { keys, force } => MasterResponse::Codes(state.remove(&keys, force)),
        MasterRequest::RemoveByRegex { pattern, force } => {
            MasterResponse::Count(state.remove_by_regex(&pattern, force))
        }
        MasterRequest::RemoveAll { force } => MasterResponse::Count(state.remove_all(force)),
    }
}
