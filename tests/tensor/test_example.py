"""The shipped tensor checkpoint example runs end to end (small state dict).

It starts its own master, four TP=4 writer processes and two TP=2 reader
processes, and verifies every tensor it reads back; the test checks it
reports each stage verified, with two master RPCs per batched load.
"""

from __future__ import annotations

import re

import pytest
from helpers.examples import example_env, run_repo_script

pytest.importorskip("torch")


def test_tensor_checkpoint_example_runs() -> None:
    env = example_env(drop=("MC_FORCE_TCP", "MC_STORE_SAME_HOST"))
    r = run_repo_script("examples/tensor_checkpoint.py", "--mib", "8", env=env, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert len(re.findall(r"writer \d: \d+ tensors", out)) == 4, out
    assert re.search(r"\(a\) full load in this process: .* 2 master RPCs\), verified", out), out
    assert len(re.findall(r"\(b\) TP=2 reader \d: .* 2 master RPCs\), verified", out)) == 2, out
    assert "checkpoint OK" in out
