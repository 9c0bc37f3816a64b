#!/usr/bin/env python3
"""Prefill -> decode KV-cache transfer with ``mooncake.engine``, the way vLLM's
MooncakeConnector does it.

    python examples/kv_transfer.py                 # 256 MB of KV, same host
    python examples/kv_transfer.py --size-mb 64 --tcp

A decode process allocates a KV cache (one K and one V tensor per layer),
registers it with ``batch_register_memory`` and tells the prefill process its
session (``host:rpc_port``) and base addresses. The prefill process fills its
own KV cache, and writes every block into the decode process's cache with
``batch_transfer_sync_write``: one call per request of 16 blocks, adjacent
blocks coalesced, from a pool of sender threads. The decode process then checks
every byte. ``--tcp`` sets ``MC_FORCE_TCP`` in both processes (bytes over TCP
instead of one cross-process copy on this host).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from mooncake.engine import TransferEngine


def kv_layout(args: argparse.Namespace) -> tuple[int, int, int]:
    """(tensors, blocks per tensor, block bytes) for ``--size-mb`` of KV."""
    tensors = 2 * args.layers
    block = args.block_kib * 1024
    blocks = max(1, (args.size_mb << 20) // (tensors * block))
    return tensors, blocks, block


def expected(tensor: int, nbytes: int) -> np.ndarray:
    """The bytes prefill writes into one KV tensor (decode checks them)."""
    return (np.arange(nbytes, dtype=np.uint32) * 2654435761 + tensor * 97 >> 11).astype(np.uint8)


def decode(args: argparse.Namespace) -> int:
    tensors, blocks, block = kv_layout(args)
    engine = TransferEngine()
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") != 0:
        return 1
    # A serving engine's KV cache is allocated and touched up front.
    caches = [np.empty(blocks * block, np.uint8) for _ in range(tensors)]
    for c in caches:
        c.fill(0)
    ptrs = [c.ctypes.data for c in caches]
    if engine.batch_register_memory(ptrs, [c.nbytes for c in caches]) != 0:
        return 1
    print(json.dumps({"session": f"127.0.0.1:{engine.get_rpc_port()}", "base": ptrs}), flush=True)
    sys.stdin.readline()  # prefill says it is done
    ok = all(np.array_equal(c, expected(i, c.nbytes)) for i, c in enumerate(caches))
    print(json.dumps({"verified": ok}), flush=True)
    return 0 if ok else 1


def prefill(args: argparse.Namespace) -> int:
    tensors, blocks, block = kv_layout(args)
    env = dict(os.environ)
    if args.tcp:
        env["MC_FORCE_TCP"] = "1"
        os.environ["MC_FORCE_TCP"] = "1"
    child = subprocess.Popen(
        [sys.executable, __file__, "--role", "decode", *sys.argv[1:]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None
    peer = json.loads(child.stdout.readline())
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0
    caches = [expected(i, blocks * block) for i in range(tensors)]
    ptrs = [c.ctypes.data for c in caches]
    assert engine.batch_register_memory(ptrs, [c.nbytes for c in caches]) == 0

    # Requests of 16 blocks each; the decode side places request r's blocks
    # at the same block ids (contiguous on both sides, so each layer's run is
    # one coalesced entry, as vLLM builds it).
    per_req = 16
    reqs = [list(range(s, min(s + per_req, blocks))) for s in range(0, blocks, per_req)]

    def send(req: list[int]) -> int:
        src, dst, lens = [], [], []
        for t in range(tensors):
            src.append(ptrs[t] + req[0] * block)
            dst.append(peer["base"][t] + req[0] * block)
            lens.append(len(req) * block)
        return int(engine.batch_transfer_sync_write(peer["session"], src, dst, lens))

    total = tensors * blocks * block
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.threads) as pool:
        rcs = list(pool.map(send, reqs))
    secs = time.perf_counter() - t0
    child.stdin.write("done\n")
    child.stdin.flush()
    verified = json.loads(child.stdout.readline())["verified"]
    child.wait(30)
    path = "TCP" if args.tcp else "same host"
    print(
        f"{total / 1e6:.0f} MB of KV ({tensors} tensors x {blocks} blocks x {block // 1024} KiB) "
        f"in {len(reqs)} requests over {path}: {secs * 1e3:.1f} ms, {total / secs / 1e9:.2f} GB/s; "
        f"verified={verified}"
    )
    return 0 if all(rc == 0 for rc in rcs) and verified else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=["prefill", "decode"], default="prefill")
    p.add_argument("--size-mb", type=int, default=256, help="KV cache size (MB)")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--block-kib", type=int, default=64, help="bytes of one block of one tensor")
    p.add_argument("--threads", type=int, default=4, help="sender threads")
    p.add_argument("--tcp", action="store_true", help="force TCP (MC_FORCE_TCP=1)")
    args = p.parse_args()
    return decode(args) if args.role == "decode" else prefill(args)


if __name__ == "__main__":
    sys.exit(main())
