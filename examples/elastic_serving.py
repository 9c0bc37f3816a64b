"""Elastic serving with the ``mooncake-cpu`` backend.

Four ranks serve "requests" in an all_reduce loop. Rank 2's process is
SIGKILLed; the survivors keep serving (the next all_reduce flags the dead
rank, the ones after it run over three ranks). A replacement process then
starts as rank 2 with ``is_extension=True`` and calls ``join_group``; rank 0
activates it once ``get_peer_state`` says it is ready, and the loop is back
to four. Every process prints timeline events; the parent merges them.

    python examples/elastic_serving.py [--steps 10] [--kill-at 10]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import queue
import signal
import time
from typing import Any

from _launch import free_port

WORLD = 4
VICTIM = 2


def init(rank: int, port: int, joining: bool) -> None:
    import torch.distributed as dist
    from mooncake import pg

    dist.init_process_group(
        "mooncake-cpu",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
        # Reserve four slots; a joining process declares is_extension=True.
        pg_options=pg.MooncakeBackendOptions(WORLD, joining),
    )


def log(events: Any, rank: int, what: str) -> None:
    events.put((time.time(), rank, what))


def serve_loop(rank: int, steps: int, kill_at: int | None, events: Any) -> None:
    """All_reduce loop until rank 0 says stop (``steps`` steps after the group
    is back to four); rank 0 also re-activates the victim's slot as soon as a
    replacement is ready."""
    import torch
    import torch.distributed as dist
    from mooncake import pg

    group = dist.group.WORLD
    # Safety cap only: a replacement's interpreter and torch import can take
    # tens of seconds on a loaded machine, so the cap is wall-clock and long.
    give_up = time.monotonic() + 180
    step = 0
    degraded = False  # rank 0: saw fewer than four ranks serve
    back = 0  # rank 0: steps served by four ranks since then
    while True:
        if rank == VICTIM and step == kill_at:
            log(events, rank, "SIGKILL")
            events.close()
            events.join_thread()
            os.kill(os.getpid(), signal.SIGKILL)
        # [1, stop]: the sum counts the ranks that served; rank 0 ends the run.
        stop = rank == 0 and (back >= steps or time.monotonic() > give_up)
        t = torch.tensor([1.0, 1.0 if stop else 0.0])
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        active = int(pg.get_active_ranks(group).sum())
        note = ""
        if not pg.get_local_success(work):
            lost = pg.get_failed_ranks_hint(work).nonzero().flatten().tolist()
            note = f" (lost rank(s) {lost}; epoch now {pg.get_current_epoch(group)})"
        log(events, rank, f"step {step}: served by {int(t[0])} ranks, {active} active{note}")
        if t[1] > 0:
            return
        degraded |= int(t[0]) < WORLD
        back += int(degraded and int(t[0]) == WORLD)
        if rank == 0 and active < WORLD and pg.get_peer_state(group, [VICTIM])[0]:
            r = pg.activate_ranks(group, [VICTIM])
            log(events, rank, f"activate_ranks([{VICTIM}]) -> {r.status.name}, epoch {r.new_epoch}")
        step += 1
        time.sleep(0.02)


def serve(rank: int, port: int, steps: int, kill_at: int, events: Any) -> None:
    """One of the original four ranks."""
    import torch.distributed as dist

    init(rank, port, joining=False)
    log(events, rank, "initialized")
    serve_loop(rank, steps, kill_at, events)
    dist.destroy_process_group()


def replacement(port: int, steps: int, events: Any) -> None:
    """A new process taking over rank 2."""
    import torch.distributed as dist
    from mooncake import pg

    init(VICTIM, port, joining=True)
    log(events, VICTIM, "replacement initialized (local-only until join_group)")
    pg.join_group(dist.group.WORLD)
    log(events, VICTIM, f"join_group returned, epoch {pg.get_current_epoch(dist.group.WORLD)}")
    serve_loop(VICTIM, steps, None, events)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="steps at four ranks after the rejoin")
    ap.add_argument("--kill-at", type=int, default=10)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    port = free_port()
    start = time.time()
    procs = [
        ctx.Process(target=serve, args=(r, port, args.steps, args.kill_at, events))
        for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    timeline: list[tuple[float, int, str]] = []
    spawned = False
    deadline = time.time() + 300
    while any(p.is_alive() for p in procs) or not events.empty():
        if time.time() > deadline:
            raise SystemExit("the example did not finish within 300 s")
        try:
            ev = events.get(timeout=0.2)
        except queue.Empty:
            continue
        timeline.append(ev)
        print(f"{ev[0] - start:8.3f}s  rank {ev[1]}  {ev[2]}", flush=True)
        if ev[2] == "SIGKILL" and not spawned:
            # Start the replacement right away (an orchestrator would do this).
            spawned = True
            procs.append(ctx.Process(target=replacement, args=(port, args.steps, events)))
            procs[-1].start()
    for p in procs:
        p.join(timeout=60)
    back = [e for e in timeline if "served by 4 ranks" in e[2] and e[0] > timeline[0][0]]
    killed = next(e[0] for e in timeline if e[2] == "SIGKILL")
    first_three = min(
        (e[0] for e in timeline if "served by 3 ranks" in e[2] and "lost" not in e[2]),
        default=float("nan"),
    )
    first_four = min((e[0] for e in back if e[0] > killed), default=float("nan"))
    print(f"\nkill -> first clean 3-rank step: {first_three - killed:.3f}s")
    print(
        f"kill -> back to 4 ranks:         {first_four - killed:.3f}s (includes the new process's start)"
    )


if __name__ == "__main__":
    main()
