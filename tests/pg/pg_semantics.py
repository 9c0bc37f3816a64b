"""Scenarios for real training and for failure semantics, run by
``pg_worker.py`` like ``pg_scenarios``: training losses equal gloo's; P2P
to a dead peer fails locally, per work; a send to a departed rank never
reports success; ``all_gather_into_tensor`` / ``reduce_scatter_tensor``
recover from a death mid-loop and take a replacement, and after the top
rank's death run sized for the survivors; destroy and
re-initialise on the same ``MASTER_PORT`` in the same processes.

Conventions: ``x_r = r + 1``. A step's ``ranks`` may hold ``100 + r`` for a
replacement process that takes over rank ``r`` once the original is gone.
Every wait is bounded (a scenario raises instead of hanging).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mooncake.pg as mpg
import torch
import torch.distributed as dist
from mooncake.pg import MooncakeBackendOptions, ProposalStatus
from pg_elastic import hub_get, hub_set, i32, wait_until
from pg_scenarios import eq, init

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import pg_training_bench

#: Longest any single op may take in these scenarios: a failure must end an
#: op with an error within this bound, never hang it.
OP_BOUND_S = 30.0


def _wait(w: Any, what: str) -> None:
    """``w.wait()`` that must return within ``OP_BOUND_S``."""
    t0 = time.monotonic()
    w.wait(timeout=datetime.timedelta(seconds=OP_BOUND_S))
    took = time.monotonic() - t0
    assert took < OP_BOUND_S, f"{what} waited {took:.1f}s"


def _activate(rank: int, victim: int, epoch: int) -> None:
    """Once the replacement of ``victim`` is ready here, rank 0 activates it
    (Applied at ``epoch``); the other survivor waits for that view. Every
    wait within ``OP_BOUND_S``."""
    pg = dist.group.WORLD
    wait_until(lambda: all(mpg.get_peer_state(pg, [victim])), "the replacement", OP_BOUND_S)
    if rank == 0:
        r = mpg.activate_ranks(pg, [victim])
        assert r.status == ProposalStatus.Applied and r.new_epoch == epoch, r
    else:
        wait_until(lambda: mpg.get_current_epoch(pg) == epoch, "the activation", OP_BOUND_S)


def _join_as(victim: int, port: int) -> None:
    """The replacement process: rank ``victim`` of 3 with ``is_extension``,
    local-only until ``join_group`` returns (within ``OP_BOUND_S``)."""
    hub_get("replace")
    init(victim, 3, port, MooncakeBackendOptions(3, True))
    eq(mpg.get_active_ranks(dist.group.WORLD), i32(*(int(r == victim) for r in range(3))), "local")
    mpg.join_group(dist.group.WORLD, timeout=OP_BOUND_S)


def _replace_after(rank: int, victim: int, port: int, survivors: Callable[[int, Any], None]) -> int:
    """World 3 where rank ``victim`` departs and a replacement takes its
    place: the replacement process (``rank`` >= 100) joins as ``victim``;
    every other process initializes rank ``rank``, runs ``survivors(rank,
    WORLD)`` (which makes ``victim`` depart), then rank 0 asks for the
    replacement and all activate it. Returns this process's rank."""
    if rank >= 100:
        _join_as(victim, port)
        return victim
    init(rank, 3, port, MooncakeBackendOptions(3))
    survivors(rank, dist.group.WORLD)
    if rank == 0:
        hub_set("replace")
    _activate(rank, victim, epoch=2)
    return rank


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# ----------------------------------------------------------------- training
def training_losses(rank: int, world: int, port: int) -> None:
    """DDP and FSDP2 (``fully_shard`` per Linear, then the model) train the
    benchmark's MLP, at a small size, on gloo and then on mooncake-cpu in
    the same processes: every rank's loss at every step equals gloo's,
    bitwise at world 2 (a two-term sum has one order), else within 1e-6
    relative (gloo's ring adds in another order than our rank order)."""
    kw: dict[str, Any] = {"steps": 4, "batch": 8, "features": 32, "hidden": 64}
    losses: dict[str, dict[str, list[float]]] = {}
    for backend in ("gloo", "mooncake-cpu"):
        init(rank, world, port, backend=backend)
        if backend == "mooncake-cpu":
            want = 0 if os.environ.get("MOONCAKE_PG_TRANSPORT") == "tcp" else world - 1
            assert dist.group.WORLD.shm_peer_count() == want
        losses[backend] = {
            mode: pg_training_bench.train(mode, rank, world, **kw)["losses"]
            for mode in ("ddp", "fsdp2")
        }
        dist.destroy_process_group()
    for mode in ("ddp", "fsdp2"):
        ref, got = losses["gloo"][mode], losses["mooncake-cpu"][mode]
        assert len(ref) == len(got) == kw["steps"], (ref, got)
        assert len(set(ref)) > 1, f"{mode}: the loss never moved: {ref}"
        for step, (a, b) in enumerate(zip(ref, got, strict=True)):
            if world == 2:
                assert a == b, f"{mode} step {step}: gloo {a!r} mooncake-cpu {b!r}"
            else:
                rel = abs(a - b) / max(abs(a), 1e-30)
                assert rel <= 1e-6, f"{mode} step {step}: gloo {a!r} mooncake-cpu {b!r}"


# ------------------------------------------------------ P2P to a dead peer
def _all_to_all_p2p(rank: int, peers: list[int]) -> tuple[list[tuple[str, int, Any]], dict]:
    """One ``isend`` and one ``irecv`` per peer, in one ``batch_isend_irecv``."""
    ops, meta, got = [], [], {}
    for p in peers:
        ops.append(dist.P2POp(dist.isend, torch.tensor([float(10 * rank + p)]), p))
        meta.append(("isend", p))
        got[p] = torch.full((1,), -1.0)
        ops.append(dist.P2POp(dist.irecv, got[p], p))
        meta.append(("irecv", p))
    works = dist.batch_isend_irecv(ops)
    return [(k, p, w) for (k, p), w in zip(meta, works, strict=True)], got


def p2p_dead_peer(rank: int, world: int, port: int) -> None:
    """World 3, all-to-all of ``batch_isend_irecv`` (upstream's P2P fault
    detection); rank 1 leaves and ranks 0 and 2 repeat at once, while rank 1
    still lives for a moment (its readers take in what arrives, but it posts
    no receive): each work with rank 1 fails locally with hint [0,1,0] (a
    message no receive took is not delivered; and the mask already reads
    [1,0,1] when it completes: the synchronized mode applies the view
    first); each work with the other live peer is clean, its result its
    own."""
    assert world == 3
    init(rank, world, port)
    pg = dist.group.WORLD
    works, got = _all_to_all_p2p(rank, [p for p in range(3) if p != rank])
    for kind, p, w in works:
        _wait(w, f"round 1 {kind} {p}")
        assert mpg.get_local_success(w), (kind, p)
        eq(mpg.get_failed_ranks_hint(w), i32(0, 0, 0), f"round 1 {kind} {p} hint")
    for p, t in got.items():
        eq(t, float(10 * p + rank), f"round 1 from {p}")
    dist.barrier()
    if rank == 1:
        # Round 2's messages to this rank arrive while it still runs.
        time.sleep(0.5)
        os._exit(0)
    other = 2 - rank
    works, got = _all_to_all_p2p(rank, [1, other])
    for kind, p, w in works:
        _wait(w, f"round 2 {kind} {p}")
        if p == 1:
            assert not mpg.get_local_success(w), f"{kind} with the dead rank succeeded"
            eq(mpg.get_failed_ranks_hint(w), i32(0, 1, 0), f"{kind} 1 hint")
            eq(mpg.get_active_ranks(pg), i32(1, 0, 1), f"mask when {kind} 1 completed")
        else:
            assert mpg.get_local_success(w), (kind, p)
            eq(mpg.get_failed_ranks_hint(w), i32(0, 0, 0), f"{kind} {p} hint")
    eq(got[other], float(10 * other + rank), "round 2 from the live peer")
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------- send to a departed rank
def send_to_departed(rank: int, world: int, port: int) -> None:
    """World 3; rank 1 exits. An ``isend`` to it posted before anyone
    noticed, and ``dist.isend(t, dst=1).wait()`` after the survivors
    noticed, both end with ``get_local_success(work) == False``: bytes
    handed to a socket or a ring are not a delivery. A replacement then
    takes rank 1 (``is_extension=True``, ``join_group``; the survivors
    activate it) and P2P and collectives with it succeed."""
    assert world == 3
    victim = 1

    def survivors(rank: int, pg: Any) -> None:
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        eq(t, 6.0, "before")
        hub_set(f"pid/{rank}", str(os.getpid()))
        dist.barrier()
        if rank == victim:
            os._exit(0)
        pid = int(hub_get(f"pid/{victim}"))
        wait_until(lambda: _gone(pid), "rank 1's exit", OP_BOUND_S)
        if rank == 0:
            # Posted at once: the peer may not be known dead yet.
            w = dist.isend(torch.ones(1 << 16), victim)
            _wait(w, "isend right after the exit")
            assert not mpg.get_local_success(w), "a send to a dead rank reported success"
            eq(mpg.get_failed_ranks_hint(w), i32(0, 1, 0), "hint of the early send")
        t = torch.tensor([float(rank + 1)])
        w = dist.all_reduce(t, async_op=True)
        _wait(w, "all_reduce that notices")
        eq(t, 4.0, "survivors")
        eq(mpg.get_active_ranks(pg), i32(1, 0, 1), "noticed")
        w = dist.isend(torch.ones(4), dst=victim)
        _wait(w, "isend after noticing")
        assert not mpg.get_local_success(w), "a send to a departed rank reported success"
        eq(mpg.get_failed_ranks_hint(w), i32(0, 1, 0), "hint of the late send")

    rank = _replace_after(rank, victim, port, survivors)
    # The full group again: P2P both ways with the replacement, then a sum.
    if rank == 0:
        got = torch.zeros(3)
        w = dist.isend(torch.tensor([1.0, 2.0, 3.0]), victim)
        _wait(w, "isend to the replacement")
        assert mpg.get_local_success(w), "isend to the replacement"
        dist.recv(got, victim)
        eq(got, torch.tensor([2.0, 3.0, 4.0]), "answer of the replacement")
    elif rank == victim:
        got = torch.zeros(3)
        dist.recv(got, 0)
        w = dist.isend(got + 1, 0)
        _wait(w, "isend from the replacement")
        assert mpg.get_local_success(w)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    eq(t, 6.0, "after the replacement")
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------ all_gather / reduce_scatter recovery
def _gather_scatter_round(rank: int, k: int, what: str) -> None:
    """One ``all_gather_into_tensor`` and one ``reduce_scatter_tensor``,
    sized to the visible size, checked against the active set at the call
    and the op's own hint: slot j of the gather holds x_j for every
    contributor j and zeros otherwise; the scatter sums chunk ``rank`` over
    the contributors (rank q's chunk j is ``x_q * (j + 1)``)."""
    pg = dist.group.WORLD
    n = dist.get_world_size()
    active = mpg.get_active_ranks(pg).clone()
    out = torch.full((n * k,), -1.0)
    w = dist.all_gather_into_tensor(out, torch.full((k,), float(rank + 1)), async_op=True)
    _wait(w, f"{what} all_gather")
    hint = mpg.get_failed_ranks_hint(w)
    exp = torch.cat(
        [torch.full((k,), float(j + 1) if active[j] and not hint[j] else 0.0) for j in range(n)]
    )
    eq(out, exp, f"{what} all_gather (active {active.tolist()}, hint {hint.tolist()})")
    active = mpg.get_active_ranks(pg).clone()
    n = dist.get_world_size()
    inp = torch.cat([torch.full((k,), float((rank + 1) * (j + 1))) for j in range(n)])
    out = torch.full((k,), -1.0)
    w = dist.reduce_scatter_tensor(out, inp, async_op=True)
    _wait(w, f"{what} reduce_scatter")
    hint = mpg.get_failed_ranks_hint(w)
    contrib = [q for q in range(n) if active[q] and not hint[q]]
    eq(
        out,
        float(sum(q + 1 for q in contrib) * (rank + 1)),
        f"{what} reduce_scatter (active {active.tolist()}, hint {hint.tolist()})",
    )


def gather_scatter_recover(rank: int, world: int, port: int) -> None:
    """World 3, a loop of ``all_gather_into_tensor`` and
    ``reduce_scatter_tensor`` (multi-piece messages); rank 1 dies inside
    the reduce_scatter of round 2 (right after its first piece left). The
    survivors finish that op with results matching their hints, loop on
    over {0, 2} (slot 1 zero-filled), then a replacement joins and all
    three loop again. No op waits more than 30 s."""
    from mooncake.pg import _testing

    assert world == 3
    victim, k, rounds = 1, 1 << 16, 4  # 256 KiB per rank and slot: two pieces

    def survivors(rank: int, pg: Any) -> None:
        for i in range(rounds):
            if i == 2 and rank == victim:
                _testing.inject_fault("exit@group=0,point=mid_send,code=0")
            _gather_scatter_round(rank, k, f"round {i}")
            assert rank != victim or i < 2, "the exit rule did not fire"
        eq(mpg.get_active_ranks(pg), i32(1, 0, 1), "after the death")

    rank = _replace_after(rank, victim, port, survivors)
    for i in range(rounds):
        _gather_scatter_round(rank, k, f"full round {i}")
    eq(mpg.get_active_ranks(dist.group.WORLD), i32(1, 1, 1), "full group")
    dist.barrier()
    dist.destroy_process_group()


def _gather_scatter_sized(rank: int, n: int, what: str) -> None:
    """Upstream's all_gather / reduce_scatter round for ``n`` active ranks
    0..n-1: an output (and input) of ``n`` slots; slot j of the gather is
    x_j, and rank r's chunk of the scatter sums slot r of every rank's
    ``[1..n]``."""
    out = torch.full((n,), -1, dtype=torch.int32)
    w = dist.all_gather_into_tensor(out, torch.tensor([rank + 1], dtype=torch.int32), async_op=True)
    _wait(w, f"{what} all_gather")
    eq(out, torch.arange(1, n + 1, dtype=torch.int32), f"{what} all_gather")
    got = torch.full((1,), -1, dtype=torch.int32)
    w = dist.reduce_scatter_tensor(got, torch.arange(1, n + 1, dtype=torch.int32), async_op=True)
    _wait(w, f"{what} reduce_scatter")
    eq(got, torch.tensor([(rank + 1) * n], dtype=torch.int32), f"{what} reduce_scatter")


def gather_scatter_top_exit(rank: int, world: int, port: int) -> None:
    """Upstream's all_gather / reduce_scatter recovery: world 4 (capacity
    4); after a round on 4 ranks rank 3 leaves, and the survivors at once
    run the same ops sized for the 3 active ranks (an output of 3 slots
    while rank 3, still running for a moment, is in their ops' snapshot:
    slots are needed for the ranks active when an op completes, and the op
    that finds rank 3 dead drops it). Then a replacement joins as rank 3,
    every survivor's ``recover_ranks([3])`` applies, and the same ops are
    right at full size."""
    assert world == 4
    victim = 3
    if rank >= 100:
        hub_get("recover")
        init(victim, 4, port, MooncakeBackendOptions(4, True))
        pg = dist.group.WORLD
        mpg.join_group(pg, timeout=OP_BOUND_S)
        _gather_scatter_sized(victim, 4, "replacement, full group")
        eq(mpg.get_active_ranks(pg), i32(1, 1, 1, 1), "replacement's mask")
        dist.barrier()
        return
    init(rank, 4, port, MooncakeBackendOptions(4))
    pg = dist.group.WORLD
    _gather_scatter_sized(rank, 4, "4 ranks")
    dist.barrier()
    if rank == victim:
        # The survivors' next ops start while this process still runs.
        time.sleep(0.3)
        os._exit(0)
    _gather_scatter_sized(rank, 3, "3 survivors")
    wait_until(lambda: mpg.get_active_ranks(pg).tolist() == [1, 1, 1, 0], "rank 3 dropped")
    assert dist.get_world_size() == 3
    if rank == 0:
        hub_set("recover")
    wait_until(lambda: all(mpg.get_peer_state(pg, [victim])), "the replacement", OP_BOUND_S)
    r = mpg.recover_ranks(pg, [victim])
    assert r.status == ProposalStatus.Applied, r
    wait_until(lambda: dist.get_world_size() == 4, "the recovery", OP_BOUND_S)
    _gather_scatter_sized(rank, 4, "survivor, full group")
    dist.barrier()


# -------------------------------------------------- destroy and re-initialise
def reinit_env(rank: int, world: int, port: int) -> None:
    """20 runs of: ``init_process_group("mooncake-cpu")`` through ``env://``
    (``MASTER_ADDR``/``MASTER_PORT``), all_reduce,
    ``destroy_process_group(dist.group.WORLD)``, ``init_process_group``
    again on the same port, all_reduce, destroy: in the same processes,
    with nothing between a destroy and the next init."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    want = float(world * (world + 1) // 2)
    for run in range(20):
        for attempt in ("first", "second"):
            dist.init_process_group("mooncake-cpu", timeout=datetime.timedelta(seconds=60))
            t = torch.tensor([float(rank + 1)])
            dist.all_reduce(t)
            eq(t, want, f"run {run}, {attempt} init")
            dist.destroy_process_group(dist.group.WORLD)
