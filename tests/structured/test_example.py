"""The shipped RL dataflow example runs end to end: a rollout process puts a
batch, a trainer process imports the exported handle and reads two fields of
a minibatch, and every value checks."""

from __future__ import annotations

import re

from helpers.examples import example_env, run_repo_script


def test_rl_dataflow_example_runs() -> None:
    r = run_repo_script(
        "examples/rl_dataflow.py", "--rows", "256", "--width", "128", env=example_env(), timeout=240
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"rollout: put 256 rows", r.stdout), r.stdout
    m = re.search(
        r"trainer: read input_ids \+ responses of 32 rows \(([\d.]+) MB moved\).*: verified",
        r.stdout,
    )
    assert m, r.stdout
    assert float(m.group(1)) < 0.1  # 32 of 256 rows of two fields, not the batch
