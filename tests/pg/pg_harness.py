"""Launches rank processes that run many scenarios from ``pg_scenarios.py``.

Starting a process that imports torch costs seconds of CPU, so the suite
starts few processes: a *launch* is ``nprocs`` workers running a plan of
steps; each step is one scenario on a subset of the processes (its own
world, ranks, store port, transport and environment). Steps on disjoint
process sets run concurrently; each process runs its steps in plan order,
so the plan order is a deadlock-free schedule.

Every wait is bounded: a launch is killed when ``timeout`` passes, and once a
process fails the others get a short grace period before they are killed.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import torch.distributed as dist

HERE = Path(__file__).resolve().parent
WORKER = HERE / "pg_worker.py"


@dataclass
class Step:
    """One scenario run on ``procs`` (as ``ranks``, default 0..len-1) of a launch."""

    scenario: str
    world: int
    procs: list[int]
    transport: str = "auto"
    env: dict[str, str] = field(default_factory=dict)
    ranks: list[int] | None = None
    #: Processes that end (crash) inside the step: they report nothing.
    dies: list[int] = field(default_factory=list)
    #: Processes that freeze for good inside the step: killed at the end.
    freezes: list[int] = field(default_factory=list)
    label: str = ""

    @property
    def id(self) -> str:
        return self.label or f"{self.scenario}-w{self.world}-{self.transport}"


@dataclass
class LaunchResult:
    """Per-step outcome of a launch, and every process's output."""

    ok: dict[str, bool]
    report: str

    def check(self, step_id: str) -> None:
        if not self.ok.get(step_id, False):
            raise AssertionError(f"step {step_id} failed or did not run\n{self.report}")


def run_launch(steps: list[Step], nprocs: int, timeout: float = 400.0) -> LaunchResult:
    """Runs ``steps`` on ``nprocs`` fresh processes; never raises on a failed step."""
    ids = [s.id for s in steps]
    assert len(set(ids)) == len(ids), ids
    plan = [
        {
            "id": s.id,
            "scenario": s.scenario,
            "world": s.world,
            "procs": s.procs,
            "ranks": s.ranks if s.ranks is not None else list(range(len(s.procs))),
            "transport": s.transport,
            "env": s.env,
        }
        for s in steps
    ]
    hub = dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout),
    )
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    logs: list[IO[str]] = []
    procs = []
    for i in range(nprocs):
        log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed below
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), str(i), str(hub.port), json.dumps(plan)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    frozen = {p for s in steps for p in s.freezes}
    # Processes a step kills: their exit status is not a failure.
    doomed = {p for s in steps for p in s.dies}
    deadline = time.monotonic() + timeout
    failed_at: float | None = None
    timed_out = False
    while True:
        rcs = [p.poll() for p in procs]
        live = [i for i, rc in enumerate(rcs) if rc is None and i not in frozen]
        if not live:
            break
        now = time.monotonic()
        if failed_at is None and any(
            rc not in (None, 0) and i not in doomed for i, rc in enumerate(rcs)
        ):
            failed_at = now
        if now > deadline or (failed_at is not None and now - failed_at > 20):
            timed_out = now > deadline
            break
        time.sleep(0.05)
    _dump_stacks(
        [
            (p, log)
            for i, (p, log) in enumerate(zip(procs, logs, strict=True))
            if p.poll() is None and i not in frozen
        ]
    )
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    outs = []
    for log in logs:
        log.seek(0)
        outs.append(log.read())
        log.close()
    del hub
    done: dict[str, set[int]] = {}
    # A step fails when any of its processes reports a failure, including
    # one that was meant to die in it (a victim that broke before its kill
    # point would otherwise pass for a crash).
    failed: set[str] = set()
    for i, out in enumerate(outs):
        for line in out.splitlines():
            if line.startswith("@@STEP ") and line.split()[2] == "ok":
                done.setdefault(line.split()[1], set()).add(i)
            elif line.startswith("@@STEP ") and line.split()[2] == "FAIL":
                failed.add(line.split()[1])
    ok = {
        s.id: s.id not in failed
        and set(s.procs) - set(s.dies) - set(s.freezes) <= done.get(s.id, set())
        for s in steps
    }
    report = "\n".join(
        f"--- process {i} (rc={p.returncode}) ---\n{o}"
        for i, (p, o) in enumerate(zip(procs, outs, strict=True))
    )
    if timed_out:
        report = f"launch timed out after {timeout}s\n{report}"
    return LaunchResult(ok, report)


def _dump_stacks(stuck: list[tuple[subprocess.Popen[str], IO[str]]]) -> None:
    """Before the harness kills processes that are still running, each dumps
    every thread's Python stack into its log (SIGUSR1, see ``pg_worker``);
    with ``MCPG_TEST_GDB=1`` and gdb installed, the native stacks too."""
    for p, _ in stuck:
        p.send_signal(signal.SIGUSR1)
    if not stuck:
        return
    time.sleep(0.5)
    if os.environ.get("MCPG_TEST_GDB") != "1":
        return
    for p, log in stuck:
        subprocess.run(
            ["gdb", "-p", str(p.pid), "-batch", "-ex", "thread apply all bt"],
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=60,
            check=False,
        )
