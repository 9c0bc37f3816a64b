#!/usr/bin/env bash
# The project's gates, run by scripts/test.sh (so by CI): formatting, clippy with
# the workspace lints denied, no unused dependency, the module tree of every
# crate (no module uses one that uses it back), no private history (tracker
# numbers, numbered log headings, section signs), ruff lint (with complexity and
# bug-risk rules) + format on every Python tree, mypy --strict (pyproject's
# [tool.mypy]) on python/mooncake, and the extension's type stub checked
# against the built module by mypy.stubtest.
# Assumes scripts/env.sh has run (the venv is active and the extension built).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy (workspace lints denied)"
cargo clippy --workspace --all-targets -q -- -D warnings
echo "== cargo machete (no unused dependencies)"
cargo machete
echo "== module tree (no cycles between sibling modules, any crate)"
python scripts/module_tree.py crates
echo "== no private history in code, tests, scripts and docs"
python scripts/no_history.py
echo "== ruff check / ruff format --check"
ruff check python tests benchmarks examples scripts
ruff format --check python tests benchmarks examples scripts
echo "== mypy --strict python/mooncake"
if python -c "import torch" 2>/dev/null; then
  python -m mypy
else
  # The pg package is typed against torch's stubs; without torch the check
  # would only report the missing import (scripts/env.sh installs torch
  # unless MOONCAKE_SKIP_TORCH=1).
  echo "SKIPPED: torch is not installed in this venv"
fi
echo "== mypy.stubtest mooncake._native"
python -m mypy.stubtest mooncake._native
echo "gates passed"
