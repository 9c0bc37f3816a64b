"""The shipped RL dataflow example runs end to end: a rollout process puts a
batch, a trainer process imports the exported handle and reads two fields of
a minibatch, and every value checks."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_rl_dataflow_example_runs() -> None:
    env = dict(os.environ)
    if "MOONCAKE_MASTER_BIN" not in env:
        sib = Path(sys.executable).parent / "mooncake_master"
        env["MOONCAKE_MASTER_BIN"] = (
            str(sib) if sib.exists() else (shutil.which("mooncake_master") or "")
        )
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "rl_dataflow.py"),
            "--rows",
            "256",
            "--width",
            "128",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"rollout: put 256 rows", r.stdout), r.stdout
    m = re.search(
        r"trainer: read input_ids \+ responses of 32 rows \(([\d.]+) MB moved\).*: verified",
        r.stdout,
    )
    assert m, r.stdout
    assert float(m.group(1)) < 0.1  # 32 of 256 rows of two fields, not the batch
