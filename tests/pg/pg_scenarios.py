"""Multi-process scenarios; each function runs in every rank process.

Conventions: ``x_r = r + 1``; a scenario raises (non-zero exit) on any wrong
value. Functions take ``(rank, world, port)``.
"""

from __future__ import annotations

import datetime
import math
import os
import threading
import time

import mooncake.pg as mpg
import torch
import torch.distributed as dist
from mooncake.pg import MooncakeBackendOptions

REDUCIBLE = [
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
] + [getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)]
FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}


def _hub() -> dist.TCPStore:
    return dist.TCPStore(
        "127.0.0.1",
        int(os.environ["MCPG_TEST_HUB_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=120),
    )


_INIT_COUNT: dict[str, int] = {}
# Stores rank 0 hosts, alive until the step ends (a failed init must not
# take the store away from ranks still dialing it).
STEP_STORES: list[dist.TCPStore] = []


def _step_store(rank: int, world: int, timeout: float) -> dist.TCPStore:
    """A fresh store for one init: rank 0 hosts it on a free port and
    publishes the port through the harness's hub once it listens, so no rank
    ever dials a store that is not up yet (or one that is going away)."""
    step = os.environ["MCPG_TEST_STEP"]
    n = _INIT_COUNT[step] = _INIT_COUNT.get(step, -1) + 1
    key = f"{step}/store/{n}"
    hub = _hub()
    # The store's own timeout (connecting to it, its waits) is not the
    # group's: a short init timeout under test must not make a loaded
    # machine's store connect fail on one rank and not the other (the ranks
    # then disagree on how far the failed init got).
    td = datetime.timedelta(seconds=max(timeout, 60.0))
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world, True, td, wait_for_workers=False)
        hub.set(key, str(store.port))
        STEP_STORES.append(store)
        return store
    return dist.TCPStore("127.0.0.1", int(hub.get(key)), world, False, td)


def init(
    rank: int,
    world: int,
    port: int,
    options: object = None,
    backend: str = "mooncake-cpu",
    timeout: float = 60.0,
    url: bool = False,
    **kw: object,
) -> None:
    """``init_process_group``; through ``tcp://127.0.0.1:port`` when ``url``
    (or outside the harness), else through a fresh store per init."""
    where: dict[str, object] = {"init_method": f"tcp://127.0.0.1:{port}"}
    if not url and "MCPG_TEST_HUB_PORT" in os.environ:
        where = {"store": _step_store(rank, world, timeout)}
    dist.init_process_group(
        backend,
        rank=rank,
        world_size=world,
        pg_options=options,
        timeout=datetime.timedelta(seconds=timeout),
        **where,  # type: ignore[arg-type]
        **kw,
    )


def hub_barrier(key: str, rank: int, world: int) -> None:
    """Waits until every rank reached this point, through the harness's hub
    store (which outlives every process group)."""
    hub = _hub()
    base = f"{os.environ['MCPG_TEST_STEP']}/{key}"
    hub.set(f"{base}/{rank}", "1")
    hub.wait([f"{base}/{r}" for r in range(world)])


def eq(got: torch.Tensor, exp: torch.Tensor | float, what: str) -> None:
    e = exp if isinstance(exp, torch.Tensor) else torch.full_like(got, exp)
    if got.shape != e.shape or not torch.equal(got, e.to(got.dtype)):
        raise AssertionError(
            f"{what}: got {got.flatten()[:8].tolist()} expected {e.flatten()[:8].tolist()}"
        )


def check_transport(world: int) -> None:
    pg = dist.group.WORLD
    want = 0 if os.environ.get("MOONCAKE_PG_TRANSPORT") == "tcp" else world - 1
    assert pg.shm_peer_count() == want, (pg.shm_peer_count(), want)


def shapes(numel: int) -> list[tuple[str, torch.Tensor]]:
    """A contiguous tensor and a transposed (non-contiguous) view of the same size."""
    base = torch.zeros(numel)
    out = [("contig", base)]
    if numel > 1 and numel % 3 == 0:
        out.append(("transposed", torch.zeros(3, numel // 3).t()))
    elif numel > 1:
        out.append(("strided", torch.zeros(numel * 2)[::2]))
    return out


# --------------------------------------------------------------------------- B
def _all_reduce_checks(rank: int, n: int) -> None:
    """``all_reduce`` over every reducible dtype and op, sizes, layouts, bool and
    determinism (B1)."""
    x = rank + 1
    for dt in REDUCIBLE:
        for numel in (1, 1023):
            ops = [
                (dist.ReduceOp.SUM, n * (n + 1) // 2),
                (dist.ReduceOp.PRODUCT, math.factorial(n)),
                (dist.ReduceOp.MIN, 1),
                (dist.ReduceOp.MAX, n),
            ]
            if dt in FLOATS:
                ops.append((dist.ReduceOp.AVG, (n + 1) / 2))
            for op, exp in ops:
                t = torch.full((numel,), x, dtype=dt)
                dist.all_reduce(t, op=op)
                eq(t, torch.full((numel,), exp, dtype=dt), f"all_reduce {dt} {op} {numel}")
    for numel in (1, 1023, 1 << 20):
        for name, z in shapes(numel):
            t = z.fill_(x)
            dist.all_reduce(t)
            eq(t, float(n * (n + 1) // 2), f"all_reduce f32 {name} {numel}")
            t = torch.full((numel,), x, dtype=torch.bfloat16)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            eq(t, torch.full((numel,), (n + 1) / 2, dtype=torch.bfloat16), "bf16 avg")
    big = torch.arange(1 << 20, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(big)
    eq(big, torch.arange(1 << 20, dtype=torch.float64) * (n * (n + 1) // 2), "big f64 distinct")
    # 32 MiB: every per-peer message is at least 8 MiB up to world 4, the size
    # from which ring pushes and receive copies use streaming stores.
    huge = torch.arange(4 << 20, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(huge)
    eq(huge, torch.arange(4 << 20, dtype=torch.float64) * (n * (n + 1) // 2), "32 MiB f64")
    huge = torch.arange(4 << 20, dtype=torch.float64) + (0 if rank == n - 1 else 7)
    dist.broadcast(huge, src=n - 1)
    eq(huge, torch.arange(4 << 20, dtype=torch.float64), "32 MiB broadcast")
    for op, exp in (
        (dist.ReduceOp.SUM, True),
        (dist.ReduceOp.MAX, True),
        (dist.ReduceOp.PRODUCT, rank == 0 and n == 1),
        (dist.ReduceOp.MIN, n == 1),
    ):
        t = torch.tensor([rank == 0, True, False])
        dist.all_reduce(t, op=op)
        want = torch.tensor(
            [exp if op in (dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN) else True, True, False]
        )
        if op in (dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN):
            want[0] = n == 1
        eq(t, want, f"bool {op}")

    # Determinism: rank-order accumulation (f32), f32 accumulation rounded once (bf16).
    for numel in (1023, 1 << 20):
        gen = torch.Generator().manual_seed(1234 + numel)
        xs = [torch.randn(numel, generator=gen) for _ in range(n)]
        exp = xs[0].clone()
        for j in range(1, n):
            exp += xs[j]
        t = xs[rank].clone()
        dist.all_reduce(t)
        assert torch.equal(t, exp), f"f32 sum is not the rank-order sum ({numel})"
        xb = [x.bfloat16() for x in xs]
        acc = xb[0].float()
        for j in range(1, n):
            acc += xb[j].float()
        tb = xb[rank].clone()
        dist.all_reduce(tb)
        assert torch.equal(tb, acc.bfloat16()), f"bf16 sum is not rounded once ({numel})"


def _broadcast_checks(rank: int, n: int) -> None:
    """``broadcast`` from every root, several sizes and layouts (B2)."""
    for root in range(n):
        for numel in (1, 1023, 1 << 20):
            for name, z in shapes(numel):
                t = z.fill_(111.0 if rank == root else -1.0)
                dist.broadcast(t, src=root)
                eq(t, 111.0, f"broadcast root {root} {name} {numel}")
        c = torch.full((5,), complex(rank, 1), dtype=torch.complex64)
        dist.broadcast(c, src=root)
        eq(c, torch.full((5,), complex(root, 1), dtype=torch.complex64), "broadcast complex")


def _all_gather_checks(rank: int, n: int) -> None:
    """``all_gather`` list and tensor forms (B3)."""
    for numel in (1, 1023):
        inp = torch.tensor([rank, 10 * rank], dtype=torch.float32).repeat(numel)
        outs = [torch.zeros_like(inp) for _ in range(n)]
        dist.all_gather(outs, inp)
        for j in range(n):
            eq(
                outs[j],
                torch.tensor([j, 10 * j], dtype=torch.float32).repeat(numel),
                "all_gather list",
            )
        out = torch.zeros(n * inp.numel())
        dist.all_gather_into_tensor(out, inp)
        exp = torch.cat(
            [torch.tensor([j, 10 * j], dtype=torch.float32).repeat(numel) for j in range(n)]
        )
        eq(out, exp, "all_gather_into_tensor")
    nc_outs = [torch.zeros(4, 2).t() for _ in range(n)]
    dist.all_gather(nc_outs, torch.full((2, 4), float(rank)))
    for j in range(n):
        eq(nc_outs[j], float(j), "all_gather non-contiguous outputs")
    f8 = getattr(torch, "float8_e4m3fn", None)
    if f8 is not None:
        inp8 = torch.full((3,), float(rank), dtype=torch.float32).to(f8)
        outs8 = [torch.zeros(3, dtype=f8) for _ in range(n)]
        dist.all_gather(outs8, inp8)
        for j in range(n):
            eq(outs8[j].float(), float(j), "all_gather float8")


def _reduce_scatter_checks(rank: int, n: int) -> None:
    """``reduce_scatter`` list and tensor forms (B4)."""
    x = rank + 1
    for k in (1, 1023):
        inp = torch.arange(n * k, dtype=torch.float32) + rank
        exp = n * torch.arange(rank * k, (rank + 1) * k, dtype=torch.float32) + sum(range(n))
        out = torch.zeros(k)
        dist.reduce_scatter_tensor(out, inp)
        eq(out, exp, "reduce_scatter_tensor")
        out = torch.zeros(k)
        dist.reduce_scatter(out, list(inp.chunk(n)))
        eq(out, exp, "reduce_scatter list")
    out = torch.zeros(4, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(
        out, torch.full((4 * n,), x, dtype=torch.bfloat16), op=dist.ReduceOp.MAX
    )
    eq(out, float(n), "reduce_scatter bf16 max")


def _all_to_all_checks(rank: int, n: int) -> None:
    """``all_to_all`` list and single, even and uneven splits (B5)."""
    ins = [torch.full((2,), 100.0 * rank + j) for j in range(n)]
    outs = [torch.zeros(2) for _ in range(n)]
    dist.all_to_all(outs, ins)
    for j in range(n):
        eq(outs[j], 100.0 * j + rank, "all_to_all list")
    inp = torch.cat([torch.full((3,), 100.0 * rank + j) for j in range(n)])
    out = torch.zeros(3 * n)
    dist.all_to_all_single(out, inp)
    eq(
        out,
        torch.cat([torch.full((3,), 100.0 * j + rank) for j in range(n)]),
        "all_to_all_single even",
    )
    in_splits = [j + 1 for j in range(n)]
    out_splits = [rank + 1] * n
    inp = torch.cat([torch.full((j + 1, 2), 100.0 * rank + j) for j in range(n)])
    out = torch.zeros(sum(out_splits), 2)
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    eq(
        out,
        torch.cat([torch.full((rank + 1, 2), 100.0 * j + rank) for j in range(n)]),
        "all_to_all_single uneven",
    )


def _rooted_checks(rank: int, n: int) -> None:
    """``reduce``, ``gather``, ``gather_into_tensor`` and ``scatter`` for every root,
    sync and async (B6)."""
    x = rank + 1
    for root in range(n):
        for async_op in (False, True):
            t = torch.full((7,), float(x))
            w = dist.reduce(t, dst=root, async_op=async_op)
            if async_op:
                w.wait()
            if rank == root:
                eq(t, float(n * (n + 1) // 2), "reduce")
            g = [torch.zeros(2) for _ in range(n)] if rank == root else None
            w = dist.gather(torch.full((2,), float(x)), g, dst=root, async_op=async_op)
            if async_op:
                w.wait()
            if rank == root:
                for j in range(n):
                    eq(g[j], float(j + 1), "gather")
            if hasattr(dist, "gather_into_tensor"):  # torch >= 2.13
                gt = torch.zeros(2 * n)
                w = dist.gather_into_tensor(
                    torch.full((2,), float(x)),
                    gt if rank == root else None,
                    dst=root,
                    async_op=async_op,
                )
                if async_op:
                    w.wait()
                if rank == root:
                    eq(
                        gt,
                        torch.arange(1, n + 1, dtype=torch.float32).repeat_interleave(2),
                        "gather_into_tensor",
                    )
            s = torch.zeros(3)
            lst = [torch.full((3,), 10.0 * j) for j in range(n)] if rank == root else None
            w = dist.scatter(s, lst, src=root, async_op=async_op)
            if async_op:
                w.wait()
            eq(s, 10.0 * rank, "scatter")


def _async_checks(rank: int, n: int) -> None:
    """Async pipelining: many ops in flight, waited in reverse order."""
    x = rank + 1
    works, bufs = [], []
    for i in range(8):
        t = torch.full((1000 * (i + 1),), float(x + i))
        bufs.append(t)
        works.append(dist.all_reduce(t, async_op=True))
    ag_out = torch.zeros(n)
    works.append(dist.all_gather_into_tensor(ag_out, torch.tensor([float(rank)]), async_op=True))
    for w in reversed(works):
        assert w.wait() is True
    for i, t in enumerate(bufs):
        eq(t, float(sum(r + 1 + i for r in range(n))), "async all_reduce")
    eq(ag_out, torch.arange(n, dtype=torch.float32), "async all_gather")
    w = dist.all_reduce(torch.ones(3), async_op=True)
    w.wait()
    assert mpg.get_local_success(w)
    eq(mpg.get_failed_ranks_hint(w), torch.zeros(n, dtype=torch.int32), "hint")


def _barrier_checks(rank: int, n: int) -> None:
    """``barrier``: nobody leaves before rank 0 has entered (B7)."""
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        time.sleep(0.2)
        store.set("b7/entered", "1")
    dist.barrier()
    assert store.check(["b7/entered"]), "left the barrier before rank 0 entered"


def _gil_checks(rank: int, n: int) -> None:
    """``wait()`` releases the GIL while a peer is late (A6)."""
    if n > 1:
        counter = [0]
        stop = threading.Event()

        def spin() -> None:
            while not stop.is_set():
                counter[0] += 1
                time.sleep(0.001)

        if rank == 0:
            time.sleep(0.3)
        th = threading.Thread(target=spin)
        th.start()
        before = counter[0]
        w = dist.all_reduce(torch.ones(4), async_op=True)
        w.wait()
        stop.set()
        th.join()
        if rank != 0:
            assert counter[0] > before, "python thread made no progress during wait()"


def collectives(rank: int, world: int, port: int) -> None:
    """B1-B7 at one world size: every op, dtype class, sizes, layouts, async.

    A2: the TCP run passes seed-form options (the backend owns the mask tensor).
    """
    opts = None
    if os.environ.get("MOONCAKE_PG_TRANSPORT") == "tcp":
        opts = MooncakeBackendOptions(torch.full((world,), 5, dtype=torch.int32))
    init(rank, world, port, opts)
    assert dist.get_world_size() == world and dist.get_rank() == rank
    check_transport(world)
    n = world
    mask = mpg.get_active_ranks(dist.group.WORLD)
    eq(mask, torch.ones(n, dtype=torch.int32), "mask")
    if opts is not None:
        assert mask.data_ptr() == opts.active_ranks.data_ptr(), "mask is not the user's tensor"
    _all_reduce_checks(rank, n)
    _broadcast_checks(rank, n)
    _all_gather_checks(rank, n)
    _reduce_scatter_checks(rank, n)
    _all_to_all_checks(rank, n)
    _rooted_checks(rank, n)
    _async_checks(rank, n)
    _barrier_checks(rank, n)
    _gil_checks(rank, n)
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------- C
def _p2p_ring_and_batched(rank: int, n: int) -> None:
    """Ring via ``batch_isend_irecv`` (C1); direct and batched send (C2)."""
    # C1 ring via batch_isend_irecv.
    y = torch.zeros(4)
    ops = [
        dist.P2POp(dist.isend, torch.full((4,), float(rank)), (rank + 1) % n),
        dist.P2POp(dist.irecv, y, (rank - 1) % n),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    eq(y, float((rank - 1) % n), "ring")
    # C2 direct and batched send.
    if rank == 0:
        dist.send(torch.tensor([12]), 1)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.tensor([1200]), 1)]):
            w.wait()
    elif rank == 1:
        a, b = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
        dist.recv(a, 0)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, b, 0)]):
            w.wait()
        assert (int(a), int(b)) == (12, 1200)


def _p2p_ordering(rank: int, n: int) -> None:
    """Ordering: 64 messages alternating 4 B and 4 MiB (C3)."""
    # C3 ordering: 64 messages alternating 4 B and 4 MiB.
    if rank == 0:
        ws = []
        for i in range(64):
            numel = 1 if i % 2 == 0 else (1 << 20)
            ws.append(dist.isend(torch.full((numel,), i, dtype=torch.int32), 1))
        for w in ws:
            w.wait()
    elif rank == 1:
        got = []
        for i in range(64):
            numel = 1 if i % 2 == 0 else (1 << 20)
            t = torch.zeros(numel, dtype=torch.int32)
            dist.recv(t, 0)
            assert bool((t == t[0]).all())
            got.append(int(t[0]))
        assert got == list(range(64)), got


def _p2p_many_senders(rank: int, n: int) -> None:
    """Several senders to one receiver (C4); recv without src (any source)."""
    # C4 several senders to one receiver.
    if rank == 0:
        dist.send(torch.tensor([100]), 1)
        r = torch.zeros(1, dtype=torch.int64)
        dist.recv(r, 1)
        assert int(r) == 101
    elif rank == 2:
        dist.send(torch.tensor([200]), 1)
    elif rank == 1:
        a, b = torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)
        wa, wb = dist.irecv(a, 0), dist.irecv(b, 2)
        dist.send(torch.tensor([101]), 0)
        wa.wait()
        wb.wait()
        assert (int(a), int(b)) == (100, 200)
    # recv without src (any source).
    if rank == 3:
        dist.send(torch.tensor([33]), 2)
    elif rank == 2:
        t = torch.zeros(1, dtype=torch.int64)
        src = dist.recv(t)
        assert int(t) == 33 and src == 3, (int(t), src)


def _p2p_late_and_large(rank: int, n: int) -> None:
    """Recv posted before and after the send, a 64 MiB message (C5); a
    non-contiguous receive buffer."""
    # C5 recv posted before and after the send; a 64 MiB message.
    dist.barrier()
    if rank == 0:
        time.sleep(0.2)
        dist.send(torch.tensor([5.0]), 1)
        dist.barrier()
        dist.send(torch.arange(16 << 20, dtype=torch.float32), 1)
    elif rank == 1:
        t = torch.zeros(1)
        dist.recv(t, 0)
        assert float(t) == 5.0
        dist.barrier()
        time.sleep(0.2)
        big = torch.zeros(16 << 20)
        dist.recv(big, 0)
        eq(big, torch.arange(16 << 20, dtype=torch.float32), "64 MiB p2p")
    else:
        dist.barrier()
    # Non-contiguous receive buffer.
    if rank == 2:
        dist.send(torch.arange(6, dtype=torch.float32), 3)
    elif rank == 3:
        t = torch.zeros(3, 2).t()
        dist.recv(t, 2)
        eq(t, torch.arange(6, dtype=torch.float32).reshape(2, 3), "p2p non-contiguous")


def p2p(rank: int, world: int, port: int) -> None:
    """C1-C5 (world 4; C2/C3/C5 between ranks 0 and 1)."""
    init(rank, world, port)
    n = world
    _p2p_ring_and_batched(rank, n)
    _p2p_ordering(rank, n)
    _p2p_many_senders(rank, n)
    _p2p_late_and_large(rank, n)
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------- subgroups
def _subgroup_p2p_and_order(
    rank: int, g01: dist.ProcessGroup, even: dist.ProcessGroup, over: dist.ProcessGroup
) -> None:
    """P2P to a rank outside a subgroup is rejected; overlapping groups issued
    in different orders do not deadlock; P2P inside a subgroup is FIFO per peer."""
    x = rank + 1
    # P2P to a rank outside a subgroup is rejected.
    if rank in (0, 1):
        try:
            dist.send(torch.ones(1), group_dst=5, group=g01)
        except (ValueError, RuntimeError):
            pass
        else:
            raise AssertionError("send to group_dst=5 in a 2-rank group did not fail")
    # Overlapping groups issued in different orders on different ranks: each
    # group has its own sequence, so nothing deadlocks.
    if rank < 2:
        a, b = torch.tensor([float(x)]), torch.tensor([float(x)])
        if rank == 0:
            wa = dist.all_reduce(a, group=over, async_op=True)
            wb = dist.all_reduce(b, group=g01, async_op=True)
        else:
            wb = dist.all_reduce(b, group=g01, async_op=True)
            wa = dist.all_reduce(a, group=over, async_op=True)
        wb.wait()
        wa.wait()
        eq(a, 6.0, "cross-order over")
        eq(b, 3.0, "cross-order pair")
    elif rank == 2:
        a = torch.tensor([float(x)])
        dist.all_reduce(a, group=over)
        eq(a, 6.0, "cross-order over (rank 2)")
    # FIFO per peer inside a subgroup (group_dst/group_src), mixed sizes.
    if rank == 0:
        ws = [
            dist.isend(torch.full((1 if i % 2 else 300_000,), i), group_dst=1, group=even)
            for i in range(8)
        ]
        for w in ws:
            w.wait()
    elif rank == 2:
        for i in range(8):
            t = torch.zeros(1 if i % 2 else 300_000, dtype=torch.int64)
            dist.recv(t, group_src=0, group=even)
            eq(t, float(i), "subgroup FIFO")


def subgroups(rank: int, world: int, port: int) -> None:
    """A5, even/odd and overlapping groups, D1-D3, group_dst/group_src."""
    init(rank, world, port)
    x = rank + 1
    g01 = dist.new_group([0, 1], backend="mooncake-cpu")
    g23 = dist.new_group([2, 3], backend="mooncake-cpu")
    t = torch.tensor([float(x)])
    dist.all_reduce(t, group=g01 if rank < 2 else g23)
    eq(t, 3.0 if rank < 2 else 7.0, "A5 pair sums")
    even = dist.new_group([0, 2], backend="mooncake-cpu")
    odd = dist.new_group([1, 3], backend="mooncake-cpu")
    over = dist.new_group([0, 1, 2], backend="mooncake-cpu")
    t = torch.tensor([float(x)])
    dist.all_reduce(t, group=even if rank % 2 == 0 else odd)
    eq(t, 4.0 if rank % 2 == 0 else 6.0, "even/odd")
    t = torch.tensor([float(x)])
    w1 = dist.all_reduce(t, group=over, async_op=True) if rank < 3 else None
    u = torch.tensor([float(x)])
    dist.all_reduce(u, group=g01 if rank < 2 else g23)
    eq(u, 3.0 if rank < 2 else 7.0, "pair sums while overlapping op in flight")
    if w1 is not None:
        w1.wait()
        eq(t, 6.0, "overlapping")
        assert dist.get_world_size(over) == 3 and dist.get_rank(over) == rank
    # D2: TP {0,1},{2,3} + PP send/recv along lanes {0,2},{1,3} (group_dst/group_src).
    lane = even if rank % 2 == 0 else odd
    tp = g01 if rank < 2 else g23
    act = torch.tensor([float(x)])
    dist.all_reduce(act, group=tp)
    if rank < 2:
        dist.send(act, group_dst=1, group=lane)
    else:
        got = torch.zeros(1)
        dist.recv(got, group_src=0, group=lane)
        eq(got, 3.0, "PP stage handoff")
        dist.all_reduce(got, group=tp)
        eq(got, 6.0, "stage 2 TP")
    # D3: prefill {0,1} -> decode {2,3}, KV handed over along lanes with batch ops.
    kv = torch.full((1024,), float(x))
    if rank < 2:
        ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, rank + 2)])
    else:
        recv_kv = torch.zeros(1024)
        ws = dist.batch_isend_irecv([dist.P2POp(dist.irecv, recv_kv, rank - 2)])
    for w in ws:
        w.wait()
    if rank >= 2:
        eq(recv_kv, float(rank - 1), "prefill->decode")
    _subgroup_p2p_and_order(rank, g01, even, over)
    for g in (g01, g23, even, odd, over):
        dist.destroy_process_group(g)
    t = torch.tensor([float(x)])
    dist.all_reduce(t)
    eq(t, 10.0, "WORLD after subgroup destroy")
    dist.destroy_process_group()


def topologies8(rank: int, world: int, port: int) -> None:
    """D4-D6 at world 8: DPxTP, 12-group DP+TP+EP, overlapped TP/DP traffic."""
    assert world == 8
    init(rank, world, port)
    x = float(rank + 1)
    mk = lambda ranks: dist.new_group(ranks, backend="mooncake-cpu")
    tp = [mk([0, 1, 2, 3]), mk([4, 5, 6, 7])]
    dp = [mk([i, i + 4]) for i in range(4)]
    my_tp, my_dp = tp[rank // 4], dp[rank % 4]
    t = torch.tensor([x])
    dist.all_reduce(t, group=my_tp)
    eq(t, 10.0 if rank < 4 else 26.0, "D4 tp")
    t = torch.tensor([x])
    dist.all_reduce(t, group=my_dp)
    eq(t, float(2 * (rank % 4) + 6), "D4 dp")
    # D5: 12 groups: tp4 x2, dp2 x4, ep pairs {0,1},{2,3},{4,5},{6,7} - 10 here plus 2 tp2.
    ep = [mk([2 * i, 2 * i + 1]) for i in range(4)]
    tp2 = [mk([0, 2, 4, 6]), mk([1, 3, 5, 7])]
    groups = tp + dp + ep + tp2
    assert len(groups) == 12 - 2 + 2
    my_ep = ep[rank // 2]
    inp = torch.full((4,), x)
    out = torch.zeros(4)
    dist.all_to_all_single(out, inp, group=my_ep)
    partner = rank ^ 1
    eq(
        out,
        torch.tensor([float(min(rank, partner) + 1)] * 2 + [float(max(rank, partner) + 1)] * 2),
        "D5 ep a2a",
    )
    t = torch.tensor([x])
    dist.all_reduce(t, group=tp2[rank % 2])
    eq(t, 16.0 if rank % 2 == 0 else 20.0, "D5 tp2")
    # D6: 20 iterations of TP all_reduce + all_gather overlapped with DP broadcast.
    for it in range(20):
        a = torch.full((256,), x + it)
        wa = dist.all_reduce(a, group=my_tp, async_op=True)
        b = torch.full((16,), x if rank < 4 else -1.0)
        wb = dist.broadcast(b, src=rank % 4, group=my_dp, async_op=True)
        g = torch.zeros(4 * 8)
        wg = dist.all_gather_into_tensor(g, torch.full((8,), x), group=my_tp, async_op=True)
        for w in (wa, wb, wg):
            w.wait()
        base = sum(r + 1 + it for r in (range(4) if rank < 4 else range(4, 8)))
        eq(a, float(base), "D6 tp")
        eq(b, float(rank % 4 + 1), "D6 dp bcast")
        first = 0 if rank < 4 else 4
        eq(g, torch.arange(first + 1, first + 5, dtype=torch.float32).repeat_interleave(8), "D6 ag")
    for grp in groups:
        dist.destroy_process_group(grp)
    dist.destroy_process_group()


# ---------------------------------------------------------------- lifecycle
def reinit(rank: int, world: int, port: int) -> None:
    """A2/A4: destroy + re-init on the same port twice, with and without options."""
    for i in range(3):
        if i == 0:
            opts = None
        elif i == 1:
            opts = MooncakeBackendOptions(torch.zeros(world, dtype=torch.int32))
        else:
            opts = MooncakeBackendOptions(world + 2)  # upstream form: max_group_size
        init(rank, world, port, opts, url=True)  # the same port every time
        assert dist.get_world_size() == world
        mask = mpg.get_active_ranks(dist.group.WORLD)
        exp = torch.tensor([1] * world + [0] * (mask.numel() - world), dtype=torch.int32)
        eq(mask, exp, "mask")
        if i == 1:
            assert mask.data_ptr() == opts.active_ranks.data_ptr(), "mask tensor not the user's"
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        eq(t, float(world * (world + 1) // 2), f"sum after init {i}")
        dist.destroy_process_group()
        # Rank 0 hosts the store on `port`: the others re-init only once the
        # old store is gone, or they could reach it just before it closes.
        hub_barrier(f"reinit/{i}", rank, world)


def device_id_init(rank: int, world: int, port: int) -> None:
    """A3: init with device_id=cpu and batch_isend_irecv."""
    try:
        init(rank, world, port, device_id=torch.device("cpu:0"))
    except ValueError as e:  # torch <= 2.12 accepts only accelerator device ids
        assert "accelerator" in str(e), e
        init(rank, world, port)
    y = torch.zeros(1)
    ws = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.isend, torch.tensor([float(rank)]), (rank + 1) % world),
            dist.P2POp(dist.irecv, y, (rank - 1) % world),
        ]
    )
    for w in ws:
        w.wait()
    eq(y, float((rank - 1) % world), "A3 ring")
    dist.destroy_process_group()


# ---------------------------------------------------------------- bad input
def expect(exc: type[BaseException] | tuple[type[BaseException], ...], fn, what: str) -> str:  # type: ignore[no-untyped-def]
    try:
        fn()
    except exc as e:
        return str(e)
    raise AssertionError(f"{what}: no {exc} raised")


def bad_input(rank: int, world: int, port: int) -> None:
    """Each bad-input case raises a clear error and the group stays usable."""
    assert world == 2
    init(rank, world, port)
    # Mismatched sizes across ranks: both ranks get an error, nobody hangs.
    for numel in ((3, 5), (10, 100000), (1 << 18, 1 << 17)):
        t = torch.ones(numel[rank])
        msg = expect(RuntimeError, lambda t=t: dist.all_reduce(t), "size mismatch")
        assert "mismatch" in msg or "differ" in msg, msg
        dist.barrier()
    # No corruption: the rank with the smaller tensor gets nothing written
    # past its end (guard elements around a view stay intact).
    for numel in ((4, 40000), (40000, 4)):
        backing = torch.full((numel[rank] + 64,), -7.0)
        view = backing[32 : 32 + numel[rank]]
        view.fill_(1.0)
        expect(RuntimeError, lambda v=view: dist.all_reduce(v), "size mismatch (guarded)")
        eq(backing[:32], -7.0, "guard before the tensor")
        eq(backing[32 + numel[rank] :], -7.0, "guard after the tensor")
        dist.barrier()
    outs = [torch.zeros(2 + rank) for _ in range(2)]
    expect(RuntimeError, lambda: dist.all_gather(outs, torch.ones(2 + rank)), "all_gather mismatch")
    # The group still works afterwards.
    t = torch.ones(8)
    dist.all_reduce(t)
    eq(t, 2.0, "after mismatch")
    # Sparse tensor.
    sp = torch.sparse_coo_tensor([[0]], [1.0], (4,))
    expect((ValueError, RuntimeError), lambda: dist.all_reduce(sp), "sparse")
    # Unsupported dtype/op pairs.
    expect(
        ValueError,
        lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.AVG),
        "int avg",
    )
    f8 = getattr(torch, "float8_e4m3fn", None)
    if f8 is not None:
        expect(ValueError, lambda: dist.all_reduce(torch.ones(2).to(f8)), "float8 sum")
    expect(
        (ValueError, RuntimeError),
        lambda: dist.all_reduce(torch.ones(2, dtype=torch.complex64), op=dist.ReduceOp.MAX),
        "complex max",
    )
    expect(ValueError, lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND), "float band")
    if hasattr(dist, "_make_nccl_premul_sum"):
        expect(
            (ValueError, RuntimeError),
            lambda: dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0)),
            "premul",
        )
    # Wrong list lengths / sizes (caught before communicating).
    expect(ValueError, lambda: dist.all_gather([torch.zeros(2)] * 70, torch.zeros(2)), "70 outputs")
    expect(
        ValueError,
        lambda: dist.all_gather([torch.zeros(2), torch.zeros(3)], torch.zeros(2)),
        "ragged outputs",
    )
    expect(
        ValueError,
        lambda: dist.all_gather_into_tensor(torch.zeros(5), torch.zeros(2)),
        "non-multiple",
    )
    expect(
        ValueError,
        lambda: dist.reduce_scatter_tensor(torch.zeros(3), torch.zeros(7)),
        "rs non-multiple",
    )
    expect(
        (ValueError, RuntimeError),
        lambda: dist.all_to_all([torch.zeros(1)] * 2, [torch.zeros(1)] * 3),
        "a2a lengths",
    )
    expect(
        (ValueError, RuntimeError),
        lambda: dist.all_to_all_single(torch.zeros(4), torch.zeros(4), [1, 3], [1, 1]),
        "bad splits",
    )
    # A list shorter than the group is an error on every rank (no hang).
    short = [torch.zeros(2)]
    msg = expect(RuntimeError, lambda: dist.all_gather(short, torch.zeros(2)), "short list")
    assert "too small" in msg or "aborted" in msg, msg
    # P2P to a rank outside the group.
    expect((ValueError, RuntimeError), lambda: dist.send(torch.ones(1), 7), "send outside")
    expect((ValueError, RuntimeError), lambda: dist.recv(torch.ones(1), 9), "recv outside")
    # P2P size mismatch: the receiver gets an error.
    if rank == 0:
        dist.send(torch.ones(3), 1)
    else:
        msg = expect(RuntimeError, lambda: dist.recv(torch.ones(5), 0), "p2p size mismatch")
        assert "size mismatch" in msg, msg
    t = torch.ones(8)
    dist.all_reduce(t)
    eq(t, 2.0, "still usable")
    # wait(timeout) raises when it expires; the op keeps running and completes.
    if rank == 0:
        time.sleep(1.0)
    t = torch.ones(4)
    w = dist.all_reduce(t, async_op=True)
    if rank == 1:
        expect(
            (TimeoutError, RuntimeError),
            lambda: w.wait(datetime.timedelta(milliseconds=50)),
            "wait timeout",
        )
    w.wait()
    eq(t, 2.0, "op completed after a wait timeout")
    dist.destroy_process_group()


def never_joins(rank: int, world: int, port: int) -> None:
    """Only rank 0 runs: init must fail within the timeout naming rank 1."""
    t0 = time.monotonic()
    try:
        init(rank, world, port, timeout=3.0)
    except Exception as e:  # noqa: BLE001 - torch may wrap it in DistBackendError
        msg = str(e)
        assert "1" in msg and ("timed out" in msg.lower() or "timeout" in msg.lower()), msg
        assert time.monotonic() - t0 < 60
        return
    raise AssertionError("init succeeded without rank 1")


def options_forms(rank: int, world: int, port: int) -> None:
    """Option validation, the upstream and seed forms, and the helper functions."""
    expect(
        ValueError, lambda: MooncakeBackendOptions(torch.zeros(2, dtype=torch.int64)), "int64 mask"
    )
    expect(ValueError, lambda: MooncakeBackendOptions(max_group_size=65), "capacity > 64")
    o = MooncakeBackendOptions(
        8, False, auto_deactivate_on_failure=False, auto_sync_on_failure=False
    )
    assert o.max_world_size == 8 and not o.auto_deactivate_on_failure
    o.set_host_ip("127.0.0.1")
    o.set_device_filter(["mlx5_0"])
    mask = torch.full((world + 1,), 7, dtype=torch.int32)
    init(rank, world, port, MooncakeBackendOptions(mask, False, world + 1))
    eq(mask, torch.tensor([1] * world + [0], dtype=torch.int32), "backend owns the mask")
    # No rank leaves before every rank checked the view they all joined (a
    # rank that destroys the group drops out of the others' view).
    hub_barrier("checked", rank, world)
    expect(TypeError, lambda: mpg.get_active_ranks("nope"), "bad backend")
    expect(TypeError, lambda: mpg.set_transfer_engine(object()), "bad engine")
    mpg.set_transfer_engine(None)
    dist.destroy_process_group()
    expect(
        ValueError,
        lambda: MooncakeBackendOptions(torch.zeros(world + 3, dtype=torch.int32), False, world + 1),
        "mask length vs max_group_size",
    )
    wrong = MooncakeBackendOptions(torch.zeros(world + 3, dtype=torch.int32), False)
    expect(Exception, lambda: init(rank, world, port, wrong), "mask length vs group size")
    hub_barrier("end", rank, world)  # rank 0 hosts the store the others dial


def cuda_collectives(rank: int, world: int, port: int) -> None:
    """B1-B3 on the `mooncake` backend with CUDA tensors and a device mask."""
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    mask = torch.zeros(world, dtype=torch.int32, device=dev)
    init(rank, world, port, MooncakeBackendOptions(mask), backend="mooncake")
    eq(mpg.get_active_ranks(dist.group.WORLD).cpu(), torch.ones(world, dtype=torch.int32), "mask")
    n, x = world, rank + 1
    for dt in (torch.float32, torch.bfloat16, torch.int64):
        t = torch.full((1023,), x, dtype=dt, device=dev)
        dist.all_reduce(t)
        eq(t.cpu(), torch.full((1023,), n * (n + 1) // 2, dtype=dt), f"cuda all_reduce {dt}")
    for root in range(n):
        t = torch.full((1 << 20,), 111.0 if rank == root else -1.0, device=dev)
        dist.broadcast(t, src=root)
        eq(t.cpu(), 111.0, "cuda broadcast")
    outs = [torch.zeros(2, device=dev) for _ in range(n)]
    dist.all_gather(outs, torch.tensor([rank, 10.0 * rank], device=dev))
    for j in range(n):
        eq(outs[j].cpu(), torch.tensor([j, 10.0 * j]), "cuda all_gather")
    dist.destroy_process_group()
    # Upstream: the mirror "may be on CPU or GPU"; a CPU one is written in place.
    cpu_mask = torch.zeros(world, dtype=torch.int32)
    init(rank, world, port, MooncakeBackendOptions(cpu_mask), backend="mooncake")
    eq(cpu_mask, torch.ones(world, dtype=torch.int32), "CPU mask of the mooncake backend")
    t = torch.full((4,), float(x), device=dev)
    dist.all_reduce(t)
    eq(t.cpu(), float(n * (n + 1) // 2), "cuda all_reduce with a CPU mask")
    dist.destroy_process_group()


def crash_survivors(rank: int, world: int, port: int) -> None:
    """E1-style: rank 1 exits after round 1; survivors exclude it and carry on."""
    assert world == 4
    init(rank, world, port)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    eq(t, 10.0, "round 1")
    # A receive posted before the crash completes once the death is seen.
    early = dist.irecv(torch.zeros(2), 1) if rank == 2 else None
    dist.barrier()
    if rank == 1:
        os._exit(0)
    if early is not None:
        early.wait()
        assert not mpg.get_local_success(early)
        eq(mpg.get_failed_ranks_hint(early), torch.tensor([0, 1, 0, 0], dtype=torch.int32), "e5")
    t = torch.tensor([float(rank + 1)])
    w = dist.all_reduce(t, async_op=True)
    w.wait()  # peer failures do not raise
    eq(t, 8.0, "sum over survivors")
    # Rank 2 already saw the death through its receive (the mask lost rank 1
    # before this op started, so the op never waited on it).
    hint = [0, 0, 0, 0] if rank == 2 else [0, 1, 0, 0]
    eq(mpg.get_failed_ranks_hint(w), torch.tensor(hint, dtype=torch.int32), "hint")
    assert mpg.get_local_success(w) == (rank == 2)
    eq(
        mpg.get_active_ranks(dist.group.WORLD),
        torch.tensor([1, 0, 1, 1], dtype=torch.int32),
        "mask",
    )
    assert dist.get_world_size() == 4  # V = 1 + highest active slot
    t = torch.tensor([float(rank + 1)])
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    eq(t, 8.0, "next op")
    assert mpg.get_local_success(w)
    big = torch.full((1 << 20,), float(rank + 1))
    dist.all_reduce(big)
    eq(big, 8.0, "large all_reduce over survivors")
    outs = [torch.full((2,), -1.0) for _ in range(4)]
    dist.all_gather(outs, torch.full((2,), float(rank + 1)))
    for j in range(4):
        eq(outs[j], 0.0 if j == 1 else float(j + 1), "all_gather zero-fills the failed slot")
    # E5: P2P with the dead rank fails at once (flagged); between the others it is clean.
    dead = torch.tensor([0, 1, 0, 0], dtype=torch.int32)
    w = dist.isend(torch.ones(1), 1) if rank == 0 else dist.irecv(torch.ones(1), 1)
    w.wait()
    assert not mpg.get_local_success(w)
    eq(mpg.get_failed_ranks_hint(w), dead, "p2p with the dead rank")
    peer = {0: 2, 2: 0, 3: None}[rank]
    if peer is not None:
        got = torch.zeros(1)
        ws = dist.batch_isend_irecv(
            [
                dist.P2POp(dist.isend, torch.tensor([float(rank)]), peer),
                dist.P2POp(dist.irecv, got, peer),
            ]
        )
        for w in ws:
            w.wait()
            assert mpg.get_local_success(w)
        eq(got, float(peer), "p2p between survivors")
    eq(mpg.get_active_ranks(dist.group.WORLD), 1 - dead, "mask after P2P")
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------ futures
def futures(rank: int, world: int, port: int) -> None:
    """Work.get_future(): all_reduce_coalesced(async_op=True) and a callback chain."""
    init(rank, world, port)
    n = world
    a, b = torch.full((3,), float(rank + 1)), torch.full((5,), 2.0 * (rank + 1))
    fut = dist.all_reduce_coalesced([a, b], async_op=True)
    fut.wait()
    eq(a, float(n * (n + 1) // 2), "coalesced a")
    eq(b, float(n * (n + 1)), "coalesced b")
    t = torch.full((4,), float(rank + 1))
    w = dist.all_reduce(t, async_op=True)
    chained = w.get_future().then(lambda f: f.value()[0] * 2)
    eq(chained.wait(), float(n * (n + 1)), "future callback")
    # A6 through the fault hook: rank 0 delays its frames to rank 1 by 300 ms;
    # meanwhile a Python thread on rank 1 keeps running (wait() drops the GIL).
    from mooncake.pg import _testing

    if rank == 0:
        _testing.inject_fault("delay@group=0,slot=1,ms=300")
    counter, stop = [0], threading.Event()

    def spin() -> None:
        while not stop.is_set():
            counter[0] += 1
            time.sleep(0.001)

    th = threading.Thread(target=spin)
    th.start()
    before = counter[0]
    t = torch.ones(2)
    dist.all_reduce(t)
    stop.set()
    th.join()
    eq(t, float(n), "delayed all_reduce")
    if rank == 0:
        assert _testing.fault_stats()["delay@group=0,slot=1,ms=300"] >= 1
        _testing.clear_faults()
    else:
        assert counter[0] > before, "python thread made no progress during a delayed op"
    # An op that fails (size mismatch) fails its future.
    bad = torch.ones(3 + rank)
    fut = dist.all_reduce(bad, async_op=True).get_future()
    expect(RuntimeError, fut.wait, "failed future")
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------- faults
def _fault_env_check() -> None:
    assert int(os.environ["MOONCAKE_PG_COLLECTIVE_TIMEOUT_US"]) <= 5_000_000


def freeze(rank: int, world: int, port: int) -> None:
    """E3 (+ P2P): the top rank freezes (no reads, writes or PONGs); survivors
    detect the silence and exclude it instead of hanging."""
    from mooncake.pg import _testing

    _fault_env_check()
    init(rank, world, port)
    top = world - 1
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    eq(t, float(world * (world + 1) // 2), "before the freeze")
    dist.barrier()
    if rank == top:
        _testing.inject_fault("freeze@group=0")
        dist.all_reduce(torch.ones(1))  # parks this process for good
        raise AssertionError("a frozen rank returned")
    if rank == 1:
        # P2P silence: a receive from the frozen rank completes with a hint.
        r = torch.full((2,), -1.0)
        w = dist.irecv(r, top)
        w.wait()
        assert not mpg.get_local_success(w)
        assert int(mpg.get_failed_ranks_hint(w)[top]) == 1
    t = torch.tensor([float(rank + 1)])
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    eq(t, float(top * (top + 1) // 2), "sum over survivors")
    hint = mpg.get_failed_ranks_hint(w)
    assert int(hint[:top].sum()) == 0, hint
    mask = torch.ones(world, dtype=torch.int32)
    mask[top] = 0
    eq(mpg.get_active_ranks(dist.group.WORLD), mask, "mask after the freeze")
    t = torch.tensor([float(rank + 1)])
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    eq(t, float(top * (top + 1) // 2), "next op")
    assert mpg.get_local_success(w)
    dist.destroy_process_group()


def exit_mid_send(rank: int, world: int, port: int) -> None:
    """E2: the top rank exits right after its first data piece reached the
    lowest peer; survivors get the sum over the ranks not flagged in the
    hint, and the next op excludes it everywhere."""
    from mooncake.pg import _testing

    _fault_env_check()
    init(rank, world, port)
    top = world - 1
    dist.barrier()
    if rank == top:
        _testing.inject_fault("exit@group=0,point=mid_send,code=0")
    t = torch.full((1000,), float(rank + 1))
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    assert rank != top, "the exit rule did not fire"
    hint = mpg.get_failed_ranks_hint(w)
    assert int(hint.sum()) <= 1 and int(hint[:top].sum()) == 0, hint
    exp = sum(r + 1 for r in range(world) if int(hint[r]) == 0)
    eq(t, float(exp), "sum over the ranks not in the hint")
    t = torch.ones(4)
    dist.all_reduce(t)
    eq(t, float(top), "next op excludes the exited rank")
    mask = torch.ones(world, dtype=torch.int32)
    mask[top] = 0
    eq(mpg.get_active_ranks(dist.group.WORLD), mask, "mask")
    assert dist.get_world_size() == top, "V shrinks when the top rank fails"
    # E6 (broken top): outputs sized to the survivors.
    out = torch.zeros(top)
    dist.all_gather_into_tensor(out, torch.tensor([float(rank + 1)]))
    eq(out, torch.arange(1, top + 1, dtype=torch.float32), "E6 all_gather")
    out = torch.zeros(1)
    dist.reduce_scatter_tensor(out, torch.arange(1, top + 1, dtype=torch.float32))
    eq(out, float((rank + 1) * top), "E6 reduce_scatter")
    dist.destroy_process_group()


def _pattern(r: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``r``'s input: ``1000**r * (1 + i % 7)``, so a sum over any set
    of ranks shows in every element exactly which ranks it includes."""
    return (1 + torch.arange(n, dtype=torch.int64) % 7).mul(1000**r).to(dtype)


def _over(hint: torch.Tensor, ranks: range, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Sum of the patterns of the ``ranks`` not flagged in ``hint``."""
    inc = [r for r in ranks if int(hint[r]) == 0]
    return sum((_pattern(r, n, torch.int64) for r in inc), torch.zeros(n, dtype=torch.int64)).to(
        dtype
    )


def pull_recovery(rank: int, world: int, port: int) -> None:
    """Inclusion is all-or-nothing per rank: the
    top rank exits right after its first piece of a large (two-phase)
    all_reduce reached rank 0, so rank 0 has part of its data and the others
    none; every survivor's result is the exact sum over ranks 0-2. Then the new top rank dies the same way inside a
    multi-piece reduce_scatter (AVG divides by the contributors), and the
    group keeps working."""
    from mooncake.pg import _testing

    _fault_env_check()
    assert world == 4
    init(rank, world, port)
    n = 1 << 21  # 16 MiB of int64: two-phase, many pieces per chunk
    dist.barrier()
    if rank == 3:
        _testing.inject_fault("exit@group=0,point=mid_send,code=0")
    if rank == 2:
        # A slow survivor: it starts the op after rank 3 died, so it plans
        # without rank 3 while ranks 0 and 1 planned with it.
        time.sleep(0.5)
    t = _pattern(rank, n, torch.int64)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    assert rank != 3, "the exit rule did not fire"
    # Rank 3 is flagged unless the view that drops it was committed before
    # this rank started the op (a slow survivor): then it was never in the
    # op. Either way no survivor's result includes any of rank 3's data.
    hint = mpg.get_failed_ranks_hint(w)
    assert int(hint[:3].sum()) == 0, hint
    eq(t, _over(torch.tensor([0, 0, 0, 1]), range(4), n, torch.int64), "all_reduce without rank 3")
    # The group goes on over the survivors.
    t = _pattern(rank, 1000, torch.int64)
    dist.all_reduce(t)
    eq(t, _over(torch.tensor([0, 0, 0, 1]), range(4), 1000, torch.int64), "next all_reduce")
    assert dist.get_world_size() == 3
    # reduce_scatter, one multi-piece message per peer: rank 2 dies after
    # its first piece to rank 0 (rank 0 recomputes by pulling rank 1's input).
    m = 1 << 15  # 256 KiB of float64 per rank: two pieces
    dist.barrier()
    if rank == 2:
        _testing.inject_fault("exit@group=0,point=mid_send,code=0")
    inp = torch.cat([_pattern(rank, m, torch.float64) * (j + 1) for j in range(3)])
    out = torch.zeros(m, dtype=torch.float64)
    w = dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.AVG, async_op=True)
    w.wait()
    assert rank != 2, "the exit rule did not fire"
    hint = mpg.get_failed_ranks_hint(w)
    assert int(hint[:2].sum()) == 0, hint
    exp = _over(torch.tensor([0, 0, 1]), range(3), m, torch.float64) * (rank + 1) / 2
    eq(out, exp, "reduce_scatter AVG over the ranks not in the hint")
    t = _pattern(rank, n, torch.int64)
    dist.all_reduce(t)
    eq(t, _over(torch.tensor([0, 0, 1, 1]), range(4), n, torch.int64), "large op after both")
    assert dist.get_world_size() == 2
    dist.destroy_process_group()


def drop_link(rank: int, world: int, port: int) -> None:
    """E8 at world 2: rank 0 drops its link to rank 1 at op 2; neither hangs,
    each then runs alone and flags the other."""
    from mooncake.pg import _testing

    _fault_env_check()
    init(rank, world, port)
    t = torch.ones(2)
    dist.all_reduce(t)
    eq(t, 2.0, "before the drop")
    if rank == 0:
        _testing.inject_fault("drop_link@group=0,seq=1,slot=1")
    t = torch.ones(2)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    if rank == 0:
        stats = _testing.fault_stats()
        _testing.clear_faults()
        assert stats == {"drop_link@group=0,seq=1,slot=1": 1}, stats
    # Data the peer had already queued may still be used, and the drop may
    # reach rank 1 before it submits this collective (a dropped member's
    # first collective after the drop flags its peers): the result matches
    # the hint either way.
    peer = 1 - rank
    hint = mpg.get_failed_ranks_hint(w)
    eq(t, 1.0 if int(hint[peer]) else 2.0, "result matches the hint")
    t = torch.ones(2)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    eq(t, 1.0, "each side alone afterwards")
    mask = torch.tensor([rank == 0, rank == 1], dtype=torch.int32)
    eq(mpg.get_active_ranks(dist.group.WORLD), mask, "the peer is cleared from the mask")
    dist.destroy_process_group()


def manual_evict(rank: int, world: int, port: int) -> None:
    """E7 (steps 1-2): with auto_deactivate_on_failure=False a failure is
    excluded and flagged but the mask is unchanged; the next op flags the
    known-dead rank again at once."""
    _fault_env_check()
    opts = MooncakeBackendOptions(world, auto_deactivate_on_failure=False)
    init(rank, world, port, opts)
    top = world - 1
    dist.barrier()
    if rank == top:
        os._exit(0)
    for _ in range(2):
        t = torch.tensor([float(rank + 1)])
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        eq(t, float(top * (top + 1) // 2), "survivors' sum")
        hint = torch.zeros(world, dtype=torch.int32)
        hint[top] = 1
        eq(mpg.get_failed_ranks_hint(w), hint, "flagged")
        eq(mpg.get_active_ranks(dist.group.WORLD), torch.ones(world, dtype=torch.int32), "mask")
        assert dist.get_world_size() == world
    dist.destroy_process_group()


def _coordinator_gone(msg: str) -> bool:
    """A failed init's error from a rank that dialed the membership
    coordinator after rank 0 had given up on the group and closed it."""
    return "membership coordinator" in msg and "refused" in msg.lower()


def refused_connect(rank: int, world: int, port: int) -> None:
    """Fault rule fail_connect: rank 1 refuses to dial rank 0, so init fails on both
    within the timeout, naming the missing rank; without the rule it works."""
    from mooncake.pg import _testing

    assert world == 2
    if rank == 1:
        _testing.inject_fault("fail_connect@slot=0")
    try:
        init(rank, world, port, timeout=3.0)
    except Exception as e:  # noqa: BLE001 - torch may wrap it in DistBackendError
        msg = str(e)
        # Rank 1, if it reaches the coordinator only after rank 0 has timed
        # out and closed it (a loaded machine), is refused there instead.
        assert (str(1 - rank) in msg and "timed out" in msg) or (
            rank == 1 and _coordinator_gone(msg)
        ), msg
    else:
        raise AssertionError("init succeeded although rank 1 refused to connect")
    if rank == 1:
        # (Under extreme load the records may not even be exchanged in time.)
        if "connecting" in msg:
            assert _testing.fault_stats()["fail_connect@slot=0"] >= 1
        _testing.clear_faults()
    hub_barrier("cleared", rank, world)
    init(rank, world, port)
    t = torch.ones(1)
    dist.all_reduce(t)
    eq(t, 2.0, "after clearing the rule")
    dist.destroy_process_group()


# ------------------------------------------------------------ cluster token
def _token_round(rank: int, world: int, port: int) -> None:
    """Collectives, a P2P ring and a subgroup on a group whose links and
    coordinator session were admitted by the cluster-token handshake."""
    init(rank, world, port)
    check_transport(world)
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    eq(t, float(world * (world + 1) // 2), "all_reduce with a token")
    y = torch.zeros(3)
    ws = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.isend, torch.full((3,), float(rank)), (rank + 1) % world),
            dist.P2POp(dist.irecv, y, (rank - 1) % world),
        ]
    )
    for w in ws:
        w.wait()
    eq(y, float((rank - 1) % world), "P2P ring with a token")
    sub = dist.new_group([0, 1])
    if rank < 2:
        s = torch.ones(4)
        dist.all_reduce(s, group=sub)
        eq(s, 2.0, "subgroup with a token")
    dist.destroy_process_group()


def cluster_token(rank: int, world: int, port: int) -> None:
    """Cluster token for PG ranks: with MC_AUTH_TOKEN on every rank the group
    works; a rank with a wrong or missing token is refused with a clear
    error, its peers fail within their timeout naming it and why, nobody
    hangs or crashes, and the same processes then form a group again."""
    token = os.environ["MC_AUTH_TOKEN"]
    assert token, "the step sets MC_AUTH_TOKEN"
    _token_round(rank, world, port)
    top = world - 1
    for i, (bad, why) in enumerate(
        [("not-the-cluster-token", "tokens differ"), (None, "MC_AUTH_TOKEN")]
    ):
        hub_barrier(f"bad/{i}", rank, world)
        if rank == top:
            if bad is None:
                del os.environ["MC_AUTH_TOKEN"]
            else:
                os.environ["MC_AUTH_TOKEN"] = bad
        t0 = time.monotonic()
        try:
            init(rank, world, port, timeout=6.0)
        except Exception as e:  # noqa: BLE001 - torch may wrap it in DistBackendError
            msg = str(e)
        else:
            raise AssertionError(f"init succeeded with rank {top} holding token {bad!r}")
        assert time.monotonic() - t0 < 60, "a refused rank must not hang its group"
        assert token not in msg, "the secret must not appear in errors"
        if rank != 0 and _coordinator_gone(msg):
            # Reached the coordinator only after rank 0 had timed out and
            # closed it (a loaded machine): refused there, no hang.
            pass
        elif rank == top:
            assert "authentication failed" in msg and why in msg, msg
        else:
            # Peers name the missing rank and, from its note, the refusal.
            assert str(top) in msg and "timed out" in msg, msg
            assert "authentication failed" in msg, msg
        os.environ["MC_AUTH_TOKEN"] = token
    hub_barrier("restored", rank, world)
    _token_round(rank, world, port)
