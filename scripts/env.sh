#!/usr/bin/env bash
# Prepare a fresh machine: system packages, a Python venv in .venv with the
# test/runtime dependencies, and the Rust extension + mooncake_master built
# into it (release mode). Idempotent; sourced by demo.sh and test.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo (Rust toolchain) is required" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
python -m pip install -q "maturin>=1.5,<2" "pytest>=7" pytest-timeout numpy ruff
if [ "${MOONCAKE_SKIP_TORCH:-0}" != "1" ]; then
  python -c "import torch" 2>/dev/null || python -m pip install -q "torch${MOONCAKE_TORCH_SPEC:-}"
fi
maturin develop --release -q
