#!/usr/bin/env bash
# Run the whole test suite: Rust unit/integration tests, then the pytest
# suites against real mooncake_master processes on loopback ports.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/env.sh
# Each fuzz target of the decoders of untrusted bytes (issue 10) runs this
# many seconds (about 3.5 min for all 13 on 2 cores).
export MC_FUZZ_SECS="${MC_FUZZ_SECS:-30}"
cargo test -p mooncake-common -p mooncake-transfer -p mooncake-engine -p mooncake-master -p mooncake-client -p mooncake-engram -p mooncake-pg -p mooncake-tensor -p mooncake-standalone 2>&1
# Each suite has its own conftest helpers, so each runs in its own pytest process.
python -m pytest tests/store tests/store_binding -q -p no:cacheprovider --timeout=300 "$@"
# The standalone service: real mooncake_client daemons on real masters,
# dummy clients (setup_dummy) in this process and in child processes,
# daemon and dummy faults, SGLang's and vLLM's standalone call sequences,
# mooncake.ep. About half a minute.
python -m pytest tests/standalone -q -p no:cacheprovider --timeout=300 "$@"
# Multi-host suite (issue 13): hosts as network namespaces, a real etcd, HA
# masters and fault injection; needs root, iproute2, iptables and etcd
# (installed by .ci/run), skips with the reason otherwise. About 1 min.
cargo build --release -q -p mooncake-netfault
python -m pytest tests/cluster -q -p no:cacheprovider --timeout=300 "$@"
python -m pytest tests/engram -q -p no:cacheprovider --timeout=300 "$@"
# The transfer engine (mooncake.engine): target and initiator processes, over
# P2PHANDSHAKE, the HTTP metadata server and etcd (skips without the etcd
# binary), on one host and with TCP forced. About half a minute.
python -m pytest tests/engine -q -p no:cacheprovider --timeout=300 "$@"
# Tensor IO (needs torch; skips with a reason without it).
python -m pytest tests/tensor -q -p no:cacheprovider --timeout=300 "$@"
# Structured objects (mooncake.structured_object_store: DataProto batches,
# bundles, codecs), BufferPool and safetensors import/export; about 25 s.
python -m pytest tests/structured -q -p no:cacheprovider --timeout=300 "$@"
# The torch.distributed backend suite, on the pinned current torch release and
# on an older one (scripts/old_torch_env.sh), unless MOONCAKE_SKIP_TORCH=1.
if [ "${MOONCAKE_SKIP_TORCH:-0}" != "1" ]; then
  python -m pytest tests/pg -q -p no:cacheprovider --timeout=600 "$@"
  bash scripts/old_torch_env.sh
  .venv-torch-old/bin/python -m pytest tests/pg -q -p no:cacheprovider --timeout=600 "$@"
fi
# Gates last, so a lint finding never hides a test result (scripts/lint.sh).
bash scripts/lint.sh
