#!/usr/bin/env bash
# Run the whole test suite: Rust unit/integration tests, then the pytest
# suites against real mooncake_master processes on loopback ports.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/env.sh
cargo test --workspace --release 2>&1
python -m pytest tests -q -p no:cacheprovider --timeout=300 "$@"
