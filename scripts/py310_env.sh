#!/usr/bin/env bash
# A second venv, .venv-py310, on the oldest supported Python (3.10) with an
# older torch release (default 2.12.1, the newest with wheels for both 3.10
# and the current release's ABI), for the store, tensor and PG suites.
# The package is installed from the release wheel (`maturin build --release`,
# which reuses what env.sh's `maturin develop --release` compiled, a few
# seconds), so these suites also run the wheel a user ships, console
# scripts included. Run after env.sh (its venv provides maturin).
# Idempotent. Exits 3, saying why, when no Python 3.10 is found.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# shellcheck source=scripts/find_python.sh
. scripts/find_python.sh
TORCH_310="${MOONCAKE_PY310_TORCH_VERSION:-2.12.1}"
VENV="$ROOT/.venv-py310"
PY310="${MOONCAKE_PYTHON310:-$(find_python 3.10 || true)}"
if [ -z "$PY310" ]; then
  echo "py310_env.sh: no Python 3.10 found (pyenv 3.10.x or python3.10 on PATH)" >&2
  exit 3
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY310" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q "pytest>=7" pytest-timeout hypothesis numpy
if [ "${MOONCAKE_SKIP_TORCH:-0}" != "1" ]; then
  "$VENV/bin/python" - "$TORCH_310" <<'PY' 2>/dev/null || "$VENV/bin/python" -m pip install -q "torch==$TORCH_310"
import sys, torch
sys.exit(0 if torch.__version__.split("+")[0] == sys.argv[1] else 1)
PY
fi
# An older layout pointed this venv's Python at python/ through a .pth file;
# the wheel replaces it.
rm -f "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/mooncake_rs.pth"
WHEELS="$ROOT/target/wheels-py310"
rm -rf "$WHEELS"
# In .venv's environment, as env.sh built: the same interpreter and
# variables, so cargo finds its release artifacts fresh.
(
  # shellcheck disable=SC1091
  . "$ROOT/.venv/bin/activate"
  maturin build --release -q --out "$WHEELS" >/dev/null
)
"$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$WHEELS"/mooncake_rs-*.whl
