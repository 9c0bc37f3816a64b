"""The shipped example and benchmark run end to end (small sizes)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from conftest import ROOT


def clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("MOONCAKE_CONFIG_PATH", "MOONCAKE_MASTER", "MC_FORCE_TCP", "MC_STORE_SAME_HOST"):
        env.pop(k, None)
    return env


def test_example_engram_layer_runs() -> None:
    args = ["--heads", "4", "--dim", "16", "--table-size", "5000", "--batch", "2"]
    args += ["--tokens", "64", "--iters", "3"]
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "engram_layer.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "output shape (2, 64, 4, 16) float32" in r.stdout
    assert re.search(r"lookup [0-9.]+ ms per call, [0-9.]+ ns per token", r.stdout), r.stdout


def test_benchmark_script_runs() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "engram_bench.py")]
        + ["--shape", "upstream", "--mode", "same-host", "--batches", "1,4"]
        + ["--warmup", "1", "--iters", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
        check=False,
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert [row["batch"] for row in rows] == [1, 4]
    for row in rows:
        assert row["impl"] == "ours" and row["mode"] == "same-host"
        assert row["p50_ms"] > 0 and row["tokens_per_s"] > 0
