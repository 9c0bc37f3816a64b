"""Spawns real rank processes running a scenario from ``pg_scenarios.py``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE / "pg_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    scenario: str,
    world: int,
    *,
    transport: str = "auto",
    timeout: float = 90.0,
    ranks: list[int] | None = None,
    extra_env: dict[str, str] | None = None,
) -> list[str]:
    """Runs ``scenario`` on ``world`` ranks (or just ``ranks``); fails on any non-zero exit.

    Every process is killed when ``timeout`` passes, so a hang fails the test
    instead of blocking CI. Returns each rank's combined output.
    """
    port = free_port()
    env = dict(os.environ)
    env["MOONCAKE_PG_TRANSPORT"] = transport
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    if extra_env:
        env.update(extra_env)
    procs = []
    for r in ranks if ranks is not None else range(world):
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), scenario, str(r), str(world), str(port)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    deadline = time.monotonic() + timeout
    outs: list[str] = []
    timed_out = False
    for p in procs:
        left = max(deadline - time.monotonic(), 0.1)
        try:
            out, _ = p.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            timed_out = True
            for q in procs:
                q.kill()
            out, _ = p.communicate()
        outs.append(out)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    report = "\n".join(
        f"--- rank {i} (rc={p.returncode}) ---\n{o}" for i, (p, o) in enumerate(zip(procs, outs))
    )
    if timed_out:
        raise AssertionError(f"scenario {scenario} timed out after {timeout}s\n{report}")
    bad = [i for i, p in enumerate(procs) if p.returncode != 0]
    if bad:
        raise AssertionError(f"scenario {scenario}: ranks {bad} failed\n{report}")
    return outs
