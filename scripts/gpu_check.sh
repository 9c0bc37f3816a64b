#!/usr/bin/env bash
# The GPU device check: on a machine with one GPU and no network (Python with
# torch, no Rust), install the abi3 wheel built elsewhere by
# `maturin build --release`, run tests/gpu, the CUDA tests of upstream's test
# files when a copy is given, then benchmarks/gpu_bench.py; results and logs
# go under $OUT. Finishes within 8 minutes (each step gets what is left).
#
#   scripts/gpu_check.sh [--self-check] [--wheel-dir DIR] [--upstream DIR] [--python PY]
#
# --wheel-dir  where the mooncake_rs-*-abi3-*.whl is (default: dist, then
#              target/wheels); wheels of missing test dependencies (pytest,
#              pytest-timeout, msgpack, numpy) may sit in DIR/deps.
# --upstream   a directory holding upstream's mooncake-wheel tests
#              (test_put_get_tensor.py, test_dummy_client.py); their CUDA
#              tests (`-k cuda`) run against a master on 50051 (HTTP metadata
#              on 8080) and a mooncake_client daemon on 50052, upstream's
#              fixed addresses. Default: $UPSTREAM_TESTS when set.
# --python     the interpreter (default: python3); the wheel is installed
#              into $OUT/site for it, nothing else is touched.
# --self-check prove the plumbing on a machine without a GPU: the same steps,
#              expecting tests/gpu's CUDA modules to skip ("no CUDA driver was
#              found") and the benchmark to say there is no GPU.
#
# $OUT (default: a new temporary directory) receives gpu_check.log (all
# output), results.txt (one line per step: name, status, seconds),
# pytest-gpu.xml, pytest-upstream-*.xml, gpu_bench.json and the daemons'
# logs. Exits 0 when every step passed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

self_check=0
wheel_dir=""
upstream="${UPSTREAM_TESTS:-}"
py="python3"
while [ $# -gt 0 ]; do
  case "$1" in
    --self-check) self_check=1 ;;
    --wheel-dir) wheel_dir="$2"; shift ;;
    --upstream) upstream="$2"; shift ;;
    --python) py="$2"; shift ;;
    -h|--help) sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

OUT="${OUT:-$(mktemp -d /tmp/gpu_check.XXXXXX)}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
RESULTS="$OUT/results.txt"
: >"$LOG"
: >"$RESULTS"
START=$(date +%s)
TOTAL=470          # seconds for all steps (8 minutes, less a margin)
failed=0
pids=()

log() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }
left() { echo $((TOTAL - ($(date +%s) - START))); }
# step NAME CAP CMD...: run CMD with at most CAP seconds (or what is left),
# its output into the log; record the outcome.
step() {
  local name="$1" cap="$2"
  shift 2
  local l t0 rc
  l=$(left)
  [ "$cap" -gt "$l" ] && cap="$l"
  if [ "$cap" -le 5 ]; then
    log "$name: SKIPPED (no time left)"
    echo "$name skipped-no-time 0" >>"$RESULTS"
    failed=1
    return 1
  fi
  log "$name: start (limit ${cap}s)"
  t0=$(date +%s)
  if declare -F "$1" >/dev/null; then
    "$@" >>"$LOG" 2>&1
  else
    timeout --kill-after=10 "$cap" "$@" >>"$LOG" 2>&1
  fi
  rc=$?
  local secs=$(($(date +%s) - t0))
  if [ $rc -eq 0 ]; then
    log "$name: ok (${secs}s)"
    echo "$name ok $secs" >>"$RESULTS"
  else
    [ $rc -eq 124 ] && log "$name: TIMED OUT after ${cap}s" || log "$name: FAILED (exit $rc)"
    echo "$name failed-$rc $secs" >>"$RESULTS"
    failed=1
  fi
  return $rc
}
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
}
trap cleanup EXIT

log "repo $ROOT, OUT $OUT, python $py, self-check $self_check"

# ---------------------------------------------------------------- the wheel
find_wheel() {
  local d
  for d in ${wheel_dir:+"$wheel_dir"} dist target/wheels; do
    ls -t "$d"/mooncake_rs-*abi3*.whl 2>/dev/null | head -1
  done | head -1
}
wheel="$(find_wheel)"
if [ -z "$wheel" ]; then
  log "no mooncake_rs abi3 wheel under ${wheel_dir:-dist or target/wheels}: build one with 'maturin build --release'"
  echo "install failed-no-wheel 0" >>"$RESULTS"
  exit 1
fi
SITE="$OUT/site"
install_wheel() {
  rm -rf "$SITE" && mkdir -p "$SITE/bin"
  if "$py" -m pip --version >/dev/null 2>&1 &&
    "$py" -m pip install --no-index --no-deps --target "$SITE" "$wheel"; then
    return 0
  fi
  # No pip: a wheel is a zip.
  echo "pip unavailable or failed: unpacking the wheel"
  "$py" -m zipfile -e "$wheel" "$SITE"
}
# The console scripts of the wheel's entry points, for this interpreter.
write_scripts() {
  "$py" - "$SITE" <<'EOF'
import configparser, glob, os, sys
site = sys.argv[1]
ep = configparser.ConfigParser()
ep.read(glob.glob(os.path.join(site, "*.dist-info", "entry_points.txt")))
for name, target in ep.items("console_scripts"):
    module, func = target.split(":")
    path = os.path.join(site, "bin", name)
    with open(path, "w") as f:
        f.write(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {site!r})\n"
                f"from {module} import {func}\nsys.exit({func}())\n")
    os.chmod(path, 0o755)
    print("console script", path)
EOF
}
step install 120 install_wheel || exit 1
step scripts 30 write_scripts || exit 1
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"
export MOONCAKE_MASTER_BIN="$SITE/bin/mooncake_master"
export MOONCAKE_MASTER_BIN_OURS="$SITE/bin/mooncake_master"
export MOONCAKE_CLIENT_BIN="$SITE/bin/mooncake_client"

# Test dependencies the interpreter lacks, from DIR/deps when present.
missing=$("$py" - <<'EOF'
import importlib.util
print(" ".join(m for m in ("pytest", "pytest_timeout", "msgpack", "numpy")
               if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
  deps="$(dirname "$wheel")/deps"
  log "missing Python modules: $missing (installing from $deps)"
  step deps 60 "$py" -m pip install --no-index --find-links "$deps" --target "$SITE" \
    $(echo "$missing" | sed 's/pytest_timeout/pytest-timeout/')
fi

step import 30 "$py" -c "
import mooncake, mooncake.engine as e, mooncake.store
assert mooncake.__file__.startswith('$SITE'), mooncake.__file__
print('mooncake from', mooncake.__file__, 'SUPPORT_CUDA', e.SUPPORT_CUDA)
"

# ---------------------------------------------------------------- the GPU
has_gpu=0
"$py" - >>"$LOG" 2>&1 <<'EOF' && has_gpu=1
import ctypes, sys
try:
    ctypes.CDLL("libcuda.so.1")
    import torch
    ok = torch.cuda.is_available()
    print("GPU:", torch.cuda.get_device_name(0) if ok else "none", "torch", torch.__version__)
    sys.exit(0 if ok else 1)
except Exception as e:
    print("no usable GPU:", e)
    sys.exit(1)
EOF
command -v nvidia-smi >/dev/null && nvidia-smi >>"$LOG" 2>&1
if [ $has_gpu -eq 0 ] && [ $self_check -eq 0 ]; then
  log "no usable GPU on this machine: run with --self-check to check the script alone"
  echo "gpu failed-no-gpu 0" >>"$RESULTS"
  failed=1
fi

# ---------------------------------------------------------------- tests/gpu
timeout_opt=""
"$py" -c "import pytest_timeout" 2>/dev/null && timeout_opt="--timeout=120"
step tests-gpu 240 "$py" -m pytest tests/gpu -v -rs -p no:cacheprovider $timeout_opt \
  --junitxml="$OUT/pytest-gpu.xml"
if [ $has_gpu -eq 1 ] && grep -q 'skipped' "$OUT/pytest-gpu.xml" 2>/dev/null; then
  # On a GPU machine only test_without_cuda.py may skip.
  if "$py" - "$OUT/pytest-gpu.xml" <<'EOF'; then
import sys, xml.etree.ElementTree as ET
bad = [c.get("classname") + "::" + c.get("name") for c in ET.parse(sys.argv[1]).iter("testcase")
       if c.find("skipped") is not None and "test_without_cuda" not in c.get("classname", "")]
print("\n".join(bad))
sys.exit(1 if bad else 0)
EOF
    :
  else
    log "tests-gpu: CUDA tests were skipped on a GPU machine"
    echo "tests-gpu-skips failed 0" >>"$RESULTS"
    failed=1
  fi
fi
if [ $self_check -eq 1 ]; then
  # Without a GPU the CUDA modules skip saying why.
  grep -q "no CUDA driver was found\|torch sees no CUDA device\|torch is not installed" "$LOG" &&
    echo "self-check-skip-reason ok 0" >>"$RESULTS" ||
    { echo "self-check-skip-reason failed 0" >>"$RESULTS"; failed=1; }
fi

# ---------------------------------------------------------------- upstream's CUDA tests
if [ -n "$upstream" ] && [ -d "$upstream" ]; then
  port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
  wait_port() { local i; for i in $(seq 1 100); do port_free "$1" || return 0; sleep 0.2; done; return 1; }
  if port_free 50051 && port_free 8080 && port_free 50052; then
    "$MOONCAKE_MASTER_BIN" --rpc_port=50051 --enable_http_metadata_server=true \
      --http_metadata_server_port=8080 --metrics_port=59003 \
      --default_kv_lease_ttl=5000 >"$OUT/upstream-master.log" 2>&1 &
    pids+=($!)
    wait_port 50051 && wait_port 8080
    "$MOONCAKE_CLIENT_BIN" --host=127.0.0.1 --port=50052 --global_segment_size="4 GB" \
      --master_server_address=127.0.0.1:50051 \
      --metadata_server=http://127.0.0.1:8080/metadata >"$OUT/upstream-daemon.log" 2>&1 &
    pids+=($!)
    wait_port 50052
    export MC_METADATA_SERVER=http://127.0.0.1:8080/metadata MASTER_SERVER=127.0.0.1:50051
    export PROTOCOL=tcp LOCAL_HOSTNAME=127.0.0.1 DEVICE_NAME=""
    for f in test_put_get_tensor.py test_dummy_client.py; do
      if [ -f "$upstream/$f" ]; then
        step "upstream-${f%.py}" 120 "$py" -m pytest "$upstream/$f" -k cuda -v -rs \
          -p no:cacheprovider --junitxml="$OUT/pytest-upstream-${f%.py}.xml"
        # pytest exits 5 when -k selects nothing: not a failure.
        tail -1 "$RESULTS" | grep -q "failed-5 " && sed -i '$ s/failed-5/none-selected/' "$RESULTS"
      else
        log "upstream $f: not in $upstream"
      fi
    done
    cleanup
    pids=()
  else
    log "upstream tests: ports 50051/8080/50052 are in use; skipped"
    echo "upstream skipped-ports-busy 0" >>"$RESULTS"
  fi
else
  log "upstream tests: no copy given (--upstream or \$UPSTREAM_TESTS); skipped"
  echo "upstream skipped-no-copy 0" >>"$RESULTS"
fi

# ---------------------------------------------------------------- the benchmark
bench_opt=()
[ "$(left)" -lt 200 ] && bench_opt=(--quick)
step gpu-bench 200 "$py" benchmarks/gpu_bench.py --json "$OUT/gpu_bench.json" "${bench_opt[@]}"
if [ $self_check -eq 1 ]; then
  grep -q '"gpu": false' "$OUT/gpu_bench.json" 2>/dev/null &&
    echo "self-check-bench-no-gpu ok 0" >>"$RESULTS" ||
    { echo "self-check-bench-no-gpu failed 0" >>"$RESULTS"; failed=1; }
fi

log "done in $(($(date +%s) - START))s; results:"
cat "$RESULTS" | tee -a "$LOG"
exit $failed
