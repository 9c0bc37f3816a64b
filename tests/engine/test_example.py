"""examples/kv_transfer.py runs, verifies the decode side's KV byte for
byte, and prints its GB/s, on one host and with TCP forced."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kv_transfer.py"


@pytest.mark.parametrize("extra", [[], ["--tcp"]], ids=["same-host", "tcp"])
def test_kv_transfer_example(extra: list[str]) -> None:
    r = subprocess.run(
        [sys.executable, str(EXAMPLE), "--size-mb", "32", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    line = r.stdout.strip().splitlines()[-1]
    assert "verified=True" in line, line
    assert re.search(r"\d+\.\d+ GB/s", line), line
