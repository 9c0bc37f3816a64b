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
# System tools, installed when missing and we are root (as on CI and a
# fresh dev VM): protoc (Debian's protobuf-compiler), required, since
# etcd-client (the HA masters' etcd backend) compiles etcd's .proto files
# at build time; ss (iproute2), with which the store suite reads the
# congestion control of live data connections (the demo does not need it).
missing=()
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v ss >/dev/null 2>&1 || missing+=(iproute2)
if [ "${#missing[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    (apt-get update -qq >/dev/null || true)
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  elif ! command -v protoc >/dev/null 2>&1; then
    echo "protoc is required to build etcd-client: apt-get install protobuf-compiler" >&2
    exit 1
  else
    echo "note: ss (iproute2) is missing; the store suite's congestion-control test needs it" >&2
  fi
fi
# cargo-machete for the lint gate's unused-dependency check.
if ! command -v cargo-machete >/dev/null 2>&1; then
  cargo install cargo-machete --locked -q
fi
# The venv runs the newest supported Python found here (3.13, else 3.12,
# else 3.11; scripts/find_python.sh), so the whole suite runs on it; the
# oldest supported one (3.10) gets its own venv (scripts/py310_env.sh).
# MOONCAKE_PYTHON names an interpreter instead.
# shellcheck source=scripts/find_python.sh
. scripts/find_python.sh
PY="${MOONCAKE_PYTHON:-$(find_python 3.13 3.12 3.11 || command -v python3)}"
want="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ -x .venv/bin/python ]; then
  have="$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo none)"
  if [ "$have" != "$want" ]; then
    echo "env.sh: .venv runs Python $have; recreating it on Python $want ($PY)" >&2
    rm -rf .venv
  fi
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
python -m pip install -q "maturin>=1.5,<2" "pytest>=7" pytest-timeout hypothesis numpy msgpack safetensors "ruff==0.17.6" "mypy==2.4.1"
# torch for the PG backend suite: the current PyPI release, pinned so CI is
# reproducible (MOONCAKE_TORCH_VERSION overrides; MOONCAKE_SKIP_TORCH=1 skips).
TORCH_VERSION="${MOONCAKE_TORCH_VERSION:-2.15.0}"
if [ "${MOONCAKE_SKIP_TORCH:-0}" != "1" ]; then
  python - "$TORCH_VERSION" <<'PY' 2>/dev/null || python -m pip install -q "torch==$TORCH_VERSION"
import sys, torch
sys.exit(0 if torch.__version__.split("+")[0] == sys.argv[1] else 1)
PY
fi
maturin develop --release -q
