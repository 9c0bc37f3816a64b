"""The shipped tensor checkpoint example runs end to end (small state dict).

It starts its own master, four TP=4 writer processes and two TP=2 reader
processes, and verifies every tensor it reads back; the test checks it
reports each stage verified, with two master RPCs per batched load.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def test_tensor_checkpoint_example_runs() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MC_FORCE_TCP", "MC_STORE_SAME_HOST")}
    if "MOONCAKE_MASTER_BIN" not in env:
        sib = Path(sys.executable).parent / "mooncake_master"
        env["MOONCAKE_MASTER_BIN"] = (
            str(sib) if sib.exists() else (shutil.which("mooncake_master") or "")
        )
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "tensor_checkpoint.py"), "--mib", "8"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert len(re.findall(r"writer \d: \d+ tensors", out)) == 4, out
    assert re.search(r"\(a\) full load in this process: .* 2 master RPCs\), verified", out), out
    assert len(re.findall(r"\(b\) TP=2 reader \d: .* 2 master RPCs\), verified", out)) == 2, out
    assert "checkpoint OK" in out
