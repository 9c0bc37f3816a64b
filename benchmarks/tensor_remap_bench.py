#!/usr/bin/env python3
"""Re-sharding a state dict held in the store, against torch DCP and memcpy, in one run.

    python benchmarks/tensor_remap_bench.py                 # 1 GiB state dict
    python benchmarks/tensor_remap_bench.py --mib 128 --repeats 3 --json out.json

The state dict is ``--mib`` MiB of bf16 2-D weights ``[rows, 1024]``: 24 dense
weights (split along dim 0 and dim 1 in turn) and 8 expert weights. Eight
writer processes (one store client each, holding its own segment) store it:
writer ``w`` is pipeline stage ``w // 4`` and TP rank ``w % 4`` and writes the
dense weights of its stage as ``[PP(w//4, 2), TP(w%4, 4)]`` and expert rank
``w`` of every expert weight as ``[EP(w, 8, split_dim=0)]``, all in one
``batch_put_tensor_with_parallelism`` call. This process then reads, with one
``batch_get_tensor_with_parallelism`` call per target rank:

  tp8      every dense weight as ``[TP(r, 8)]``, r = 0..7
  pp4tp2   every dense weight as ``[PP(p, 4), TP(t, 2)]`` for the stage p of 4
           that owns it, (p, t) over all 8 ranks
  ep4      every expert weight as ``[EP(r, 4, split_dim=0)]``, r = 0..3
  full     every weight whole (one call)

These reads are cross-process (the writers own the segments). Then the
same reads run in one process that stored every writer's part itself, so
they read its own segment (``inproc``).

Every result is checked against torch slicing of the original tensors
before timing. Figures: GB/s (1e9 B/s) of tensor bytes returned, the median of
``--repeats`` runs of all ranks of a target. Baselines on the same bytes:

  memcpy   one ``copy_`` per target shard from a contiguous copy of it into a
           fresh ``torch.empty`` tensor (the floor for an in-process read)
  memcpy-mt the same copies with torch's intra-op threads on every core (the
           machine's copy ceiling for a read that spreads over the cores,
           as ours does)
  slice    one ``copy_`` per target shard from its torch slice of the whole
           weight (a view: a shard split along dim 1 reads short rows at a
           stride, the access pattern a re-shard along that dim cannot avoid)
  dcp      ``torch.distributed.checkpoint`` re-sharding in the same layouts,
           processes and world sizes: 8 processes of a gloo group
           ``dcp.save`` the writer layout to ``/dev/shm`` (dense weights as
           DTensors sharded over the TP mesh of their PP stage, expert
           weights sharded over all 8), then, per target, as many processes
           as it has ranks ``dcp.load`` into DTensors of the target layout
           (tp8: 8, a mesh of 8; pp4tp2: 8, a 4 x 2 mesh; ep4: 4; full: one
           process, no group); each load's time is the slowest rank's,
           between barriers, with the target tensors allocated inside it as
           ours allocates its results. Every rank's shards are checked
           against torch slicing once.
  dcp-whole one process ``dcp.load``s the whole state dict into whole tensors
           (no process group, no re-sharding: the least DCP can do for the
           same bytes)

``rpc/call`` is master RPCs per batched read call, for a batch of every
weight and for a batch of one (they must be equal: constant in the number
of tensors).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    MiB,
    find_ours_master,
    json_child,
    median_time,
    new_store,
    running_master,
    stop_child,
    write_json,
)

COLS = 1024
N_DENSE = 24
N_EXPERT = 8
HERE = Path(__file__).resolve()


def weights(mib: int) -> dict[str, tuple[tuple[int, int], int]]:
    """name -> (shape, seed); every weight has the same size."""
    per = mib * MiB // (N_DENSE + N_EXPERT)
    rows = max(16, per // (2 * COLS) // 16 * 16)
    out = {f"dense.{i}": ((rows, COLS), i) for i in range(N_DENSE)}
    out.update({f"expert.{i}": ((rows, COLS), 100 + i) for i in range(N_EXPERT)})
    return out


def make(torch: Any, shape: tuple[int, int], seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(torch.bfloat16)


def split_dim(name: str) -> int:
    return int(name.split(".")[1]) % 2


def stage_of(name: str, stages: int) -> int:
    return int(name.split(".")[1]) * stages // N_DENSE


def write_as(s: Any, w: int, full: dict[str, Any]) -> list[int]:
    """Store writer ``w``'s part of ``full`` with ``s`` (see the module
    docs); the return codes."""
    from mooncake.store import EP, PP, TP, TensorParallelism

    pp, tp = w // 4, w % 4
    keys, tensors, pars = [], [], []
    for name, t in full.items():
        if name.startswith("dense."):
            if stage_of(name, 2) != pp:
                continue
            par = TensorParallelism([PP(pp, 2, stage_id=pp), TP(tp, 4, split_dim(name))])
        else:
            par = TensorParallelism([EP(w, 8, expert_id=w, split_dim=0)])
        keys.append(name)
        tensors.append(t)
        pars.append(par)
    return list(s.batch_put_tensor_with_parallelism(keys, tensors, pars))


def writer_main(args: argparse.Namespace) -> int:
    """Child: writer ``args.rank`` stores its part and serves it until stdin closes."""
    import torch

    torch.set_num_threads(1)
    s = new_store(args.rpc, args.meta, args.mib * MiB // 8 * 2 + 64 * MiB, 64 * MiB)
    full = {k: make(torch, shape, seed) for k, (shape, seed) in weights(args.mib).items()}
    rc = write_as(s, args.rank, full)
    print(json.dumps({"rc": sorted(set(rc))}), flush=True)
    sys.stdin.read()
    s.close()
    return 0


def free_port() -> int:
    import socket

    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return int(so.getsockname()[1])


def dcp_layout(torch: Any, target: str, rank: int, world: int, full: dict[str, Any]) -> Any:
    """This rank's state dict of empty DTensors in ``target``'s layout (or
    ``"writer"``: the writer layout, filled from ``full``), and the torch
    slice each shard must equal."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    dense = [k for k in full if k.startswith("dense.")]
    expert = [k for k in full if k.startswith("expert.")]
    sd: dict[str, Any] = {}
    want: dict[str, Any] = {}

    def add(name: str, mesh: Any, dim: int, rank_in: int, size: int, fill: bool) -> None:
        w = full[name].chunk(size, dim)[rank_in]
        local = w.contiguous() if fill else torch.empty(w.shape, dtype=w.dtype)
        sd[name] = DTensor.from_local(local, mesh, [Shard(dim)], run_check=False)
        want[name] = w

    if target == "writer":
        mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("pp", "tp"))
        flat = init_device_mesh("cpu", (world,))
        for k in dense:
            if stage_of(k, 2) == rank // 4:
                add(k, mesh["tp"], split_dim(k), rank % 4, 4, True)
        for k in expert:
            add(k, flat, 0, rank, world, True)
    elif target == "tp8":
        mesh = init_device_mesh("cpu", (world,))
        for k in dense:
            add(k, mesh, split_dim(k), rank, world, False)
    elif target == "pp4tp2":
        mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("pp", "tp"))
        for k in dense:
            if stage_of(k, 4) == rank // 2:
                add(k, mesh["tp"], split_dim(k), rank % 2, 2, False)
    elif target == "ep4":
        mesh = init_device_mesh("cpu", (world,))
        for k in expert:
            add(k, mesh, 0, rank, world, False)
    else:
        raise ValueError(target)
    return sd, want


def dcp_rank(
    rank: int, world: int, port: int, target: str, ckpt: str, repeats: int,
    full: dict[str, Any], out: Any,
) -> None:  # fmt: skip
    """One rank of a DCP save (``target == "writer"``) or re-sharding load;
    puts (rank, seconds per repeat) on ``out``."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        sd, want = dcp_layout(torch, target, rank, world, full)
        if target == "writer":
            dcp.save(sd, checkpoint_id=ckpt)
            dist.barrier()
            out.put((rank, []))
            return
        dcp.load(sd, checkpoint_id=ckpt)
        for k, w in want.items():
            if not torch.equal(sd[k].to_local(), w):
                raise RuntimeError(f"dcp {target} rank {rank}: {k} loaded wrong")
        secs = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            sd, _ = dcp_layout(torch, target, rank, world, full)
            dcp.load(sd, checkpoint_id=ckpt)
            dist.barrier()
            secs.append(time.perf_counter() - t0)
        out.put((rank, secs))
    finally:
        dist.destroy_process_group()


def dcp_spawn(target: str, world: int, ckpt: str, repeats: int, full: dict[str, Any]) -> float:
    """Run ``dcp_rank`` on ``world`` processes; the median over repeats of
    the slowest rank's seconds."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    mp.spawn(
        dcp_rank, args=(world, port, target, ckpt, repeats, full, out), nprocs=world, join=True
    )
    per_rank = [out.get()[1] for _ in range(world)]
    if target == "writer":
        return 0.0
    return statistics.median(max(r[i] for r in per_rank) for i in range(repeats))


def box(t: Any, axes: list[Any]) -> Any:
    for a in axes:
        if a.split_dim is not None:
            step = t.shape[a.split_dim] // a.size
            t = t.narrow(a.split_dim, a.rank * step, step)
    return t


def plans(full: dict[str, Any]) -> dict[str, list[tuple[list[str], list[Any]]]]:
    """Per target: one (keys, targets) batch per target rank."""
    from mooncake.store import EP, PP, TP, ReadTarget

    dense = [k for k in full if k.startswith("dense.")]
    expert = [k for k in full if k.startswith("expert.")]
    out: dict[str, list[tuple[list[str], list[Any]]]] = {}
    out["tp8"] = [
        (dense, [ReadTarget("shard", [TP(r, 8, split_dim(k))]) for k in dense]) for r in range(8)
    ]
    pp4 = []
    for p in range(4):
        ks = [k for k in dense if stage_of(k, 4) == p]
        for t in range(2):
            pp4.append(
                (
                    ks,
                    [
                        ReadTarget("shard", [PP(p, 4, stage_id=p), TP(t, 2, split_dim(k))])
                        for k in ks
                    ],
                )
            )
    out["pp4tp2"] = pp4
    out["ep4"] = [
        (expert, [ReadTarget("shard", [EP(r, 4, expert_id=r, split_dim=0)]) for _ in expert])
        for r in range(4)
    ]
    everything = list(full)
    out["full"] = [(everything, [ReadTarget("full") for _ in everything])]
    return out


def ours_gbs(
    s: Any,
    batches: list[tuple[list[str], list[Any]]],
    full: dict[str, Any],
    repeats: int,
    name: str,
) -> tuple[int, float]:
    """A target's reads with ``s``: every result checked against torch
    slicing, then timed; the bytes one pass returns and its GB/s."""
    import torch

    nbytes = 0
    for keys, tgts in batches:
        got = s.batch_get_tensor_with_parallelism(keys, tgts)
        for k, tg, g in zip(keys, tgts, got, strict=True):
            axes = tg.parallelism.axes if tg.parallelism else []
            want = box(full[k], axes)
            if g is None or not torch.equal(g, want):
                raise RuntimeError(f"{name}: {k} {tg} read wrong")
            nbytes += want.numel() * 2
    del got

    def ours() -> None:
        for keys, tgts in batches:
            s.batch_get_tensor_with_parallelism(keys, tgts)

    return nbytes, nbytes / median_time(ours, repeats) / 1e9


def measure(
    s: Any,
    batches: list[tuple[list[str], list[Any]]],
    full: dict[str, Any],
    repeats: int,
    name: str,
) -> dict[str, Any]:
    """One target's row: ours (``ours_gbs``), memcpy and slice timed on the
    same bytes, and the master RPCs of a batch of every weight and of one."""
    import torch

    nbytes, ours = ours_gbs(s, batches, full, repeats, name)
    views = [
        box(full[k], tg.parallelism.axes if tg.parallelism else [])
        for keys, tgts in batches
        for k, tg in zip(keys, tgts, strict=True)
    ]
    srcs = [v.contiguous() for v in views]

    def memcpy() -> None:
        for x in srcs:
            torch.empty_like(x).copy_(x)

    def slice_copy() -> None:
        for v in views:
            torch.empty(v.shape, dtype=v.dtype).copy_(v)

    keys, tgts = batches[0]
    r0 = s.get_client_stats()["master_rpcs"]
    s.batch_get_tensor_with_parallelism(keys, tgts)
    r1 = s.get_client_stats()["master_rpcs"]
    s.batch_get_tensor_with_parallelism(keys[:1], tgts[:1])
    r2 = s.get_client_stats()["master_rpcs"]
    t_mem = median_time(memcpy, repeats)
    # The machine's copy ceiling: the same copies with torch's intra-op
    # threads on every core (ours spreads a batch's copies over the cores).
    torch.set_num_threads(os.cpu_count() or 1)
    t_mem_mt = median_time(memcpy, repeats)
    torch.set_num_threads(1)
    t_slice = median_time(slice_copy, repeats)
    return {
        "bytes": nbytes,
        "calls": len(batches),
        "ours_gbs": ours,
        "memcpy_gbs": nbytes / t_mem / 1e9,
        "memcpy_mt_gbs": nbytes / t_mem_mt / 1e9,
        "slice_gbs": nbytes / t_slice / 1e9,
        "rpc_per_call": r1 - r0,
        "rpc_per_call_1": r2 - r1,
        "tensors_per_call": len(keys),
    }


def bench(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp

    # one intra-op thread: torch's pool only adds overhead to these copies
    torch.set_num_threads(1)

    master = find_ours_master()
    if master is None:
        raise SystemExit("mooncake_master not found")
    ws = weights(args.mib)
    full = {k: make(torch, shape, seed) for k, (shape, seed) in ws.items()}
    total = sum(t.numel() * 2 for t in full.values())
    res: dict[str, Any] = {"mib": round(total / MiB, 1), "tensors": len(full), "rows": {}}
    with running_master(master) as (rpc, meta):
        children = []
        t0 = time.perf_counter()
        for w in range(8):
            cmd = [
                sys.executable,
                str(HERE),
                "--writer",
                str(w),
                "--rpc",
                rpc,
                "--meta",
                meta,
                "--mib",
                str(args.mib),
            ]
            children.append(json_child(cmd))
        bad = [h for _, h in children if h.get("rc") != [0]]
        res["write_s"] = round(time.perf_counter() - t0, 2)
        try:
            if bad:
                raise RuntimeError(f"writers failed: {bad}")
            s = new_store(rpc, meta, 16 * MiB, 64 * MiB)
            try:
                for name, batches in plans(full).items():
                    res["rows"][name] = measure(s, batches, full, args.repeats, name)
            finally:
                s.close()
        finally:
            for proc, _ in children:
                stop_child(proc)
    # In-process reads: this process stores every writer's part itself and
    # reads from its own segment.
    with running_master(master) as (rpc, meta):
        s = new_store(rpc, meta, total * 2 + 256 * MiB, 64 * MiB)
        try:
            for w in range(8):
                rc = write_as(s, w, full)
                if set(rc) != {0}:
                    raise RuntimeError(f"in-process writer {w} failed: {sorted(set(rc))}")
            for name, batches in plans(full).items():
                _, res["rows"][name]["inproc_gbs"] = ours_gbs(s, batches, full, args.repeats, name)
        finally:
            s.close()
    ckpt = tempfile.mkdtemp(
        prefix="dcp-remap-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    try:
        t0 = time.perf_counter()
        dcp.save(full, checkpoint_id=ckpt, no_dist=True)
        res["dcp_save_s"] = round(time.perf_counter() - t0, 2)
        dest = {k: torch.empty_like(v) for k, v in full.items()}
        dcp.load(dest, checkpoint_id=ckpt, no_dist=True)
        if not all(torch.equal(dest[k], full[k]) for k in full):
            raise RuntimeError("dcp load is wrong")

        def dcp_load() -> None:
            d = {k: torch.empty_like(v) for k, v in full.items()}
            dcp.load(d, checkpoint_id=ckpt, no_dist=True)

        t_dcp = median_time(dcp_load, args.repeats)
        res["dcp_load_gbs"] = total / t_dcp / 1e9
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    # DCP's own re-sharding: the writer layout saved by 8 ranks, each target
    # loaded by its own ranks.
    for t in full.values():
        t.share_memory_()
    ckpt = tempfile.mkdtemp(
        prefix="dcp-reshard-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    try:
        t0 = time.perf_counter()
        dcp_spawn("writer", 8, ckpt, args.repeats, full)
        res["dcp_reshard_save_s"] = round(time.perf_counter() - t0, 2)
        for name, world in (("tp8", 8), ("pp4tp2", 8), ("ep4", 4)):
            secs = dcp_spawn(name, world, ckpt, args.repeats, full)
            res["rows"][name]["dcp_gbs"] = res["rows"][name]["bytes"] / secs / 1e9
        res["rows"]["full"]["dcp_gbs"] = res["dcp_load_gbs"]
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mib", type=int, default=1024, help="state dict size (default 1024)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--writer", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rpc", default="", help=argparse.SUPPRESS)
    ap.add_argument("--meta", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.writer is not None:
        args.rank = args.writer
        return writer_main(args)
    t0 = time.time()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    res = bench(args)
    whole_gbs = res["dcp_load_gbs"]
    print(
        f"state dict {res['mib']} MiB bf16, {res['tensors']} weights, written by 8 processes in {res['write_s']} s"
    )
    print(
        f"{'target':8} {'calls':>5} {'ours GB/s':>10} {'memcpy GB/s':>12} {'memcpy-mt':>10} {'slice GB/s':>11} {'ours/memcpy':>12} {'ours/slice':>11} {'dcp GB/s':>9} {'ours/dcp':>9} {'ours/dcp-whole':>15} {'rpc/call':>9} {'rpc/call(1)':>11} {'inproc GB/s':>12} {'inproc/memcpy':>14}"
    )
    for name, r in res["rows"].items():
        print(
            f"{name:8} {r['calls']:>5} {r['ours_gbs']:>10.2f} {r['memcpy_gbs']:>12.2f} {r['memcpy_mt_gbs']:>10.2f} {r['slice_gbs']:>11.2f} "
            f"{r['ours_gbs'] / r['memcpy_gbs']:>12.2f} {r['ours_gbs'] / r['slice_gbs']:>11.2f} {r['dcp_gbs']:>9.2f} "
            f"{r['ours_gbs'] / r['dcp_gbs']:>9.1f} {r['ours_gbs'] / whole_gbs:>15.1f} "
            f"{r['rpc_per_call']:>9} {r['rpc_per_call_1']:>11} "
            f"{r['inproc_gbs']:>12.2f} {r['inproc_gbs'] / r['memcpy_gbs']:>14.2f}"
        )
    print(
        f"dcp-whole: save {res['dcp_save_s']} s, load {whole_gbs:.2f} GB/s (whole state dict, one process); "
        f"dcp re-sharding: save by 8 ranks {res['dcp_reshard_save_s']} s (full row: dcp-whole)"
    )
    print(f"({time.time() - t0:.0f} s)")
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
