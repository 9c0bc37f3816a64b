"""The shipped example and benchmark run end to end (small sizes)."""

from __future__ import annotations

import json
import os
import re

from helpers.examples import run_repo_script


def clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("MOONCAKE_CONFIG_PATH", "MOONCAKE_MASTER", "MC_FORCE_TCP", "MC_STORE_SAME_HOST"):
        env.pop(k, None)
    return env


def test_example_engram_layer_runs() -> None:
    args = ["--heads", "4", "--dim", "16", "--table-size", "5000", "--batch", "2"]
    args += ["--tokens", "64", "--iters", "3"]
    r = run_repo_script("examples/engram_layer.py", *args, env=clean_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "output shape (2, 64, 4, 16) float32" in r.stdout
    assert re.search(r"lookup [0-9.]+ ms per call, [0-9.]+ ns per token", r.stdout), r.stdout


def test_benchmark_script_runs() -> None:
    args = ["--shape", "upstream", "--mode", "same-host", "--batches", "1,4"]
    args += ["--warmup", "1", "--iters", "3", "--json"]
    r = run_repo_script("benchmarks/engram_bench.py", *args, env=clean_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert [row["batch"] for row in rows] == [1, 4]
    for row in rows:
        assert row["impl"] == "ours" and row["mode"] == "same-host"
        assert row["p50_ms"] > 0 and row["tokens_per_s"] > 0
