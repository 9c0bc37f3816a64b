//! Replica placement: choose distinct segments with enough free space,
//! preferred segments first, then by the configured strategy. Segments the
//! writer just failed to reach (`exclude`) are never chosen; segments whose
//! owner missed a heartbeat (suspect) only when nothing else fits (issue
//! 10: puts avoid segments whose owner stopped heartbeating).

use crate::config::AllocationStrategy;
use crate::state::{Inner, Replica, Replicas};
use mooncake_common::proto::WriteConfig;
use rand::seq::SliceRandom;
use std::time::Instant;

/// Allocate up to `cfg.replica_num` replicas of `size` bytes on distinct
/// segments, none of them in `exclude`.
pub(crate) fn allocate(
    inner: &mut Inner,
    size: u64,
    cfg: &WriteConfig,
    strategy: AllocationStrategy,
    exclude: &[String],
    now: Instant,
) -> Replicas {
    let want = cfg.replica_num as usize;
    let mut chosen: Vec<String> = Vec::new();
    let fits = |inner: &Inner, name: &str| {
        !exclude.iter().any(|e| e == name)
            && inner
                .segments
                .get(name)
                .is_some_and(|s| s.alloc.largest_free() >= size)
    };
    // Preferred segments are the caller's explicit choice: tried even when
    // suspect (a failed write there is retried elsewhere by the writer).
    for p in &cfg.preferred_segments {
        if chosen.len() >= want {
            break;
        }
        if !chosen.contains(p) && fits(inner, p) {
            chosen.push(p.clone());
        }
    }
    if chosen.len() < want {
        let (mut rest, mut suspect): (Vec<String>, Vec<String>) = inner
            .segments
            .keys()
            .filter(|n| !chosen.contains(n) && fits(inner, n))
            .cloned()
            .partition(|n| !inner.is_suspect(n, now));
        rest.shuffle(&mut rand::thread_rng());
        match strategy {
            AllocationStrategy::Random => {}
            AllocationStrategy::FreeRatioFirst => {
                rest.sort_by(|a, b| {
                    let ra = free_ratio(inner, a);
                    let rb = free_ratio(inner, b);
                    rb.partial_cmp(&ra).unwrap_or(std::cmp::Ordering::Equal)
                });
            }
            AllocationStrategy::LocalFirst => {
                let host = &cfg.writer_host_id;
                rest.sort_by_key(|n| {
                    inner
                        .segments
                        .get(n)
                        .map(|s| &s.desc.host_id != host)
                        .unwrap_or(true)
                });
            }
        }
        if let Some(ws) = &cfg.writer_segment {
            if let Some(pos) = rest.iter().position(|n| n == ws) {
                let w = rest.remove(pos);
                rest.insert(0, w);
            }
        }
        suspect.shuffle(&mut rand::thread_rng());
        for n in rest.into_iter().chain(suspect) {
            if chosen.len() >= want {
                break;
            }
            chosen.push(n);
        }
    }
    let mut out = Replicas::new();
    for name in chosen {
        let Some(id) = inner.segments.id_of(&name) else {
            continue;
        };
        if let Some(off) = inner
            .segments
            .by_id_mut(id)
            .and_then(|s| s.alloc.alloc(size))
        {
            out.push(Replica {
                seg: id,
                offset: off,
            });
        }
    }
    out
}

fn free_ratio(inner: &Inner, name: &str) -> f64 {
    inner
        .segments
        .get(name)
        .map(|s| {
            let cap = s.alloc.capacity().max(1) as f64;
            (cap - s.alloc.used() as f64) / cap
        })
        .unwrap_or(0.0)
}
