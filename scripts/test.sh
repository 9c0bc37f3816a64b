#!/usr/bin/env bash
# Run the whole test suite: Rust unit/integration tests, then the pytest
# suites against real mooncake_master processes on loopback ports, all on
# the newest supported Python (.venv), then the store, tensor and PG suites
# again on the oldest one (3.10, .venv-py310, an older torch, the release
# wheel). Installs what the suites need where it can (as root with apt-get:
# etcd-server and iptables for the multi-host and HA tests); a suite that
# must be skipped all the same is named, with the reason, on the last line.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/env.sh
# Each fuzz target of the decoders of untrusted bytes runs this many seconds
# (about 3.5 min for all 13 on 2 cores).
export MC_FUZZ_SECS="${MC_FUZZ_SECS:-30}"

# System tools of the multi-host suite (network namespaces, iptables
# faults, a real etcd) and of the HA tests; protoc and ss come with env.sh.
need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
if [ "${#need[@]}" -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
  (apt-get update -qq >/dev/null || true)
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null \
    || echo "test.sh: apt-get install ${need[*]} failed" >&2
fi
# Suites that will skip here, and why (printed last, loudly).
skipped=()
netns_reason="$(python - <<'PY'
import sys
sys.path.insert(0, "tests/cluster")
from netns import unavailable_reason
print(unavailable_reason() or "")
PY
)"
[ -n "$netns_reason" ] && skipped+=("tests/cluster (multi-host): $netns_reason")
command -v etcd >/dev/null 2>&1 \
  || skipped+=("etcd tests (tests/cluster HA, tests/store/test_ha_loopback.py, tests/engine etcd): no etcd binary (apt-get install etcd-server, as root)")
[ "${MOONCAKE_SKIP_TORCH:-0}" = "1" ] \
  && skipped+=("tests/tensor and tests/pg: MOONCAKE_SKIP_TORCH=1")
gpu_reason="$(python -c 'import sys; sys.path.insert(0, "tests/gpu"); from cuda_env import SKIP_REASON; print(SKIP_REASON or "")')"
[ -n "$gpu_reason" ] && skipped+=("tests/gpu CUDA modules: $gpu_reason (scripts/gpu_check.sh runs them on a GPU machine)")

cargo test -p mooncake-common -p mooncake-transfer -p mooncake-master -p mooncake-client -p mooncake-engram -p mooncake-pg -p mooncake-tensor -p mooncake-standalone -p mooncake-bench -p mooncake-lincheck 2>&1
# Each suite has its own conftest helpers, so each runs in its own pytest process.
python -m pytest tests/store tests/store_binding -q -p no:cacheprovider --timeout=300 "$@"
# SSD offload: real masters and owners writing three times their memory,
# reads back from disk (own and remote), a full tmpfs (root), corrupted
# buckets, restarted owners, a shared directory. About a minute.
python -m pytest tests/offload -q -p no:cacheprovider --timeout=300 "$@"
# The standalone service: real mooncake_client daemons on real masters,
# dummy clients (setup_dummy) in this process and in child processes,
# daemon and dummy faults, SGLang's and vLLM's standalone call sequences,
# mooncake.ep. About half a minute.
python -m pytest tests/standalone -q -p no:cacheprovider --timeout=300 "$@"
# Multi-host suite: hosts as network namespaces, a real etcd, HA masters and
# fault injection; needs root, iproute2, iptables and etcd, skips with the
# reason otherwise. About 1 min.
cargo build --release -q -p mooncake-netfault
python -m pytest tests/cluster -q -p no:cacheprovider --timeout=300 "$@"
python -m pytest tests/engram -q -p no:cacheprovider --timeout=300 "$@"
# Robustness: client processes (some of them dummies of a mooncake_client
# daemon) on contended keys while one fault hits: a data holder, a client,
# the HA leader or the daemon SIGKILLed and replaced, a holder or the
# master paused; the recorded history is checked for linearizability by
# mooncake-lincheck. About 20 s per fault.
cargo build --release -q -p mooncake-lincheck
python -m pytest tests/robustness -q -p no:cacheprovider --timeout=600 "$@"
# The transfer engine (mooncake.engine): target and initiator processes, over
# P2PHANDSHAKE, the HTTP metadata server and etcd (skips without the etcd
# binary), on one host and with TCP forced. About half a minute.
python -m pytest tests/engine -q -p no:cacheprovider --timeout=300 "$@"
# CUDA device memory in the engine and the store; without a CUDA driver its
# CUDA modules skip with the reason and the no-driver checks run. Seconds.
python -m pytest tests/gpu -q -p no:cacheprovider --timeout=300 "$@"
# The GPU check's plumbing without a GPU: the release wheel installed into a
# scratch directory, tests/gpu and the benchmark through it. About 1 min.
rm -rf target/gpu-check-wheel
python -m maturin build --release -q --out target/gpu-check-wheel >/dev/null
OUT="$(mktemp -d)" bash scripts/gpu_check.sh --self-check --wheel-dir target/gpu-check-wheel --python python
# Tensor IO (needs torch; skips with a reason without it).
python -m pytest tests/tensor -q -p no:cacheprovider --timeout=300 "$@"
# Structured objects (mooncake.structured_object_store: DataProto batches,
# bundles, codecs), BufferPool and safetensors import/export; about 25 s.
python -m pytest tests/structured -q -p no:cacheprovider --timeout=300 "$@"
# The console scripts as real processes, and the release wheel installed in
# a fresh venv running the demo. About 1 min (the wheel build reuses the
# release artifacts of env.sh).
python -m pytest tests/packaging -q -p no:cacheprovider --timeout=900 "$@"
# The torch.distributed backend suite (pinned current torch release).
if [ "${MOONCAKE_SKIP_TORCH:-0}" != "1" ]; then
  python -m pytest tests/pg -q -p no:cacheprovider --timeout=600 "$@"
fi
# Python 3.10 (the oldest supported), with an older torch and the installed
# release wheel: the store, tensor and PG suites.
py310_rc=0
bash scripts/py310_env.sh || py310_rc=$?
if [ "$py310_rc" = "0" ]; then
  py310=.venv-py310/bin/python
  echo "== Python 3.10 run: $($py310 -c 'import sys, mooncake._native as n; print(sys.version.split()[0], n.__file__)')"
  $py310 -m pytest tests/store tests/store_binding -q -p no:cacheprovider --timeout=300 "$@"
  $py310 -m pytest tests/tensor -q -p no:cacheprovider --timeout=300 "$@"
  if [ "${MOONCAKE_SKIP_TORCH:-0}" != "1" ]; then
    $py310 -m pytest tests/pg -q -p no:cacheprovider --timeout=600 "$@"
  fi
elif [ "$py310_rc" = "3" ]; then
  skipped+=("Python 3.10 run (store, tensor, pg): no Python 3.10 on this machine (pyenv 3.10.x or python3.10)")
else
  exit "$py310_rc"
fi
# Gates last, so a lint finding never hides a test result (scripts/lint.sh).
bash scripts/lint.sh
if [ "${#skipped[@]}" -gt 0 ]; then
  line="SKIPPED SUITES:"
  for s in "${skipped[@]}"; do line="$line [$s]"; done
  echo "!!!!!!!! $line !!!!!!!!"
fi
