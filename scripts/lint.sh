#!/usr/bin/env bash
# The project's gates, run by scripts/test.sh (so by CI): formatting, clippy with
# the workspace lints denied, ruff lint + format on every Python tree, and the
# extension's type stub checked against the built module by mypy.stubtest, and
# the module tree of every crate (no module uses one that uses it back), and
# no private history (tracker numbers, numbered log headings, section signs).
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
echo "== mypy.stubtest mooncake._native"
python -m mypy.stubtest mooncake._native
echo "gates passed"
