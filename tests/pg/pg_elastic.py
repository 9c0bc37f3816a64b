"""Elastic-membership scenarios (upstream's dynamic membership: scale-up into
reserved capacity, replacement, scale-down, subgroups, failure-handling
modes), run by ``pg_worker.py`` like ``pg_scenarios``.

Conventions: ``x_r = r + 1``. A step's ``ranks`` may hold ``100 + r`` for a
replacement process that takes over rank ``r`` once the original is gone.
Events between processes go through the harness's hub store, which outlives
every process group. Waits are bounded (a scenario raises instead of hanging).
"""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import mooncake.pg as mpg
import torch
import torch.distributed as dist
from mooncake.pg import MooncakeBackendOptions, ProposalStatus, SyncAfterFailureStatus
from pg_scenarios import _hub, eq, expect, hub_barrier, init


def WORLD() -> Any:
    return dist.group.WORLD


def i32(*xs: int) -> torch.Tensor:
    return torch.tensor(list(xs), dtype=torch.int32)


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Polls ``cond``; raises (instead of hanging) if it never holds."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def hub_key(name: str) -> str:
    return f"{os.environ['MCPG_TEST_STEP']}/{name}"


def hub_set(name: str, value: str = "1") -> None:
    _hub().set(hub_key(name), value)


def hub_get(name: str) -> str:
    hub = _hub()
    hub.wait([hub_key(name)], datetime.timedelta(seconds=120))
    return bytes(hub.get(hub_key(name))).decode()


def all_reduce(x: float, group: Any = None) -> tuple[float, Any]:
    t = torch.tensor([x])
    w = dist.all_reduce(t, group=group, async_op=True)
    w.wait()
    return float(t), w


def activate_once(
    pg: Any,
    rank: int,
    ranks: list[int],
    epoch: int,
    caller: int = 0,
    propose: Callable[[Any, list[int]], Any] = mpg.activate_ranks,
) -> None:
    """Once ``ranks`` are ready here, one healthy rank (``caller``) proposes
    their activation (Applied at ``epoch``); the others wait until that view
    is theirs."""
    wait_until(lambda: all(mpg.get_peer_state(pg, ranks)), f"ranks {ranks} ready", 120)
    if rank == caller:
        r = propose(pg, ranks)
        assert r.status == ProposalStatus.Applied and r.new_epoch == epoch, r
    else:
        wait_until(lambda: mpg.get_current_epoch(pg) == epoch, f"the activation of {ranks}")


def ping_pong(rank: int, first: int, second: int, value: float, what: str) -> None:
    """Rank ``first`` sends ``value`` to rank ``second``, which sends back what
    it got plus one; ``first`` checks the answer (``what`` names the step).
    Other ranks do nothing."""
    if rank == first:
        got = torch.zeros(1)
        dist.send(torch.tensor([value]), second)
        dist.recv(got, second)
        eq(got, value + 1, what)
    elif rank == second:
        got = torch.zeros(1)
        dist.recv(got, first)
        dist.send(got + 1, first)


def check_after_join(rank: int, n: int) -> None:
    """Collectives sized to the new membership of ``n`` ranks (0..n-1)."""
    x = float(rank + 1)
    s, w = all_reduce(x)
    assert s == n * (n + 1) / 2, (s, n)
    assert mpg.get_local_success(w)
    out = torch.zeros(n)
    dist.all_gather_into_tensor(out, torch.tensor([x]))
    eq(out, torch.arange(1, n + 1, dtype=torch.float32), "all_gather after join")
    rs = torch.zeros(1)
    dist.reduce_scatter_tensor(rs, torch.arange(1, n + 1, dtype=torch.float32))
    eq(rs, float((rank + 1) * n), "reduce_scatter after join")
    b = torch.tensor([111.0 if rank == n - 1 else -1.0])
    dist.broadcast(b, src=n - 1)
    eq(b, 111.0, "broadcast from the newest rank")
    dist.barrier()


# ------------------------------------------------------------------ scale-up
def scale_up(rank: int, world: int, port: int) -> None:
    """Planned scale-up 3 -> 4 into reserved capacity (upstream's scale-up):
    the joiner is local-only until ``join_group``, which blocks
    until one healthy rank's ``activate_ranks`` commits; collectives are
    sized to the visible membership before and after; P2P both ways."""
    assert world == 4
    joiner = 3
    if rank != joiner:
        init(rank, 3, port, MooncakeBackendOptions(4))
        pg = WORLD()
        assert dist.get_world_size() == 3
        eq(mpg.get_active_ranks(pg), i32(1, 1, 1, 0), "mask before")
        assert mpg.get_current_epoch(pg) == 0
        s, _ = all_reduce(rank + 1.0)
        assert s == 6.0, s
        out = torch.zeros(3)
        dist.all_gather_into_tensor(out, torch.tensor([rank + 1.0]))
        eq(out, torch.tensor([1.0, 2.0, 3.0]), "3-slot all_gather")
        # The joiner's slot is inactive: P2P to it fails at once, flagged.
        w = dist.isend(torch.ones(1), joiner)
        w.wait()
        assert not mpg.get_local_success(w)
        eq(mpg.get_failed_ranks_hint(w), i32(0, 0, 0, 1), "hint for the inactive slot")
        hub_set(f"primary-ready/{rank}")
        wait_until(lambda: all(mpg.get_peer_state(pg, [joiner])), "the joiner's link")
        if rank == 0:
            r = mpg.activate_ranks(pg, [joiner])
            assert r.status == ProposalStatus.Applied, r
            assert r.new_epoch == 1 and r.dropped_ranks == [] and r.reject_reason == "", r
            # An equivalent second call is safe and changes nothing.
            again = mpg.recover_ranks(pg, [joiner])
            assert again.status == ProposalStatus.Applied and again.new_epoch == 1, again
        else:
            wait_until(lambda: mpg.get_current_epoch(pg) == 1, "the activation")
        assert dist.get_world_size() == 4
        eq(mpg.get_active_ranks(pg), i32(1, 1, 1, 1), "mask after")
        assert mpg.get_num_synced_ranks(pg) == 4
    else:
        for r in range(3):
            hub_get(f"primary-ready/{r}")
        init(rank, 4, port, MooncakeBackendOptions(4, True))
        pg = WORLD()
        assert dist.get_world_size() == 4, "a joiner reports its declared size"
        eq(mpg.get_active_ranks(pg), i32(0, 0, 0, 1), "joiner is local-only")
        s, _ = all_reduce(rank + 1.0)
        assert s == 4.0, f"local-only sum {s}"
        w = dist.isend(torch.ones(1), 0)
        w.wait()
        assert not mpg.get_local_success(w), "P2P before joining must fail"
        mpg.join_group(pg)
        assert mpg.get_current_epoch(pg) == 1
        eq(mpg.get_active_ranks(pg), i32(1, 1, 1, 1), "joiner mask after")
        expect(RuntimeError, lambda: mpg.join_group(pg), "join_group twice")
    check_after_join(rank, 4)
    # P2P in both directions between a primary and the joiner.
    if rank == 2:
        dist.send(torch.full((1000,), 2.0), joiner)
        got = torch.zeros(5)
        dist.recv(got, joiner)
        eq(got, 3.0, "joiner -> primary")
    elif rank == joiner:
        got = torch.zeros(1000)
        dist.recv(got, 2)
        eq(got, 2.0, "primary -> joiner")
        dist.send(torch.full((5,), 3.0), 2)
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- scale-down
def scale_down(rank: int, world: int, port: int) -> None:
    """``deactivate_ranks`` from one rank; the deactivated process stays alive
    and local-only, P2P with it fails, and it can rejoin with ``join_group``.
    Bad inputs: deactivating every rank, ranks outside the capacity."""
    assert world == 4
    init(rank, 4, port, MooncakeBackendOptions(4))
    pg = WORLD()
    s, _ = all_reduce(rank + 1.0)
    assert s == 10.0
    if rank == 0:
        r = mpg.deactivate_ranks(pg, [0, 1, 2, 3])
        assert (
            r.status == ProposalStatus.Rejected and "without an active rank" in r.reject_reason
        ), r
        assert r.new_epoch == 0
        expect(ValueError, lambda: mpg.deactivate_ranks(pg, [7]), "rank outside the capacity")
        expect(TypeError, lambda: mpg.deactivate_ranks(pg, "3"), "ranks as a string")
        r = mpg.deactivate_ranks(pg, [3])
        assert r.status == ProposalStatus.Applied and r.new_epoch == 1, r
    else:
        wait_until(lambda: mpg.get_current_epoch(pg) == 1, "the deactivation")
    if rank == 3:
        eq(mpg.get_active_ranks(pg), i32(0, 0, 0, 1), "deactivated rank is local-only")
        assert dist.get_world_size() == 4
        s, _ = all_reduce(4.0)
        assert s == 4.0, s
        w = dist.isend(torch.ones(1), 0)
        w.wait()
        assert not mpg.get_local_success(w)
        hub_set("deactivated-checked")
        mpg.join_group(pg)
    else:
        eq(mpg.get_active_ranks(pg), i32(1, 1, 1, 0), "mask after deactivation")
        assert dist.get_world_size() == 3
        s, w = all_reduce(rank + 1.0)
        assert s == 6.0 and mpg.get_local_success(w), s
        out = torch.zeros(3)
        dist.all_gather_into_tensor(out, torch.tensor([rank + 1.0]))
        eq(out, torch.tensor([1.0, 2.0, 3.0]), "all_gather over three")
        w = dist.irecv(torch.ones(1), 3)
        w.wait()
        assert not mpg.get_local_success(w), "P2P with a deactivated rank fails"
        eq(mpg.get_failed_ranks_hint(w), i32(0, 0, 0, 1), "hint")
        if rank == 0:
            again = mpg.deactivate_ranks(pg, [3])
            assert again.status == ProposalStatus.Applied and again.new_epoch == 1, again
            hub_get("deactivated-checked")
        activate_once(pg, rank, [3], epoch=2)
    assert mpg.get_current_epoch(pg) == 2
    check_after_join(rank, 4)
    dist.destroy_process_group()


# -------------------------------------------------------------- replacement
def replace(rank: int, world: int, port: int) -> None:
    """A rank is SIGKILLed; survivors continue at once (detected from its
    closed connection, not a timeout: T is 10 minutes here); a new process
    takes its rank with ``is_extension=True`` and joins; P2P ping-pong with
    it before and after."""
    assert world == 4
    victim = 1
    if rank >= 100:
        assert rank - 100 == victim
        hub_get("killed")
        t0 = time.monotonic()
        init(victim, 4, port, MooncakeBackendOptions(4, True))
        pg = WORLD()
        eq(mpg.get_active_ranks(pg), i32(0, 1, 0, 0), "replacement is local-only")
        mpg.join_group(pg)
        s, _ = all_reduce(victim + 1.0)
        print(f"join latency (init to first all_reduce): {time.monotonic() - t0:.3f}s", flush=True)
        assert s == 10.0, s
        rank = victim
    else:
        # Silence timeout and reconciliation window both 10 minutes: the
        # survivors can only go on at once if the kill is seen from the closed
        # connections and the coordinator decides as soon as every survivor
        # has reported the same dead rank (upstream waits out the window).
        mpg.set_collective_timeout_us(600_000_000)
        mpg.set_p2p_timeout_us(600_000_000)
        mpg.set_fault_reconciliation_window_us(600_000_000)
        init(rank, 4, port, MooncakeBackendOptions(4))
        pg = WORLD()
        s, _ = all_reduce(rank + 1.0)
        assert s == 10.0
        ping_pong(rank, 0, victim, 1.0, "ping-pong before")
        dist.barrier()
        if rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        t_kill = time.monotonic()
        s, w = all_reduce(rank + 1.0)
        expect_sum = sum(r + 1 for r in range(4) if r != victim)
        assert s == expect_sum, s
        # Not a speed target: a tenth of the 600 s timeout/window, so only a
        # decision that waited for neither gets here.
        assert time.monotonic() - t_kill < 60, "survivors waited out a timeout or window"
        if not mpg.get_local_success(w):
            eq(mpg.get_failed_ranks_hint(w), i32(0, 1, 0, 0), "hint")
        eq(mpg.get_active_ranks(pg), i32(1, 0, 1, 1), "victim cleared before wait() returned")
        assert mpg.get_current_epoch(pg) == 1
        assert dist.get_world_size() == 4
        s, w = all_reduce(rank + 1.0)
        assert s == expect_sum and mpg.get_local_success(w), s
        if rank == 0:
            w = dist.isend(torch.ones(1), victim)
            w.wait()
            assert not mpg.get_local_success(w), "isend to the dead rank"
            hub_set("killed")
        activate_once(pg, rank, [victim], epoch=2)
        s, _ = all_reduce(rank + 1.0)
        assert s == 10.0, s
    ping_pong(rank, 0, victim, 5.0, "ping-pong after replacement")
    check_after_join(rank, 4)
    dist.destroy_process_group()


# ------------------------------------------------------------- subgroups
def subgroups_ext(rank: int, world: int, port: int) -> None:
    """Spec F4 / upstream's split-ranks pattern: primaries {0,1}, joiners
    {2,3}; subgroups created in one order, with current membership on the
    primaries and eventual membership on the joiners."""
    assert world == 4
    primary = rank < 2
    opts = MooncakeBackendOptions
    if primary:
        init(rank, 2, port, opts(i32(1, 1, 0, 0), False, 4))
        a = dist.new_group([0], backend="mooncake-cpu", pg_options=opts(i32(1, 0), False, 2))
        b = dist.new_group([1], backend="mooncake-cpu", pg_options=opts(i32(1, 0), False, 2))
        c = dist.new_group([0, 1], backend="mooncake-cpu", pg_options=opts(4))
        s, _ = all_reduce(rank + 1.0)
        assert s == 3.0
        s, _ = all_reduce(rank + 1.0, c)
        assert s == 3.0
        hub_set(f"primary/{rank}")
        world_pg = WORLD()
        wait_until(lambda: all(mpg.get_peer_state(world_pg, [2, 3])), "WORLD joiners")
        mpg.recover_ranks(world_pg, [2, 3])  # every primary calls it, in order
        mine = a if rank == 0 else b
        wait_until(lambda: mpg.get_peer_state(mine, [1])[0], "subgroup joiner")
        r = mpg.activate_ranks(mine, [1])
        assert r.status == ProposalStatus.Applied, r
        wait_until(lambda: all(mpg.get_peer_state(c, [2, 3])), "c joiners")
        r = mpg.recover_ranks(c, [2, 3])
        assert r.status == ProposalStatus.Applied, r
    else:
        hub_get("primary/0")
        hub_get("primary/1")
        init(rank, 4, port, opts(i32(0, 0, 0, 0), True, 4))
        a = dist.new_group([0, 2], backend="mooncake-cpu", pg_options=opts(i32(0, 0), True, 2))
        b = dist.new_group([1, 3], backend="mooncake-cpu", pg_options=opts(i32(0, 0), True, 2))
        c = dist.new_group([0, 1, 2, 3], backend="mooncake-cpu", pg_options=opts(4, True))
        s, _ = all_reduce(rank + 1.0)
        assert s == rank + 1.0, "joiners are local-only"
        mpg.join_group(WORLD())
        mpg.join_group(a if rank == 2 else b)
        mpg.join_group(c)
    s, _ = all_reduce(rank + 1.0)
    assert s == 10.0, s
    if rank in (0, 2):
        s, _ = all_reduce(rank + 1.0, a)
        assert s == 4.0, s
    else:
        s, _ = all_reduce(rank + 1.0, b)
        assert s == 6.0, s
    s, _ = all_reduce(rank + 1.0, c)
    assert s == 10.0, s
    # P2P inside c between a primary and a joiner (group ranks).
    if rank == 1:
        dist.send(torch.tensor([7.0]), group_dst=3, group=c)
    elif rank == 3:
        got = torch.zeros(1)
        dist.recv(got, group_src=1, group=c)
        eq(got, 7.0, "P2P in a subgroup after extension")
    for g in (c, b, a):
        if g is not None and g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)
    dist.destroy_process_group()


# ------------------------------------------------------- failure-handling modes
def failure_modes(rank: int, world: int, port: int) -> None:
    """Upstream's three failure-handling modes, one SIGKILL observed by three
    groups: WORLD (PG-managed, synchronized: the mask is updated before the
    failed op's wait() returns), ``deferred`` (PG-managed, deferred: the op
    returns its hint; ``sync_after_failure`` applies the coordinator's view)
    and ``manual`` (framework-managed: only hints; ``deactivate_ranks``
    evicts). ``local_success``/``failed_ranks_hint`` on collective and P2P
    Works."""
    assert world == 4
    victim = 3
    mpg.set_collective_timeout_us(600_000_000)
    mpg.set_p2p_timeout_us(600_000_000)
    mpg.set_fault_reconciliation_window_us(600_000_000)
    init(rank, 4, port)  # default options: synchronized mode
    deferred = dist.new_group(
        [0, 1, 2, 3],
        backend="mooncake-cpu",
        pg_options=MooncakeBackendOptions(4, False, True, False),
    )
    manual = dist.new_group(
        [0, 1, 2, 3],
        backend="mooncake-cpu",
        pg_options=MooncakeBackendOptions(4, False, False, False),
    )
    for g in (None, deferred, manual):
        s, w = all_reduce(rank + 1.0, g)
        assert s == 10.0 and mpg.get_local_success(w)
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    survivors = 1 + 2 + 3
    dead = i32(0, 0, 0, 1)
    # Synchronized: the failed op completes after the view is applied.
    t_kill = time.monotonic()
    s, w = all_reduce(rank + 1.0)
    assert s == survivors
    # Timeout and window are 600 s: the view came from the closed
    # connections and the survivors' unanimous reports, not from waiting.
    assert time.monotonic() - t_kill < 60, "the view waited out a timeout or window"
    if not mpg.get_local_success(w):
        eq(mpg.get_failed_ranks_hint(w), dead, "sync hint")
    eq(mpg.get_active_ranks(WORLD()), 1 - dead, "sync mode: mask before wait() returned")
    assert mpg.get_current_epoch(WORLD()) == 1 and dist.get_world_size() == 3
    # Deferred: same data-plane result, without waiting for reconciliation;
    # the view is applied by the time sync_after_failure returns.
    s, w = all_reduce(rank + 1.0, deferred)
    assert s == survivors
    if not mpg.get_local_success(w):
        eq(mpg.get_failed_ranks_hint(w), dead, "deferred hint")
    r = mpg.sync_after_failure(deferred)
    assert r.status in (SyncAfterFailureStatus.Reconciled, SyncAfterFailureStatus.NoPending), r
    eq(mpg.get_active_ranks(deferred), 1 - dead, "deferred mask after sync")
    assert mpg.get_current_epoch(deferred) == 1
    s, w = all_reduce(rank + 1.0, deferred)
    assert s == survivors and mpg.get_local_success(w)
    # Framework-managed: hints only, every time, until the framework evicts.
    for _ in range(2):
        s, w = all_reduce(rank + 1.0, manual)
        assert s == survivors
        eq(mpg.get_failed_ranks_hint(w), dead, "manual hint")
        r = mpg.sync_after_failure(manual)
        assert r.status != SyncAfterFailureStatus.Rejected, r
        eq(mpg.get_active_ranks(manual), i32(1, 1, 1, 1), "manual mask unchanged")
        assert mpg.get_current_epoch(manual) == 0 and dist.get_world_size(manual) == 4
    if rank == 0:
        w = dist.isend(torch.ones(1), victim, group=manual)
        w.wait()
        assert not mpg.get_local_success(w)
        eq(mpg.get_failed_ranks_hint(w), dead, "manual P2P hint")
    hub_barrier("manual-checked", rank, 3)
    if rank == 1:
        r = mpg.deactivate_ranks(manual, [victim])
        assert r.status == ProposalStatus.Applied and r.new_epoch == 1, r
    else:
        wait_until(lambda: mpg.get_current_epoch(manual) == 1, "the eviction")
    eq(mpg.get_active_ranks(manual), 1 - dead, "manual mask after deactivate_ranks")
    s, w = all_reduce(rank + 1.0, manual)
    assert s == survivors and mpg.get_local_success(w)
    r = mpg.sync_after_failure(WORLD())
    assert r.status == SyncAfterFailureStatus.NoPending, r
    # Rank 0 hosts the coordinator: nobody tears down before every survivor
    # is done asking it.
    hub_barrier("synced", rank, 3)
    dist.destroy_process_group(manual)
    dist.destroy_process_group(deferred)
    dist.destroy_process_group()


# ------------------------------------------------------------- SIGSTOP
def sigstop(rank: int, world: int, port: int) -> None:
    """A rank frozen with SIGSTOP (its connections stay open) is detected by
    silence within the configured timeout and excluded by every survivor."""
    assert world == 3
    frozen = 2
    init(rank, 3, port)
    hub_set(f"pid/{rank}", str(os.getpid()))
    s, _ = all_reduce(rank + 1.0)
    assert s == 6.0
    dist.barrier()
    if rank == frozen:
        hub_get("never")  # blocks until the harness kills this process
    if rank == 0:
        os.kill(int(hub_get(f"pid/{frozen}")), signal.SIGSTOP)
    t0 = time.monotonic()
    # The frozen rank never enters this op (its main thread waits on the hub).
    s, w = all_reduce(rank + 1.0)
    assert s == 3.0, s
    # T = 2 s here and the reconciliation window is the default 30 s: the two
    # survivors' reports agree, so the view must not wait for the window.
    assert time.monotonic() - t0 < 20, "the frozen rank was not excluded within 2T + the decision"
    s, w = all_reduce(rank + 1.0)
    assert s == 3.0 and mpg.get_local_success(w), s
    eq(mpg.get_active_ranks(WORLD()), i32(1, 1, 0), "frozen rank excluded")
    assert dist.get_world_size() == 2
    dist.destroy_process_group()


# ------------------------------------------------------------- bad input
def elastic_bad_input(rank: int, world: int, port: int) -> None:
    """Each elastic misuse fails with a clear error or a Rejected response,
    without hanging: join_group on an active rank; activating a rank that
    never registered; joining beyond capacity; join_group with nobody
    activating (TimeoutError); a subgroup created with a different shape on
    different ranks; a collective racing a membership change."""
    assert world == 4
    if rank == 3:
        hub_get("ready")
        # Joining beyond the group's capacity (3): refused at init.
        msg = expect(
            Exception,
            lambda: init(3, 4, port, MooncakeBackendOptions(4, True)),
            "joining beyond capacity",
        )
        assert "beyond the capacity" in msg, msg
        hub_set("beyond-done")
        # A later joiner at slot 2... is not possible either (slot 2 is active).
        return
    init(rank, 3, port, MooncakeBackendOptions(3))
    pg = WORLD()
    msg = expect(RuntimeError, lambda: mpg.join_group(pg), "join_group on an active rank")
    assert "already an active member" in msg, msg
    if rank == 0:
        hub_set("ready")
        hub_get("beyond-done")
    dist.barrier()
    # Activating a rank that is already active is a no-op (Applied); a rank
    # that never registered is Rejected with a reason (below, after extend).
    r = mpg.activate_ranks(pg, [2]) if rank == 1 else None
    if r is not None:
        assert r.status == ProposalStatus.Applied, "already-active ranks are a no-op"
    # (Capacity 3: slot 3 does not exist.)
    expect(ValueError, lambda: mpg.activate_ranks(pg, [3]), "rank beyond capacity")
    expect(ValueError, lambda: mpg.get_peer_state(pg, [5]), "peer state beyond capacity")
    expect(ValueError, lambda: mpg.extend_group_size_to(pg, 2), "shrinking capacity")
    expect(ValueError, lambda: mpg.extend_group_size_to(pg, 65), "capacity above 64")
    mpg.extend_group_size_to(pg, 3)  # same size: no-op
    # Raise capacity locally: V and the mask are unchanged.
    mpg.extend_group_size_to(pg, 4)
    eq(mpg.get_active_ranks(pg), i32(1, 1, 1, 0), "mask after extend")
    assert dist.get_world_size() == 3
    r = mpg.activate_ranks(pg, [3])
    assert r.status == ProposalStatus.Rejected and "no registered process" in r.reject_reason, r
    assert r.new_epoch == 0
    # A subgroup whose shape differs between ranks: a clear error on every
    # rank within the timeout, no hang.
    ranks = [0, 1] if rank == 0 else [0, 1, 2]
    msg = expect(
        Exception,
        lambda: dist.new_group(
            ranks, backend="mooncake-cpu", timeout=datetime.timedelta(seconds=5)
        ),
        "mismatched subgroup",
    )
    assert "disagree" in msg or "timed out" in msg, msg
    hub_barrier("after-mismatch", rank, 3)
    # A collective racing a membership change: async ops issued before the
    # proposal run under the old view; the proposal waits for its target.
    works = []
    for i in range(4):
        t = torch.tensor([rank + 1.0 + i])
        works.append((t, i, dist.all_reduce(t, async_op=True)))
    if rank == 2:
        r = mpg.deactivate_ranks(pg, [2])
        assert r.status == ProposalStatus.Applied, r
    for t, i, w in works:
        w.wait()
        assert float(t) == 6.0 + 3 * i, (float(t), i)
    wait_until(lambda: mpg.get_current_epoch(pg) == 1, "deactivation")
    if rank == 2:
        # join_group with nobody activating: TimeoutError, bounded.
        t0 = time.monotonic()
        expect(TimeoutError, lambda: mpg.join_group(pg, timeout=2), "join_group timeout")
        assert time.monotonic() - t0 < 15, "join_group(timeout=2) overran its timeout"
        hub_set("join-timed-out")
        s, _ = all_reduce(3.0)
        assert s == 3.0
    else:
        hub_get("join-timed-out")
        s, _ = all_reduce(rank + 1.0)
        assert s == 3.0, s
        # Rank 2 is alive but did not call join_group: activation waits for it
        # up to the admission timeout (2 s here), then gives up.
        if rank == 0:
            r = mpg.activate_ranks(pg, [2])
            assert r.status == ProposalStatus.Rejected and "join_group" in r.reject_reason, r
    hub_barrier("end", rank, 3)
    dist.destroy_process_group()


def racing_threads(rank: int, world: int, port: int) -> None:
    """Collectives issued from the main thread while another thread on rank 0
    deactivates rank 2: every op runs under exactly one view on every rank
    (per-op results agree across ranks), and nothing hangs."""
    assert world == 3
    init(rank, 3, port, MooncakeBackendOptions(3))
    pg = WORLD()
    results: list[float] = []

    def churn() -> None:
        r = mpg.deactivate_ranks(pg, [2])
        assert r.status == ProposalStatus.Applied, r

    th = threading.Thread(target=churn) if rank == 0 else None
    for i in range(30):
        if th is not None and i == 5:
            th.start()
        s, _ = all_reduce(rank + 1.0)
        results.append(s)
    if th is not None:
        th.join()
    wait_until(lambda: mpg.get_current_epoch(pg) == 1, "the deactivation")
    _hub().set(hub_key(f"results/{rank}"), ",".join(str(x) for x in results))
    # Before the switch all three sum to 6; after it ranks 0 and 1 sum to 3
    # and rank 2 (local-only) gets its own 3: the lists agree op by op.
    for other in range(3):
        theirs = [float(x) for x in hub_get(f"results/{other}").split(",")]
        assert results == theirs, (rank, other, results, theirs)
    k = results.index(3.0) if 3.0 in results else len(results)
    assert all(x == 6.0 for x in results[:k]) and all(x == 3.0 for x in results[k:]), results
    hub_barrier("end", rank, 3)
    dist.destroy_process_group()


# ------------------------------------------------- extend, then a join (F6)
def extend_join(rank: int, world: int, port: int) -> None:
    """Spec F6 end to end: a group founded with no reserved capacity raises
    it with ``extend_group_size_to(4)`` (mask [1,1,1,0], V = 3), a fourth
    process registers as an extension into the new slot and joins: V = 4,
    SUM 10, and every collective is sized to four."""
    assert world == 4
    joiner = 3
    if rank != joiner:
        init(rank, 3, port)  # no options: capacity = world size
        pg = WORLD()
        s, _ = all_reduce(rank + 1.0)
        assert s == 6.0, s
        mpg.extend_group_size_to(pg, 4)
        eq(mpg.get_active_ranks(pg), i32(1, 1, 1, 0), "mask after extend")
        assert dist.get_world_size() == 3 and mpg.get_current_epoch(pg) == 0
        s, _ = all_reduce(rank + 1.0)
        assert s == 6.0, s
        hub_barrier("extended", rank, 3)
        if rank == 0:
            hub_set("extended")
        activate_once(pg, rank, [joiner], epoch=1, caller=1)
        eq(mpg.get_active_ranks(pg), i32(1, 1, 1, 1), "mask after the join")
    else:
        hub_get("extended")
        init(rank, 4, port, MooncakeBackendOptions(4, True))
        pg = WORLD()
        eq(mpg.get_active_ranks(pg), i32(0, 0, 0, 1), "the joiner is local-only")
        mpg.join_group(pg)
        assert mpg.get_current_epoch(pg) == 1
    assert dist.get_world_size() == 4
    check_after_join(rank, 4)
    dist.destroy_process_group()


# ---------------------------------- recovery after a subgroup was destroyed
def replace_after_destroy(rank: int, world: int, port: int) -> None:
    """Recovery after ``destroy_process_group`` of subgroups (a
    replacement replays the full ``new_group`` sequence, including groups
    that were later destroyed). Group ``g1`` (all three) is destroyed before
    the failure; ``g2`` = {1, 2} is live when rank 2 is SIGKILLed and the
    survivors destroy it after the failure. The replacement creates and
    destroys both in the same order, joins WORLD, and a new subgroup made
    by all three afterwards holds the replacement."""
    assert world == 3
    victim = 2
    opts = MooncakeBackendOptions
    if rank >= 100:
        assert rank - 100 == victim
        hub_get("killed")
        init(victim, 3, port, opts(3, True))
        for ranks in ([0, 1, 2], [1, 2]):  # the same order, destroyed groups too
            g = dist.new_group(ranks, backend="mooncake-cpu", pg_options=opts(len(ranks), True))
            dist.destroy_process_group(g)
        mpg.join_group(WORLD())
        rank = victim
    else:
        init(rank, 3, port, opts(3))
        g1 = dist.new_group([0, 1, 2], backend="mooncake-cpu", pg_options=opts(3))
        s, _ = all_reduce(rank + 1.0, g1)
        assert s == 6.0, s
        dist.destroy_process_group(g1)
        g2 = dist.new_group([1, 2], backend="mooncake-cpu", pg_options=opts(2))
        if rank in (1, 2):
            s, _ = all_reduce(rank + 1.0, g2)
            assert s == 5.0, s
        dist.barrier()
        if rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        pg = WORLD()
        s, _ = all_reduce(rank + 1.0)
        assert s == 3.0, s
        eq(mpg.get_active_ranks(pg), i32(1, 1, 0), "mask after the failure")
        if rank == 1:
            s, _ = all_reduce(rank + 1.0, g2)
            assert s == 2.0, s
        dist.destroy_process_group(g2)
        hub_barrier("destroyed", rank, 2)
        if rank == 0:
            hub_set("killed")
        activate_once(pg, rank, [victim], epoch=2, propose=mpg.recover_ranks)
    s, _ = all_reduce(rank + 1.0)
    assert s == 6.0, s
    g3 = dist.new_group([1, 2], backend="mooncake-cpu")
    if rank in (1, 2):
        s, w = all_reduce(rank + 1.0, g3)
        assert s == 5.0 and mpg.get_local_success(w), s
    check_after_join(rank, 3)
    if rank in (1, 2):
        dist.destroy_process_group(g3)
    dist.destroy_process_group()


# ------------------------------------------------- the coordinator's process
def coordinator_lost(rank: int, world: int, port: int) -> None:
    """Rank 0, whose process hosts the membership coordinator (and here the
    step's store), is SIGKILLed. The survivors drop it from their own view
    and keep running collectives and P2P among themselves; membership
    proposals and ``sync_after_failure`` are refused at once with a reason
    (no hang), since there is nobody left to order a new view."""
    assert world == 3
    init(rank, 3, port)
    pg = WORLD()
    s, _ = all_reduce(rank + 1.0)
    assert s == 6.0, s
    dist.barrier()
    if rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    s, w = all_reduce(rank + 1.0)
    assert s == 5.0, s
    if not mpg.get_local_success(w):
        eq(mpg.get_failed_ranks_hint(w), i32(1, 0, 0), "hint names the coordinator's rank")
    eq(mpg.get_active_ranks(pg), i32(0, 1, 1), "rank 0 fenced")
    # No view can commit without the coordinator: the exclusion is each
    # survivor's own fence, the epoch and the visible size stay.
    assert mpg.get_current_epoch(pg) == 0 and dist.get_world_size() == 3
    s, w = all_reduce(rank + 1.0)
    assert s == 5.0 and mpg.get_local_success(w), s
    for propose in (mpg.activate_ranks, mpg.deactivate_ranks):
        r = propose(pg, [0])
        assert r.status == ProposalStatus.Rejected, r
        assert "no membership coordinator is reachable" in r.reject_reason, r
        assert r.new_epoch == mpg.get_current_epoch(pg), r
    r = mpg.sync_after_failure(pg)
    assert r.status == SyncAfterFailureStatus.Rejected, r
    assert "coordinator" in r.reject_reason, r
    assert mpg.get_peer_state(pg, [0]) == [False]
    peer = 3 - rank
    got = torch.zeros(3)
    if rank == 1:
        dist.send(torch.full((3,), 1.5), peer)
        dist.recv(got, peer)
        eq(got, 2.5, "P2P among the survivors")
    else:
        dist.recv(got, peer)
        dist.send(got + 1, peer)
    s, w = all_reduce(rank + 1.0)
    assert s == 5.0 and mpg.get_local_success(w), s
    dist.destroy_process_group()


# ------------------------------------------- a partly admitted activation
def partial_activation(rank: int, world: int, port: int) -> None:
    """``activate_ranks([2, 3])`` while only rank 2 has called ``join_group``:
    after the admission timeout (2 s here) rank 2 is activated and rank 3 is
    reported in ``dropped_ranks`` with ``AppliedWithDroppedRanks``; rank 3
    stays a local-only extension and a later ``activate_ranks([3])``, once
    it joins, is ``Applied``."""
    assert world == 4
    if rank < 2:
        init(rank, 2, port, MooncakeBackendOptions(4))
        pg = WORLD()
        hub_set(f"primary/{rank}")
        hub_get("joined/2")
        # Rank 3 must be registered (its init returned) before the proposal:
        # a rank with no registered process is Rejected, not dropped.
        hub_get("registered/3")
        # Readiness is local: rank 2 links to us in join_group; rank 3, which
        # has not called it, is registered but not ready.
        wait_until(lambda: mpg.get_peer_state(pg, [2])[0], "rank 2 ready")
        if rank == 0:
            r = mpg.activate_ranks(pg, [2, 3])
            assert r.status == ProposalStatus.AppliedWithDroppedRanks, r
            assert r.new_epoch == 1 and r.dropped_ranks == [3], r
        else:
            wait_until(lambda: mpg.get_current_epoch(pg) == 1, "the partial activation")
        eq(mpg.get_active_ranks(pg), i32(1, 1, 1, 0), "rank 2 in, rank 3 dropped")
        assert dist.get_world_size() == 3
    else:
        hub_get("primary/0")
        hub_get("primary/1")
        init(rank, 4, port, MooncakeBackendOptions(4, True))
        pg = WORLD()
        if rank == 3:
            hub_set("registered/3")
        if rank == 2:
            hub_set("joined/2")  # just before it blocks in join_group
            mpg.join_group(pg)
            eq(mpg.get_active_ranks(pg), i32(1, 1, 1, 0), "the joiner's view")
    if rank < 3:
        s, _ = all_reduce(rank + 1.0)
        assert s == 6.0, s
        hub_barrier("three", rank, 3)
        if rank == 0:
            hub_set("three")
    if rank == 3:
        hub_get("three")
        eq(mpg.get_active_ranks(pg), i32(0, 0, 0, 1), "the dropped joiner is still local-only")
        s, _ = all_reduce(4.0)
        assert s == 4.0, s
        hub_set("joining/3")
        mpg.join_group(pg)
    else:
        if rank == 0:
            hub_get("joining/3")
        activate_once(pg, rank, [3], epoch=2)
    assert mpg.get_current_epoch(pg) == 2
    check_after_join(rank, 4)
    dist.destroy_process_group()
