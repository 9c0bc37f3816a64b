#!/usr/bin/env bash
# Create the upstream Mooncake 0.3.13 reference venv used to validate the
# acceptance suite and as the comparison side of benchmarks/store_bench.py.
#
#   bash benchmarks/upstream_env.sh            # -> /work/venv-upstream
#   UPSTREAM_VENV=/path bash benchmarks/upstream_env.sh
#
# Prints the path of upstream's mooncake_master binary on its last line.
set -euo pipefail

VENV="${UPSTREAM_VENV:-/work/venv-upstream}"
PKG="${UPSTREAM_PKG:-mooncake-transfer-engine-non-cuda==0.3.13.post1}"
PY="${PYTHON:-python3}"

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
if command -v apt-get >/dev/null 2>&1; then
    $SUDO apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
        libibverbs1 librdmacm1 libnuma1 >/dev/null || \
        echo "warning: apt-get install of runtime libs failed" >&2
fi

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip >/dev/null
"$VENV/bin/pip" install -q "$PKG" numpy pytest pytest-timeout
# torch for the tensor benchmark's upstream side (the project's venvs run
# other Python versions, so their torch cannot be borrowed).
if [ "${MOONCAKE_SKIP_TORCH:-0}" != "1" ]; then
  "$VENV/bin/python" -c "import torch" 2>/dev/null \
    || "$VENV/bin/pip" install -q "torch==${MOONCAKE_TORCH_VERSION:-2.15.0}"
fi

# Locate the master binary shipped by the wheel.
MASTER=""
# Prefer the ELF binary inside the package over the bin/ wrapper script.
for cand in "$("$VENV/bin/python" - <<'PY' 2>/dev/null
import os, mooncake
for base in mooncake.__path__:
    p = os.path.join(base, "mooncake_master")
    if os.path.exists(p):
        print(p)
        break
PY
)" "$VENV/bin/mooncake_master"; do
    if [ -n "$cand" ] && [ -e "$cand" ]; then MASTER="$cand"; break; fi
done
if [ -z "$MASTER" ]; then
    MASTER="$(find "$VENV" -name 'mooncake_master*' -type f -perm -u+x 2>/dev/null | head -1 || true)"
fi
if [ -z "$MASTER" ]; then
    echo "error: mooncake_master not found in $VENV" >&2
    exit 1
fi
"$VENV/bin/python" -c "from mooncake.store import MooncakeDistributedStore" \
    || { echo "error: upstream mooncake.store does not import" >&2; exit 1; }
echo "$MASTER"
