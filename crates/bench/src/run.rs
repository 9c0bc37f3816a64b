//! The two sides of the benchmark over [`mooncake_transfer::engine::TransferEngine`].

use crate::config::{unit_bytes, BenchConfig};
use memmap2::MmapMut;
use mooncake_common::binary::StopSignals;
use mooncake_transfer::engine::{
    build_conn_string, split_conn_string, EngineError, Item, TransferEngine,
};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The buffers of one process: one anonymous mapping of `--buffer_size`
/// bytes per NUMA node, registered with the engine as `cpu:N`.
struct Buffers {
    maps: Vec<MmapMut>,
}

impl Buffers {
    fn register(engine: &TransferEngine, size: u64) -> Result<Buffers, String> {
        let len =
            usize::try_from(size).map_err(|_| format!("--buffer_size {size} is too large"))?;
        let nodes = mooncake_transfer::engine::topology::numa_nodes();
        let mut maps = Vec::with_capacity(nodes.len());
        for n in nodes {
            let mut map = MmapMut::map_anon(len)
                .map_err(|e| format!("cannot allocate a buffer of {size} bytes: {e}"))?;
            let addr = map.as_mut_ptr() as u64;
            // SAFETY: the mapping is owned by `Buffers`, which unregisters
            // it (drop) before unmapping; it stays mapped and writable.
            unsafe { engine.register_memory(addr, size, &format!("cpu:{n}")) }
                .map_err(|e| format!("cannot register a buffer: {e}"))?;
            maps.push(map);
        }
        Ok(Buffers { maps })
    }

    fn addrs(&self) -> Vec<u64> {
        self.maps.iter().map(|m| m.as_ptr() as u64).collect()
    }

    fn unregister(self, engine: &TransferEngine) {
        for a in self.addrs() {
            let _ = engine.unregister_memory(a);
        }
    }
}

/// Start an engine named `--local_server_name` on `--metadata_server`.
fn start_engine(cfg: &BenchConfig) -> Result<Arc<TransferEngine>, String> {
    let engine = Arc::new(TransferEngine::new());
    let (ty, server) = split_conn_string(&cfg.metadata_server);
    let conn = build_conn_string(&ty, &server);
    engine
        .initialize(
            &cfg.local_server_name,
            &conn,
            &cfg.protocol,
            &cfg.device_name,
        )
        .map_err(|e| {
            format!(
                "cannot start the transfer engine as {} on {}: {e}",
                cfg.local_server_name, cfg.metadata_server
            )
        })?;
    Ok(engine)
}

/// Wait for SIGINT or SIGTERM, at most `limit` (for ever when `None`), and
/// no longer than `running` stays true.
fn wait_for_signal(limit: Option<Duration>, running: &AtomicBool) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    rt.block_on(async {
        let mut stop =
            StopSignals::install().map_err(|e| format!("cannot install signal handlers: {e}"))?;
        let limit = async {
            match limit {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let stopped = async {
            while running.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::select! {
            _ = stop.recv() => {}
            _ = limit => {}
            _ = stopped => {}
        }
        Ok(())
    })
}

/// `--mode=target`: register the buffers, say the segment name, serve until
/// SIGINT or SIGTERM.
pub fn run_target(cfg: &BenchConfig) -> Result<(), String> {
    let engine = start_engine(cfg)?;
    let buffers = Buffers::register(&engine, cfg.buffer_size)?;
    let name = engine.name().map_err(|e| e.to_string())?;
    eprintln!(
        "transfer_engine_bench target: segment {name}, {} buffer(s) of {} bytes; serving until SIGINT or SIGTERM",
        buffers.maps.len(),
        cfg.buffer_size
    );
    let waited = wait_for_signal(None, &AtomicBool::new(true));
    buffers.unregister(&engine);
    engine.shutdown();
    waited
}

/// What an initiator measured.
#[derive(Debug, Clone, Copy)]
pub struct Report {
    /// Seconds from the first submission to the last completion.
    pub duration: f64,
    /// Batches completed by all threads.
    pub batches: u64,
}

impl Report {
    /// Upstream's closing line.
    pub fn line(&self, cfg: &BenchConfig) -> String {
        let bytes = self.batches as f64 * cfg.batch_size as f64 * cfg.block_size as f64;
        let unit = unit_bytes(&cfg.report_unit).unwrap_or(1e9);
        let rate = if self.duration > 0.0 {
            bytes / self.duration / unit
        } else {
            0.0
        };
        format!(
            "Test completed: duration {:.2}, batch count {}, throughput {:.*} {}/s",
            self.duration, self.batches, cfg.report_precision, rate, cfg.report_unit
        )
    }
}

/// `--mode=initiator`: move blocks to or from `--segment_id` for
/// `--duration` seconds (or until SIGINT/SIGTERM).
pub fn run_initiator(cfg: &BenchConfig) -> Result<Report, String> {
    let engine = start_engine(cfg)?;
    let buffers = Buffers::register(&engine, cfg.buffer_size)?;
    let outcome = measure(cfg, &engine, &buffers.addrs());
    buffers.unregister(&engine);
    engine.shutdown();
    outcome
}

fn measure(
    cfg: &BenchConfig,
    engine: &Arc<TransferEngine>,
    local: &[u64],
) -> Result<Report, String> {
    let segment = cfg.segment_id.as_str();
    let remote = engine.segment_buffers(segment).map_err(|e| {
        format!("Unable to get target segment {segment:?}, please recheck (--segment_id, --metadata_server): {e}")
    })?;
    // Thread t uses local buffer t % n and the target's buffer t % m, at
    // offsets block_size * (i * threads + t): every round spans `need` bytes.
    let need = cfg.block_size * cfg.batch_size * cfg.threads;
    if remote.is_empty() {
        return Err(format!("segment {segment} has no registered memory"));
    }
    if let Some((i, (_, len))) = remote.iter().enumerate().find(|(_, (_, len))| *len < need) {
        return Err(format!(
            "segment {segment}'s buffer {i} has {len} bytes; this run needs {need} \
             (--block_size x --batch_size x --threads)"
        ));
    }
    let running = AtomicBool::new(true);
    let batches = AtomicU64::new(0);
    let failure: Mutex<Option<EngineError>> = Mutex::new(None);
    let start = Instant::now();
    std::thread::scope(|s| -> Result<(), String> {
        for t in 0..cfg.threads {
            let (running, batches, failure) = (&running, &batches, &failure);
            let local_base = local[(t as usize) % local.len()];
            let remote_base = remote[(t as usize) % remote.len()].0;
            s.spawn(move || {
                let mut done = 0u64;
                let items: Vec<Item> = (0..cfg.batch_size)
                    .map(|i| {
                        let off = cfg.block_size * (i * cfg.threads + t);
                        (local_base + off, remote_base + off, cfg.block_size)
                    })
                    .collect();
                while running.load(Ordering::Relaxed) {
                    if let Err(e) = engine.transfer(segment, cfg.operation, &items, None) {
                        failure.lock().get_or_insert(e);
                        running.store(false, Ordering::Relaxed);
                        break;
                    }
                    done += 1;
                }
                batches.fetch_add(done, Ordering::Relaxed);
            });
        }
        let waited = wait_for_signal(Some(Duration::from_secs(cfg.duration_secs)), &running);
        running.store(false, Ordering::Relaxed);
        waited
    })?;
    let duration = start.elapsed().as_secs_f64();
    if let Some(e) = failure.lock().take() {
        return Err(format!("transfer to segment {segment} failed: {e}"));
    }
    Ok(Report {
        duration,
        batches: batches.load(Ordering::Relaxed),
    })
}
