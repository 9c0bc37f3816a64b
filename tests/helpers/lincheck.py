"""Running robustness workloads and checking their histories with
``mooncake-lincheck`` (the checker crate's binary).

A workload process (``tests/robustness/workload.py``) runs random operations
on a few contended keys and records each one as JSON lines: a pending line
before the call, then its invocation, completion and outcome.
:func:`check_histories` merges the histories of a run (an operation a
killed process left pending counts as crashed: it may or may not have taken
effect, at any time after its invocation) and asserts the checker finds
zero anomalies: the history is linearizable for a register-with-delete per
key (with ``eviction``, a key may also read as not found, but never as an
older or a foreign value), no read saw bytes no write made, and no
operation stayed open past ``stuck_ns``.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = REPO / "tests" / "robustness" / "workload.py"


def lincheck_binary() -> str:
    """The checker binary (scripts/test.sh builds it first); built here when
    it is missing."""
    binary = REPO / "target" / "release" / "mooncake-lincheck"
    if not binary.exists():
        subprocess.run(
            ["cargo", "build", "--release", "-q", "-p", "mooncake-lincheck"],
            cwd=REPO,
            check=True,
            timeout=900,
        )
    return str(binary)


def start_workload(
    cfg: dict[str, Any],
    env: dict[str, str] | None = None,
    popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
) -> subprocess.Popen[bytes]:
    """A workload process for ``cfg`` (see workload.py), once it is set up;
    ``popen`` starts it (in a network namespace, for example)."""
    p = popen(
        [sys.executable, str(WORKLOAD), json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env=None if env is None else dict(os.environ, **env),
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    assert json.loads(line) == {"ready": True}, line
    return p


def pause(pid: int, seconds: float) -> None:
    """The pause nemesis: SIGSTOP ``pid`` for ``seconds``, then SIGCONT
    (also when interrupted)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def longest_unavailability(merged: Path) -> float:
    """Seconds of the longest stretch in the history ``merged`` with no
    operation completing successfully (a definite "not found" or "exists"
    answer counts as service; failures and timeouts do not)."""
    done = sorted(
        op["complete"]
        for op in map(json.loads, merged.read_text().splitlines())
        if op.get("complete") is not None and isinstance(op.get("outcome"), dict)
    )
    return max((b - a for a, b in itertools.pairwise(done)), default=0) / 1e9


def merge(histories: list[Path]) -> list[str]:
    """The operations of ``histories`` as the checker's JSON lines: each
    completed one, and each ``pending`` one that no completion of the same
    client and sequence number follows (its process was killed during the
    call) as crashed."""
    done: list[dict[str, Any]] = []
    pending: dict[tuple[int, int], dict[str, Any]] = {}
    for path in histories:
        for line in path.read_text().splitlines():
            if not line:
                continue
            op = json.loads(line)
            if op.pop("pending", False):
                pending[op["client"], op["seq"]] = op
            else:
                done.append(op)
    for op in done:
        pending.pop((op["client"], op["seq"]), None)
    crashed = [dict(op, complete=None, outcome="crashed") for op in pending.values()]
    return [json.dumps(op) for op in done + crashed]


def check_histories(
    lincheck: str,
    histories: list[Path],
    merged: Path,
    keys: int,
    eviction: bool,
    stuck_ns: int,
) -> str:
    """Merge ``histories`` into ``merged`` and check it: zero anomalies.
    Returns the checker's report."""
    lines = merge(histories)
    merged.write_text("\n".join(lines) + "\n")
    assert len(lines) > 100, f"only {len(lines)} operations were recorded"
    model = ["--eviction"] if eviction else []
    out = subprocess.run(
        [lincheck, *model, "--stuck-after", str(stuck_ns), str(merged)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert f"checked: {len(lines)} ops, {keys} keys, 0 anomalies" in out.stdout, out.stdout
    return out.stdout
