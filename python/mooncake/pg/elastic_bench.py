"""Elastic-membership benchmark: ``python -m mooncake.pg.elastic_bench``.

World 4 on ``mooncake-cpu`` with default settings (silence timeout 10 s,
reconciliation window 30 s). Each trial:

1. every rank runs an all_reduce loop; rank 3's process SIGKILLs itself;
2. *kill-to-continue*: time from the kill to each survivor's first
   successful all_reduce on the new membership (no failed-rank hint, three
   active ranks); the trial's figure is the slowest survivor;
3. a replacement process for rank 3 starts: *join latency* is the time from
   its ``init_process_group`` (``is_extension=True``) to the return of its
   first all_reduce with the group (rank 0 activates it as soon as
   ``get_peer_state`` reports it ready); its interpreter and torch import
   time is reported separately;
4. the replacement is the next trial's victim.

Prints p50/max over the trials, then (unless ``--skip-collectives``) the
``mooncake-cpu`` vs ``gloo`` all_reduce comparison at world 4 from
``mooncake.pg.bench`` in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

WORLD = 4
VICTIM = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _init(rank: int, world: int, port: int, extension: bool) -> None:
    import torch.distributed as dist

    from mooncake import pg

    dist.init_process_group(
        "mooncake-cpu",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
        pg_options=pg.MooncakeBackendOptions(WORLD, extension),
    )


def _victim_loop(iters: int, q: Any) -> None:
    """Rank 3's part of a trial: ``iters`` all_reduces, then SIGKILL."""
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    for _ in range(iters):
        t.fill_(1.0)
        dist.all_reduce(t)
    q.put(("kill", time.time()))
    q.close()
    q.join_thread()  # the message is in the pipe before the process dies
    os.kill(os.getpid(), signal.SIGKILL)


def _member(rank: int, port: int, trials: int, iters: int, q: Any, cmd: Any) -> None:
    import torch
    import torch.distributed as dist

    from mooncake import pg

    _init(rank, WORLD, port, False)
    group = dist.group.WORLD
    if rank == VICTIM:
        _victim_loop(iters, q)
        return
    t = torch.ones(1)
    for trial in range(trials):
        # Loop until the victim is gone and an all_reduce succeeds without it.
        while True:
            t.fill_(1.0)
            w = dist.all_reduce(t, async_op=True)
            w.wait()
            if float(t) == WORLD - 1 and pg.get_local_success(w):
                q.put(("continue", trial, rank, time.time()))
                break
        if trial == trials - 1:
            break
        # Wait for the replacement, then bring the group back to four.
        while not pg.get_peer_state(group, [VICTIM])[0]:
            time.sleep(0.001)
        if rank == 0:
            r = pg.activate_ranks(group, [VICTIM])
            assert r.status == pg.ProposalStatus.Applied, r
            q.put(("activated", trial, r.new_epoch))
        else:
            while int(pg.get_active_ranks(group).sum()) < WORLD:
                time.sleep(0.0005)
    cmd.get()  # stay up until every process is done
    dist.destroy_process_group()


def _replacement(port: int, iters: int, q: Any, spawned_at: float) -> None:
    import torch
    import torch.distributed as dist

    from mooncake import pg

    imported = time.time()
    _init(VICTIM, WORLD, port, True)
    pg.join_group(dist.group.WORLD)
    t = torch.ones(1)
    dist.all_reduce(t)
    first = time.time()
    q.put(("joined", first - imported, imported - spawned_at, float(t)))
    _victim_loop(iters, q)


def run(trials: int, iters: int) -> dict[str, list[float]]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    cmd = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_member, args=(r, port, trials, iters, q, cmd)) for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    kill_to_continue: list[float] = []
    join: list[float] = []
    imports: list[float] = []
    extra: list[Any] = []
    try:
        for trial in range(trials):
            kill_at: float | None = None
            cont: dict[int, float] = {}
            deadline = time.time() + 120
            while kill_at is None or len(cont) < WORLD - 1:
                msg = q.get(timeout=max(deadline - time.time(), 1))
                if msg[0] == "kill":
                    kill_at = msg[1]
                elif msg[0] == "continue" and msg[1] == trial:
                    cont[msg[2]] = msg[3]
            assert kill_at is not None
            kill_to_continue.append(max(cont.values()) - kill_at)
            if trial == trials - 1:
                break
            rp = ctx.Process(target=_replacement, args=(port, iters, q, time.time()))
            rp.start()
            extra.append(rp)
            while True:
                msg = q.get(timeout=120)
                if msg[0] == "joined":
                    if msg[3] != WORLD * 1.0:
                        raise AssertionError(f"replacement's first all_reduce gave {msg[3]}")
                    join.append(msg[1])
                    imports.append(msg[2])
                    break
    finally:
        for _ in procs:
            cmd.put("done")
        for p in procs + extra:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return {"kill_to_continue": kill_to_continue, "join": join, "import": imports}


def _row(name: str, xs: list[float]) -> str:
    if not xs:
        return f"| {name} | - | - | 0 |"
    return f"| {name} | {statistics.median(xs):.3f} | {max(xs):.3f} | {len(xs)} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mooncake.pg.elastic_bench", description=__doc__)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--iters", type=int, default=20, help="all_reduces before each kill")
    ap.add_argument("--transport", choices=["auto", "tcp"], default="auto")
    ap.add_argument("--skip-collectives", action="store_true")
    args = ap.parse_args(argv)
    os.environ["MOONCAKE_PG_TRANSPORT"] = args.transport
    res = run(args.trials, args.iters)
    print(
        f"# elastic membership, world {WORLD}, mooncake-cpu, transport {args.transport}, "
        f"default timeouts (T = 10 s, reconciliation window 30 s)"
    )
    print("| metric | p50 (s) | max (s) | n |")
    print("|---|---:|---:|---:|")
    print(
        _row(
            "kill-to-continue (SIGKILL -> first clean all_reduce of every survivor)",
            res["kill_to_continue"],
        )
    )
    print(_row("join latency (replacement init_process_group -> first all_reduce)", res["join"]))
    print(_row("replacement interpreter + torch import", res["import"]))
    sys.stdout.flush()
    if not args.skip_collectives:
        print("\n# collective comparison in the same run (python -m mooncake.pg.bench)")
        sys.stdout.flush()
        rc = subprocess.call(
            [
                sys.executable,
                "-m",
                "mooncake.pg.bench",
                "--collective",
                "all_reduce",
                "--backends",
                "mooncake-cpu,gloo",
                "-g",
                str(WORLD),
                "-b",
                "1K",
                "-e",
                "16M",
                "-f",
                "16",
                "-n",
                "10",
            ]
        )
        if rc != 0:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
