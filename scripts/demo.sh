#!/usr/bin/env bash
# Main job: start a mooncake_master on embedded defaults and run a short demo
# workload across two client processes (a writer that owns a segment, and a
# reader that reads its objects through the same-host path and over TCP).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
MOONCAKE_SKIP_TORCH=${MOONCAKE_SKIP_TORCH:-1} source scripts/env.sh
python examples/demo.py
