"""nccl-tests style benchmark: ``python -m mooncake.pg.bench``.

Runs every listed backend in one invocation on identical sizes and data and
prints time (median, us), algbw/busbw (GB/s) and #wrong per backend plus the
gloo/mooncake speedup for each size.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COLLECTIVES = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "barrier",
    "sendrecv",
]


def parse_size(s: str) -> int:
    """Bytes of ``-b``/``-e`` values such as ``8``, ``64K``, ``1M`` (the
    project's size parser)."""
    from mooncake import _native

    return _native.parse_size(s)


def sizes(args: argparse.Namespace) -> list[int]:
    out, s = [], args.minbytes
    while s <= args.maxbytes:
        out.append(s)
        s = s * args.stepfactor if args.stepfactor > 1 else s + max(args.stepfactor, 1)
    return out


def bus_factor(coll: str, n: int) -> float:
    if coll == "all_reduce":
        return 2 * (n - 1) / n
    if coll in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def nop() -> None:
    """Nothing to reset."""


# (reset data (untimed), run once (timed), count wrong elements, element count)
Op = tuple[Callable[[], object], Callable[[], object], Callable[[], int], int]
F32 = torch.float32


def _sum_of_ranks(n: int) -> float:
    """What a SUM over ranks that each contribute ``rank + 1`` gives."""
    return n * (n + 1) / 2


def _op_all_reduce(count: int, rank: int, n: int, root: int, device: str) -> Op:
    t = torch.full((count,), float(rank + 1), dtype=F32, device=device)
    exp = _sum_of_ranks(n)
    return (
        lambda: t.fill_(float(rank + 1)),
        lambda: dist.all_reduce(t),
        lambda: int((t != exp).sum()),
        count,
    )


def _rank_blocks(n: int, per: int, device: str) -> torch.Tensor:
    """``n`` blocks of ``per`` elements, block ``j`` holding ``j``."""
    return torch.arange(n, dtype=F32, device=device).repeat_interleave(per)


def _op_blocks_from_ranks(
    count: int,
    rank: int,
    n: int,
    device: str,
    in_blocks: int,
    run: Callable[[torch.Tensor, torch.Tensor], object],
) -> Op:
    """``run(out, inp)`` with ``inp`` ``in_blocks`` blocks holding this rank's
    number, which leaves block ``j`` of ``out`` holding ``j``."""
    per = max(count // n, 1)
    inp = torch.full((per * in_blocks,), float(rank), dtype=F32, device=device)
    out = torch.empty(per * n, dtype=F32, device=device)
    expect = _rank_blocks(n, per, device)
    return (
        nop,
        lambda: run(out, inp),
        lambda: int((out != expect).sum()),
        per * n,
    )


def _op_all_gather(count: int, rank: int, n: int, root: int, device: str) -> Op:
    return _op_blocks_from_ranks(count, rank, n, device, 1, dist.all_gather_into_tensor)


def _op_gather(count: int, rank: int, n: int, root: int, device: str) -> Op:
    per = max(count // n, 1)
    inp = torch.full((per,), float(rank), dtype=F32, device=device)
    expect = _rank_blocks(n, per, device)
    outs = [torch.empty(per, dtype=F32, device=device) for _ in range(n)]

    def run_g() -> None:
        dist.gather(inp, outs if rank == root else None, dst=root)

    def wrong_g() -> int:
        if rank != root:
            return 0
        return int((torch.cat(outs) != expect).sum())

    return nop, run_g, wrong_g, per * n


def _op_reduce_scatter(count: int, rank: int, n: int, root: int, device: str) -> Op:
    per = max(count // n, 1)
    inp = torch.full((per * n,), float(rank + 1), dtype=F32, device=device)
    out = torch.empty(per, dtype=F32, device=device)
    exp = _sum_of_ranks(n)
    return (
        nop,
        lambda: dist.reduce_scatter_tensor(out, inp),
        lambda: int((out != exp).sum()),
        per * n,
    )


def _op_all_to_all(count: int, rank: int, n: int, root: int, device: str) -> Op:
    return _op_blocks_from_ranks(count, rank, n, device, n, dist.all_to_all_single)


def _op_broadcast(count: int, rank: int, n: int, root: int, device: str) -> Op:
    t = torch.empty(count, dtype=F32, device=device)
    return (
        lambda: t.fill_(111.0 if rank == root else -1.0),
        lambda: dist.broadcast(t, src=root),
        lambda: int((t != 111.0).sum()),
        count,
    )


def _op_reduce(count: int, rank: int, n: int, root: int, device: str) -> Op:
    t = torch.empty(count, dtype=F32, device=device)
    exp = _sum_of_ranks(n)
    return (
        lambda: t.fill_(float(rank + 1)),
        lambda: dist.reduce(t, dst=root),
        lambda: int((t != exp).sum()) if rank == root else 0,
        count,
    )


def _op_scatter(count: int, rank: int, n: int, root: int, device: str) -> Op:
    per = max(count // n, 1)
    out = torch.empty(per, dtype=F32, device=device)
    ins = [torch.full((per,), float(j), dtype=F32, device=device) for j in range(n)]

    def run_s() -> None:
        dist.scatter(out, ins if rank == root else None, src=root)

    return nop, run_s, lambda: int((out != float(rank)).sum()), per * n


def _op_barrier(count: int, rank: int, n: int, root: int, device: str) -> Op:
    return nop, dist.barrier, lambda: 0, 0


def _op_sendrecv(count: int, rank: int, n: int, root: int, device: str) -> Op:
    t = torch.full((count,), float(rank), dtype=F32, device=device)

    def run_p() -> None:
        # Ping-pong between ranks 0 and 1; time/2 is the one-way latency.
        if rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        elif rank == 1:
            dist.recv(t, 0)
            dist.send(t, 0)

    return nop, run_p, lambda: 0, count


_OPS: dict[str, Callable[[int, int, int, int, str], Op]] = {
    "all_reduce": _op_all_reduce,
    "all_gather": _op_all_gather,
    "gather": _op_gather,
    "reduce_scatter": _op_reduce_scatter,
    "all_to_all": _op_all_to_all,
    "broadcast": _op_broadcast,
    "reduce": _op_reduce,
    "scatter": _op_scatter,
    "barrier": _op_barrier,
    "sendrecv": _op_sendrecv,
}


def make_op(coll: str, nbytes: int, rank: int, n: int, root: int, device: str) -> Op:
    """Returns (reset data (untimed), run once (timed), count wrong elements, element count)."""
    build = _OPS.get(coll)
    if build is None:
        raise ValueError(f"unknown collective {coll}")
    return build(max(nbytes // 4, 1), rank, n, root, device)


def worker(rank: int, n: int, ports: list[int], args: argparse.Namespace, q: Any) -> None:
    torch.set_num_threads(1)
    import mooncake.pg  # noqa: F401

    results: dict[str, list[dict[str, float]]] = {}
    for bi, backend in enumerate(args.backends.split(",")):
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{ports[bi]}",
            rank=rank,
            world_size=n,
        )
        rows = []
        for nbytes in sizes(args):
            prep, run, wrong, count = make_op(
                args.collective, nbytes, rank, n, args.root, args.device
            )
            for _ in range(args.warmup_iters):
                prep()
                run()
            prep()
            run()
            bad = wrong() if args.check else 0
            times = []
            for _ in range(args.iters):
                prep()
                dist.barrier()
                t0 = time.perf_counter()
                run()
                times.append(time.perf_counter() - t0)
            tt = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)
            wt = torch.tensor([bad], dtype=torch.int64)
            dist.all_reduce(wt)
            med = statistics.median(tt.tolist())
            if args.collective == "sendrecv":
                med /= 2
            rows.append({"size": nbytes, "count": count, "time_us": med * 1e6, "wrong": int(wt)})
        results[backend] = rows
        dist.destroy_process_group()
    if rank == 0:
        q.put(results)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def format_table(args: argparse.Namespace, results: dict[str, list[dict[str, float]]]) -> str:
    backends = args.backends.split(",")
    n = args.ngpus
    head = f"{'size':>10} {'count':>10} {'type':>6} {'redop':>6} {'root':>4}"
    for b in backends:
        head += f" | {b[:12]:>12} {'time(us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
    head += " | speedup"
    title = (
        f"# collective {args.collective}, {n} ranks, device {args.device}, "
        f"iters {args.iters}, warmup {args.warmup_iters}"
    )
    lines = [title, head]
    for i, nbytes in enumerate(sizes(args)):
        first = results[backends[0]][i]
        redop = "sum" if args.collective in ("all_reduce", "reduce_scatter", "reduce") else "none"
        line = f"{nbytes:>10} {int(first['count']):>10} {'float':>6} {redop:>6} {args.root:>4}"
        for b in backends:
            r = results[b][i]
            t = r["time_us"]
            algbw = nbytes / (t * 1e-6) / 1e9 if t > 0 else 0.0
            busbw = algbw * bus_factor(args.collective, n)
            line += f" | {'':>12} {t:>10.1f} {algbw:>7.3f} {busbw:>7.3f} {int(r['wrong']):>6}"
        if "gloo" in results and len(backends) > 1:
            mc = next(b for b in backends if b != "gloo")
            sp = results["gloo"][i]["time_us"] / max(results[mc][i]["time_us"], 1e-9)
            line += f" | {sp:6.2f}x"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mooncake.pg.bench", description=__doc__)
    p.add_argument("--collective", choices=COLLECTIVES, default="all_reduce")
    p.add_argument("--backends", default="mooncake-cpu,gloo")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("-g", "--ngpus", type=int, default=2, help="number of processes")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=3)
    p.add_argument("-d", "--datatype", default="float")
    p.add_argument("-o", "--op", default="sum")
    p.add_argument("-r", "--root", type=int, default=0)
    p.add_argument("-c", "--check", type=int, default=1)
    p.add_argument("-J", "--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--assert-faster",
        action="store_true",
        help="exit 1 unless mooncake is within 1.10x of gloo at every size",
    )
    args = p.parse_args(argv)
    if args.datatype != "float" or args.op != "sum":
        p.error("only -d float and -o sum are supported")
    if args.device == "cuda":
        args.backends = args.backends.replace("mooncake-cpu", "mooncake")
    if args.collective == "sendrecv" and args.ngpus < 2:
        p.error("sendrecv needs -g >= 2")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ports = [free_port() for _ in args.backends.split(",")]
    procs = [
        ctx.Process(target=worker, args=(r, args.ngpus, ports, args, q)) for r in range(args.ngpus)
    ]
    for pr in procs:
        pr.start()
    results = None
    while results is None:
        try:
            results = q.get(timeout=1.0)
        except queue.Empty:
            if any(pr.exitcode not in (None, 0) for pr in procs):
                for pr in procs:
                    pr.terminate()
                print("a benchmark rank failed", file=sys.stderr)
                return 1
    for pr in procs:
        pr.join(timeout=60)
    if args.json:
        print(json.dumps({"args": vars(args), "results": results}))
    else:
        print(format_table(args, results))
    wrong = sum(int(r["wrong"]) for rows in results.values() for r in rows)
    rc = 0 if wrong == 0 and all(pr.exitcode == 0 for pr in procs) else 1
    if args.assert_faster and "gloo" in results:
        mc = next(b for b in results if b != "gloo")
        for a, g in zip(results[mc], results["gloo"], strict=True):
            if a["time_us"] > 1.10 * g["time_us"]:
                print(f"slower than gloo at {int(a['size'])} bytes", file=sys.stderr)
                rc = 1
    return rc


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
