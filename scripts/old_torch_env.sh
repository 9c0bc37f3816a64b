#!/usr/bin/env bash
# A second venv, .venv-torch-old, with an older torch release (default 2.12.1)
# for the PG backend suite. The extension is abi3 and built once by env.sh:
# this venv only points at python/ (where maturin develop put _native) through
# a .pth file. Idempotent; sourced by test.sh after env.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OLD_TORCH_VERSION="${MOONCAKE_OLD_TORCH_VERSION:-2.12.1}"
OLD_VENV="$ROOT/.venv-torch-old"
if [ ! -x "$OLD_VENV/bin/python" ]; then
  python3 -m venv "$OLD_VENV"
fi
"$OLD_VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$OLD_VENV/bin/python" -m pip install -q "pytest>=7" pytest-timeout numpy
"$OLD_VENV/bin/python" - "$OLD_TORCH_VERSION" <<'PY' 2>/dev/null || "$OLD_VENV/bin/python" -m pip install -q "torch==$OLD_TORCH_VERSION"
import sys, torch
sys.exit(0 if torch.__version__.split("+")[0] == sys.argv[1] else 1)
PY
site="$("$OLD_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$ROOT/python" > "$site/mooncake_rs.pth"
