"""Tensor-parallel checkpoint through the Mooncake store.

Starts ``mooncake_master``, then:

1. four writer processes (TP ranks 0-3) each store their shard of every
   parameter of a model state dict (float32 and bfloat16, ``--mib`` in total)
   with one ``batch_put_tensor_with_parallelism`` call: column-parallel weights
   are split along dim 0, row-parallel ones along dim 1, norms are replicated
   (written once, by rank 0, as plain tensors);
2. this process, a pure client, loads the full state dict with
   ``batch_get_tensor_with_parallelism(..., ReadTarget(mode="full"))``;
3. two reader processes load it re-sharded to TP=2
   (``ReadTarget(mode="shard", parallelism=[TP(r, 2, d)])``),

and every tensor is checked against a regenerated copy. The writers keep
their segments (the data lives there) until the readers are done.

    python examples/tensor_checkpoint.py            # ~256 MB state dict
    python examples/tensor_checkpoint.py --mib 32
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import zlib

import torch
from _launch import start_master, wait_port
from mooncake.store import TP, MooncakeDistributedStore, ReadTarget, TensorParallelism

TP_WRITE = 4
TP_READ = 2


def model_spec(mib: int) -> list[tuple[str, tuple[int, ...], torch.dtype, int | None]]:
    """(name, shape, dtype, TP split dim or None for replicated) of each parameter."""
    hidden = 512
    per_layer = hidden * hidden * (3 * 2 + 4 * 4 + 4 * 4)  # bytes: qkv bf16, up/down f32
    layers = max(1, mib * (1 << 20) // per_layer)
    spec: list[tuple[str, tuple[int, ...], torch.dtype, int | None]] = []
    for i in range(layers):
        p = f"layers.{i}"
        spec.append((f"{p}.attn.qkv.weight", (3 * hidden, hidden), torch.bfloat16, 0))
        spec.append((f"{p}.mlp.up.weight", (4 * hidden, hidden), torch.float32, 0))
        spec.append((f"{p}.mlp.down.weight", (hidden, 4 * hidden), torch.float32, 1))
        spec.append((f"{p}.norm.weight", (hidden,), torch.float32, None))
    return spec


def param(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """The deterministic value of a parameter (every process regenerates it)."""
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(shape, generator=g).to(dtype)


def shard_of(t: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    step = t.shape[dim] // size
    return t.narrow(dim, rank * step, step)


def connect(master: str, meta: str, segment: int) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", meta, segment, 64 << 20, "tcp", "", master)
    if rc != 0:
        raise SystemExit(f"setup failed: {rc}")
    return store


def writer(rank: int, master: str, meta: str, mib: int, prefix: str) -> None:
    spec = model_spec(mib)
    total = sum(
        torch.Size(s).numel() * torch.empty(0, dtype=d).element_size() for _, s, d, _ in spec
    )
    store = connect(master, meta, total // TP_WRITE + (64 << 20))
    keys, tensors, pars = [], [], []
    for name, shape, dtype, dim in spec:
        t = param(name, shape, dtype)
        if dim is None:
            if rank == 0:
                keys.append(prefix + name)
                tensors.append(t)
                pars.append(None)
            continue
        keys.append(prefix + name)
        tensors.append(shard_of(t, dim, rank, TP_WRITE))
        pars.append(TensorParallelism([TP(rank, TP_WRITE, dim)]))
    t0 = time.perf_counter()
    rcs = store.batch_put_tensor_with_parallelism(keys, tensors, pars)
    dt = time.perf_counter() - t0
    if any(rcs):
        raise SystemExit(f"writer {rank}: failed codes {sorted(set(rcs))}")
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    print(
        json.dumps({"rank": rank, "tensors": len(keys), "bytes": nbytes, "secs": dt}),
        flush=True,
    )
    sys.stdin.readline()  # keep the segment (it holds the shards) until told
    store.close()


def load(master: str, meta: str, mib: int, prefix: str, rank: int | None) -> dict[str, float]:
    """Load the state dict full (rank None) or as TP=2 rank ``rank``; verify it."""
    spec = model_spec(mib)
    store = connect(master, meta, 0)
    keys, targets = [], []
    for name, _shape, _dtype, dim in spec:
        keys.append(prefix + name)
        if dim is None:
            targets.append(None)
        elif rank is None:
            targets.append(ReadTarget("full", [TP(0, TP_WRITE, dim)]))
        else:
            targets.append(ReadTarget("shard", [TP(rank, TP_READ, dim)]))
    rpcs0 = store.get_client_stats()["master_rpcs"]
    t0 = time.perf_counter()
    got = store.batch_get_tensor_with_parallelism(keys, targets)
    dt = time.perf_counter() - t0
    rpcs = store.get_client_stats()["master_rpcs"] - rpcs0
    nbytes = 0
    for (name, shape, dtype, dim), t in zip(spec, got, strict=True):
        want = param(name, shape, dtype)
        if dim is not None and rank is not None:
            want = shard_of(want, dim, rank, TP_READ)
        if t is None or not torch.equal(t, want):
            raise SystemExit(f"{name}: wrong value read back (rank {rank})")
        nbytes += t.numel() * t.element_size()
    store.close()
    return {"bytes": nbytes, "secs": dt, "rpcs": rpcs, "tensors": len(keys)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="state dict size in MiB (default 256)")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--meta", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", default="ckpt/", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "writer":
        writer(args.rank, args.master, args.meta, args.mib, args.prefix)
        return
    if args.role == "reader":
        print(
            json.dumps(load(args.master, args.meta, args.mib, args.prefix, args.rank)), flush=True
        )
        return

    master_proc, rpc, http, _ = start_master()
    common = ["--master", f"127.0.0.1:{rpc}", "--meta", f"http://127.0.0.1:{http}/metadata"]
    common += ["--mib", str(args.mib), "--prefix", args.prefix]
    writers: list[subprocess.Popen[str]] = []
    try:
        wait_port(rpc)
        spec = model_spec(args.mib)
        print(f"state dict: {len(spec)} tensors, TP={TP_WRITE} writers", flush=True)
        for r in range(TP_WRITE):
            writers.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--role", "writer", "--rank", str(r), *common],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for w in writers:
            assert w.stdout is not None
            info = json.loads(w.stdout.readline() or "{}")
            if "rank" not in info:
                raise SystemExit("a writer failed")
            print(
                f"  writer {info['rank']}: {info['tensors']} tensors, "
                f"{info['bytes'] / 1e6:.0f} MB in {info['secs']:.3f}s "
                f"({info['bytes'] / info['secs'] / 1e9:.2f} GB/s)",
                flush=True,
            )
        m, meta = common[1], common[3]
        full = load(m, meta, args.mib, args.prefix, None)
        print(
            f"(a) full load in this process: {full['bytes'] / 1e6:.0f} MB in {full['secs']:.3f}s "
            f"({full['bytes'] / full['secs'] / 1e9:.2f} GB/s, {full['rpcs']} master RPCs), verified",
            flush=True,
        )
        readers = [
            subprocess.Popen(
                [sys.executable, __file__, "--role", "reader", "--rank", str(r), *common],
                stdout=subprocess.PIPE,
                text=True,
            )
            for r in range(TP_READ)
        ]
        for r, p in enumerate(readers):
            out, _ = p.communicate(timeout=600)
            if p.returncode != 0:
                raise SystemExit(f"reader {r} failed")
            info = json.loads(out.strip().splitlines()[-1])
            print(
                f"(b) TP={TP_READ} reader {r}: {info['bytes'] / 1e6:.0f} MB re-sharded in "
                f"{info['secs']:.3f}s ({info['bytes'] / info['secs'] / 1e9:.2f} GB/s, "
                f"{info['rpcs']} master RPCs), verified",
                flush=True,
            )
        print("checkpoint OK", flush=True)
    finally:
        for w in writers:
            if w.stdin is not None and w.poll() is None:
                w.stdin.write("\n")
                w.stdin.flush()
        for w in writers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
        master_proc.terminate()
        master_proc.wait(timeout=10)


if __name__ == "__main__":
    main()
