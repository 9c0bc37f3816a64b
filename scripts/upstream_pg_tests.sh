#!/usr/bin/env bash
# Runs upstream Mooncake's own PG tests, unchanged, against the package built
# into .venv (scripts/env.sh): every mooncake-pg/tests/test_*.py of an
# upstream checkout, CPU test classes only (upstream's `-k CPU`; the CUDA and
# MUSA classes are deselected), over TCP (MC_FORCE_TCP=true), one file at a
# time, and prints one line per file: passed, failed, skipped.
#
#   scripts/upstream_pg_tests.sh [-r RUNS] [-k PATTERN] [-t SECONDS] UPSTREAM [FILE...]
#
# UPSTREAM is a checkout (a directory holding mooncake-pg/tests) or a bare
# git directory, whose HEAD's mooncake-pg (and the transfer engine's headers)
# are extracted into a temporary directory. FILE names test files to run (default: all test_*.py). -r runs
# the set RUNS times (default 1); -k selects tests by unittest's name pattern
# (default CPU: `*CPU*` against module.Class.test); -t bounds each file's run
# (default 1800 s). Each file's unittest output goes to a log file in
# $UPSTREAM_PG_LOGS (default: a new temporary directory), whose last lines are
# printed when the file has failures. Exits non-zero if any test failed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs=1
pattern=CPU
limit=1800
usage() {
  sed -n '8p' "${BASH_SOURCE[0]}" | sed 's/^# */usage: /' >&2
  exit 2
}
while getopts "r:k:t:h" opt; do
  case "$opt" in
    r) runs="$OPTARG" ;;
    k) pattern="$OPTARG" ;;
    t) limit="$OPTARG" ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || usage
upstream="$1"
shift

tmp=""
cleanup() { [ -z "$tmp" ] || rm -rf "$tmp"; }
trap cleanup EXIT
if [ -d "$upstream/mooncake-pg/tests" ]; then
  tests="$(cd "$upstream/mooncake-pg/tests" && pwd)"
elif git --git-dir="$upstream" rev-parse --verify -q HEAD >/dev/null 2>&1; then
  tmp="$(mktemp -d)"
  # The tests' fault-injection shim compiles against these headers (it
  # skips its tests when it cannot hook the transfer engine).
  # (A partial mirror may lack blobs of unrelated paths; git names them on
  # stderr while archiving these.)
  git --git-dir="$upstream" archive HEAD mooncake-pg mooncake-transfer-engine/include 2>/dev/null |
    tar -x -C "$tmp"
  tests="$tmp/mooncake-pg/tests"
  [ -d "$tests" ] || {
    echo "$upstream: HEAD has no mooncake-pg/tests" >&2
    exit 2
  }
  echo "upstream: $(git --git-dir="$upstream" rev-parse --short HEAD) (HEAD of $upstream)"
else
  echo "$upstream: neither a checkout with mooncake-pg/tests nor a git directory" >&2
  exit 2
fi

if [ $# -gt 0 ]; then
  files=("$@")
else
  files=()
  for f in "$tests"/test_*.py; do files+=("$(basename "$f")"); done
fi
[ "${#files[@]}" -gt 0 ] || {
  echo "no test_*.py in $tests" >&2
  exit 2
}

# shellcheck disable=SC1091
. "$ROOT/.venv/bin/activate"
logs="${UPSTREAM_PG_LOGS:-$(mktemp -d -t upstream-pg-logs.XXXXXX)}"
mkdir -p "$logs"
echo "logs: $logs"

# Runs one file's selected tests with unittest and prints
# "RESULT passed failed skipped" last.
runner='
import os, sys, unittest
path, pattern = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.dirname(path))
name = os.path.basename(path)[:-3]
loader = unittest.TestLoader()
loader.testNamePatterns = [pattern if "*" in pattern else f"*{pattern}*"]
suite = loader.loadTestsFromName(name)
res = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
bad = len(res.failures) + len(res.errors) + len(res.unexpectedSuccesses)
skipped = len(res.skipped)
passed = res.testsRun - bad - skipped - len(res.expectedFailures)
print(f"RESULT {passed} {bad} {skipped}", flush=True)
'

total_failed=0
for run in $(seq 1 "$runs"); do
  [ "$runs" -eq 1 ] || echo "== run $run/$runs"
  for f in "${files[@]}"; do
    log="$logs/${f%.py}.run$run.log"
    start=$(date +%s)
    rc=0
    (
      cd "$tests"
      MC_FORCE_TCP=true PYTHONPATH="$tests${PYTHONPATH:+:$PYTHONPATH}" \
        timeout -k 10 "$limit" python -c "$runner" "$tests/$f" "$pattern"
    ) >"$log" 2>&1 || rc=$?
    secs=$(($(date +%s) - start))
    line="$(grep '^RESULT ' "$log" | tail -1 || true)"
    if [ -n "$line" ]; then
      read -r _ passed failed skipped <<<"$line"
    else
      # Killed by the time limit or crashed before reporting.
      passed=0
      failed=1
      skipped=0
    fi
    [ "$rc" -eq 0 ] || [ "$failed" -gt 0 ] || failed=1
    printf '%-36s passed %3d  failed %3d  skipped %3d  (%ds)\n' \
      "$f" "$passed" "$failed" "$skipped" "$secs"
    if [ "$failed" -gt 0 ]; then
      total_failed=$((total_failed + failed))
      tail -n 40 "$log" | sed 's/^/    | /'
    fi
  done
done
[ "$total_failed" -eq 0 ]
