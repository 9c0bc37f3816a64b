//! Segments added after setup: `mount_segment` (a file or shared-memory
//! path, mapped from its start) and `allocate_and_mount_segment` (memory
//! allocated here). Each is a segment of its own at the master, named by
//! the `host:port` of a data server of its own and owned by this client:
//! objects are placed in it like in the setup segment, other processes read
//! and write it through its data server, same-host readers map it, and its
//! ledger is reported when the master asks for a remount.
//! `unmount_segment` / `unmount_and_free_segment` take it out again (its
//! objects go with it, as with any unmounted segment); `close` takes out
//! every one left. An added segment does not take copy or move tasks (those
//! fail with their reason) and has no disk tier.

use super::{bind_data_port, Client};
use crate::durability::ledger::Ledger;
use crate::error::{Error, Result};
use crate::master::master_conn::MasterConn;
use mooncake_common::ledger::REPORT_CHUNK;
use mooncake_common::proto::{MasterRequest, MasterResponse, SegmentDesc};
use mooncake_transfer::data_path::data_server::DataServer;
use mooncake_transfer::same_host::mapping::{socket_name, MappingServer};
use mooncake_transfer::segment::{register_local, unregister_local, Segment};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Page size added segments are rounded up to.
const PAGE: u64 = 4096;

/// What a new segment is made of.
#[derive(Debug, Clone)]
pub enum MountSource {
    /// `allocate_and_mount_segment(size)`: memory allocated here.
    Allocate {
        /// Bytes asked for (rounded up to whole pages).
        size: u64,
    },
    /// `mount_segment(path, size, offset)`: `size` bytes of the file at
    /// `path`, which must hold at least that many, from `offset` (0: this
    /// build maps files from their start).
    File {
        /// The file (a regular file or one under `/dev/shm`).
        path: String,
        /// Bytes to mount.
        size: u64,
        /// Where in the file the segment starts.
        offset: u64,
    },
}

/// A segment added to a set-up client.
pub(crate) struct Extra {
    desc: SegmentDesc,
    segment: Arc<Segment>,
    ledger: Arc<Ledger>,
    /// Made by `allocate_and_mount_segment` (freed by
    /// `unmount_and_free_segment`), else mapped from a file.
    allocated: bool,
    data_server: Option<DataServer>,
    mapping_server: Option<MappingServer>,
    /// Ends its ledger stream.
    closed: Arc<AtomicBool>,
}

impl Extra {
    /// Stop serving it and forget it locally (the master is told by the
    /// caller).
    fn stop(mut self, client: &Client) {
        self.closed.store(true, Ordering::Release);
        unregister_local(self.segment.uuid());
        crate::durability::ledger::unregister(&self.desc.name);
        if let Some(ds) = self.data_server.take() {
            ds.stop();
        }
        if let Some(ms) = self.mapping_server.take() {
            ms.stop();
        }
        client.unpublish(&self.desc);
    }
}

impl Client {
    /// Add a segment (see the module): its id (segment name) and size.
    pub fn mount_extra(&self, src: &MountSource) -> Result<(String, u64)> {
        if self.is_closed() {
            return Err(Error::not_set_up());
        }
        let (segment, allocated) = match src {
            MountSource::Allocate { size } => {
                if *size == 0 {
                    return Err(Error::invalid(
                        "allocate_and_mount_segment: size must be > 0",
                    ));
                }
                let size = size.div_ceil(PAGE).saturating_mul(PAGE);
                let seg = Segment::create(size).map_err(|e| {
                    Error::internal(format!("cannot allocate a segment of {size} bytes: {e}"))
                })?;
                (seg, true)
            }
            MountSource::File { path, size, offset } => {
                if *size == 0 {
                    return Err(Error::invalid("mount_segment: size must be > 0"));
                }
                if *offset != 0 {
                    return Err(Error::invalid(format!(
                        "mount_segment: offset {offset} is not supported (this build maps {path:?} from its start: pass offset=0)"
                    )));
                }
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
                    .map_err(|e| {
                        Error::invalid(format!("mount_segment: cannot open {path:?}: {e}"))
                    })?;
                let seg = Segment::from_fd(uuid::Uuid::new_v4().to_string(), file, *size).map_err(
                    |e| Error::invalid(format!("mount_segment: cannot map {path:?}: {e}")),
                )?;
                (seg, false)
            }
        };
        let host = self
            .desc
            .endpoint
            .rsplit_once(':')
            .map_or(self.desc.endpoint.as_str(), |(h, _)| h)
            .to_string();
        let listener = bind_data_port(&host, None)?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::internal(format!("data port: {e}")))?
            .port();
        let endpoint = format!("{host}:{port}");
        let desc = SegmentDesc {
            name: endpoint.clone(),
            uuid: segment.uuid().to_string(),
            size: segment.size(),
            base_addr: segment.base() as u64,
            host_id: self.desc.host_id.clone(),
            pid: std::process::id(),
            endpoint,
            socket_name: socket_name(segment.uuid()),
        };
        let data_server =
            DataServer::start(listener, Some(Arc::clone(&segment)), self.auth.clone())
                .map_err(|e| Error::internal(format!("cannot start the data server: {e}")))?;
        let mapping_server = MappingServer::start(Arc::clone(&segment), self.auth.clone())
            .map_err(|e| tracing::info!(error = %e, "same-host mapping server unavailable"))
            .ok();
        let mut extra = Extra {
            desc: desc.clone(),
            segment,
            ledger: Arc::new(Ledger::default()),
            allocated,
            data_server: Some(data_server),
            mapping_server,
            closed: Arc::new(AtomicBool::new(false)),
        };
        let r = self.master.call(&MasterRequest::MountSegment {
            client_id: self.client_id.clone(),
            segment: desc.clone(),
        });
        match r {
            Ok(MasterResponse::Ok) => {}
            other => {
                if let Some(ds) = extra.data_server.take() {
                    ds.stop();
                }
                if let Some(ms) = extra.mapping_server.take() {
                    ms.stop();
                }
                return Err(match other {
                    Ok(MasterResponse::Err(e)) | Err(e) => Error::from(e).context("mount segment"),
                    Ok(_) => Error::internal("mount segment: unexpected master response"),
                });
            }
        }
        register_local(&extra.segment);
        crate::durability::ledger::register(&desc.name, &extra.ledger);
        self.publish(&desc);
        let ctx = crate::durability::ledger_stream::StreamCtx {
            master: Arc::clone(&self.master),
            ledger: Arc::clone(&extra.ledger),
            client_id: self.client_id.clone(),
            segment: desc.name.clone(),
            closed: Arc::clone(&extra.closed),
            wake: Arc::clone(&self.wake),
            disk: None,
            fetch: None,
        };
        if let Err(e) = crate::durability::ledger_stream::start(ctx) {
            tracing::warn!(error = %e, segment = %desc.name, "cannot start the ledger stream");
        }
        let size = desc.size;
        self.extras.lock().push(extra);
        tracing::info!(segment = %desc.name, size, "segment mounted");
        Ok((desc.name, size))
    }

    /// `unmount_segment` (`free` false: segments of `mount_segment`) and
    /// `unmount_and_free_segment` (`free` true: segments of
    /// `allocate_and_mount_segment`). Every id must name a segment of that
    /// kind this client added (else INTERNAL_ERROR, -1, upstream's code for
    /// an id the client did not mount; nothing is unmounted then);
    /// after `grace` the master forgets them (their objects go) and this
    /// client stops serving them. An empty list succeeds.
    pub fn unmount_segments(
        &self,
        ids: &[String],
        free: bool,
        grace: std::time::Duration,
    ) -> Result<()> {
        {
            let extras = self.extras.lock();
            for id in ids {
                match extras.iter().find(|e| e.desc.name == *id) {
                    Some(e) if e.allocated == free => {}
                    Some(_) => {
                        return Err(Error::internal(format!(
                            "segment {id:?} was {}: use {}",
                            if free { "mounted from a file" } else { "allocated by allocate_and_mount_segment" },
                            if free { "unmount_segment" } else { "unmount_and_free_segment" },
                        )))
                    }
                    None => {
                        return Err(Error::internal(format!(
                            "segment id {id:?} was not mounted by this client (mount_segment / allocate_and_mount_segment)"
                        )))
                    }
                }
            }
        }
        if ids.is_empty() {
            return Ok(());
        }
        std::thread::sleep(grace);
        let mut first_err = None;
        for id in ids {
            let taken = {
                let mut extras = self.extras.lock();
                extras
                    .iter()
                    .position(|e| e.desc.name == *id)
                    .map(|i| extras.remove(i))
            };
            let Some(extra) = taken else { continue };
            let r = self.master.call(&MasterRequest::UnmountSegment {
                client_id: self.client_id.clone(),
                segment_name: id.clone(),
            });
            match r {
                Ok(MasterResponse::Ok) => {}
                Ok(MasterResponse::Err(e)) | Err(e) => {
                    first_err
                        .get_or_insert(Error::from(e).context(format!("unmount segment {id}")));
                }
                Ok(other) => {
                    first_err.get_or_insert(Error::internal(format!(
                        "unmount segment {id}: unexpected master response {other:?}"
                    )));
                }
            }
            extra.stop(self);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Ids of the segments added to this client.
    pub fn extra_segments(&self) -> Vec<String> {
        self.extras
            .lock()
            .iter()
            .map(|e| e.desc.name.clone())
            .collect()
    }

    /// Remount every added segment on the heartbeat's connection, each
    /// reporting its ledger (the master restarted or a new leader took
    /// over).
    pub(super) fn remount_extras(&self, conn: &mut TcpStream) {
        let mut list: Vec<(SegmentDesc, Arc<Ledger>)> = Vec::new();
        for e in self.extras.lock().iter() {
            // Fenced before it remounts, as the client's own segment (see
            // `Client::remount`).
            if let Some(ds) = &e.data_server {
                ds.fence_writes();
            }
            list.push((e.desc.clone(), Arc::clone(&e.ledger)));
        }
        for (desc, ledger) in list {
            self.remount_with_ledger(conn, &desc, &ledger);
            self.publish(&desc);
        }
    }

    /// Report `ledger` for segment `desc` in chunks (a remount). `None`
    /// when the master did not take it; else whether the master had
    /// expired the segment (it dropped its objects, and the ledger was
    /// cleared).
    pub(super) fn remount_with_ledger(
        &self,
        conn: &mut TcpStream,
        desc: &SegmentDesc,
        ledger: &Ledger,
    ) -> Option<bool> {
        let entries = ledger.snapshot();
        let chunks: Vec<_> = entries.chunks(REPORT_CHUNK).collect();
        let last = chunks.len().saturating_sub(1);
        for i in 0..chunks.len().max(1) {
            let r = MasterConn::call_on(
                conn,
                &MasterRequest::RemountSegment {
                    client_id: self.client_id.clone(),
                    segment: desc.clone(),
                    entries: chunks.get(i).map(|c| c.to_vec()).unwrap_or_default(),
                    done: i == last,
                },
            );
            match r {
                Ok(MasterResponse::Ok) if i < last => {}
                Ok(MasterResponse::Remounted { stale, discard_all }) if i == last => {
                    if discard_all {
                        tracing::warn!(segment = %desc.name, "the master had expired this segment; its objects are gone");
                        ledger.clear();
                    } else {
                        ledger.drop_listed(&stale);
                    }
                    return Some(discard_all);
                }
                other => {
                    tracing::warn!(result = ?other, segment = %desc.name, "remount failed");
                    return None;
                }
            }
        }
        None
    }

    /// Stop serving every added segment (at `close`; the master drops
    /// them with the client).
    pub(super) fn close_extras(&self) {
        let all: Vec<Extra> = std::mem::take(&mut *self.extras.lock());
        for e in all {
            e.stop(self);
        }
    }
}
