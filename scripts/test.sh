#!/usr/bin/env bash
# Run the whole test suite: Rust unit/integration tests, then the pytest
# suites against real mooncake_master processes on loopback ports.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/env.sh
cargo test -p mooncake-common -p mooncake-transfer -p mooncake-master -p mooncake-client -p mooncake-engram 2>&1
# Each suite has its own conftest helpers, so each runs in its own pytest process.
python -m pytest tests/store tests/store_binding -q -p no:cacheprovider --timeout=300 "$@"
python -m pytest tests/engram -q -p no:cacheprovider --timeout=300 "$@"
# tests/pg (the torch.distributed backend suite) needs torch: it runs when
# torch is installed (MOONCAKE_TORCH_SPEC picks the version, e.g. "==2.12.1").
if python -c "import torch" 2>/dev/null; then
  python -m pytest tests/pg -q -p no:cacheprovider --timeout=600 "$@"
fi
