#!/usr/bin/env python3
"""RL rollout -> trainer hand-off with ``mooncake.structured_object_store``.

    python examples/rl_dataflow.py                  # 1024 rows x 512 tokens
    python examples/rl_dataflow.py --rows 8192 --width 4096

Starts ``mooncake_master``, then a *rollout* process that builds a DataProto
batch (``input_ids`` / ``attention_mask`` tensors, a ragged ``responses``
column of per-row tensors, text prompts and JSON metadata, ``meta_info``),
stores it with ``put_dataproto`` and prints the exported handle (a small JSON
object: manifest keys, no payload). A *trainer* process imports the handle
and reads only two fields (``input_ids`` and ``responses``) for a minibatch of
rows, checks every value against what the rollout wrote, and reports how many
bytes it moved. The rollout process then cleans the batch up.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np
import torch
from _launch import start_master, wait_port
from mooncake.store import MooncakeDistributedStore
from mooncake.structured_object_store import MooncakeBundleTransfer, export_ref, import_ref


def make_batch(rows: int, width: int) -> dict:
    """The rollout's batch; deterministic, so the trainer can check it."""
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 50_000, (rows, width), generator=g)
    lengths = torch.randint(1, max(2, width // 4), (rows,), generator=g).tolist()
    responses = np.empty(rows, dtype=object)
    for i, n in enumerate(lengths):
        responses[i] = input_ids[i, :n].clone()
    return {
        "batch": {
            "input_ids": input_ids,
            "attention_mask": torch.ones(rows, width, dtype=torch.int64),
        },
        "non_tensor_batch": {
            "responses": responses,
            "prompt": np.array(
                [f"question {i}: what is {i} + {i}?" for i in range(rows)], dtype=object
            ),
            "metadata": np.array(
                [{"id": i, "source": "gsm8k", "tags": ["math"]} for i in range(rows)], dtype=object
            ),
        },
        "meta_info": {"global_step": 1, "temperature": 0.7},
    }


def setup(master: str, meta: str, segment_mb: int) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", meta, segment_mb << 20, 64 << 20, "tcp", "", master)
    if rc != 0:
        raise SystemExit(f"setup failed: {rc}")
    return store


def rollout(args: argparse.Namespace) -> None:
    store = setup(args.master, args.meta, args.segment_mb)
    transfer = MooncakeBundleTransfer(store, key_prefix="rl-example")
    t0 = time.perf_counter()
    ref = transfer.put_dataproto(
        make_batch(args.rows, args.width), namespace="rollout", partition="step-1", stage="rollout"
    )
    secs = time.perf_counter() - t0
    print(json.dumps({"handle": export_ref(ref), "put_secs": secs}), flush=True)
    sys.stdin.readline()  # the trainer is done
    transfer.cleanup_dataproto(ref)
    store.close()


def trainer(args: argparse.Namespace) -> None:
    store = setup(args.master, args.meta, args.segment_mb)
    transfer = MooncakeBundleTransfer(store, key_prefix="rl-example")
    handle = json.loads(sys.stdin.readline())
    rows = list(range(0, args.rows, 8))
    stats = store.get_client_stats()
    before = sum(stats[k] for k in ("bytes_read_local", "bytes_read_same_host", "bytes_read_tcp"))
    t0 = time.perf_counter()
    mb = transfer.get_dataproto(import_ref(handle), fields=["input_ids", "responses"], rows=rows)
    secs = time.perf_counter() - t0
    stats = store.get_client_stats()
    moved = (
        sum(stats[k] for k in ("bytes_read_local", "bytes_read_same_host", "bytes_read_tcp"))
        - before
    )
    want = make_batch(args.rows, args.width)
    ok = torch.equal(mb["batch"]["input_ids"], want["batch"]["input_ids"][rows]) and all(
        torch.equal(a, want["non_tensor_batch"]["responses"][r])
        for a, r in zip(mb["non_tensor_batch"]["responses"], rows, strict=True)
    )
    ok = ok and set(mb["batch"]) == {"input_ids"} and set(mb["non_tensor_batch"]) == {"responses"}
    print(json.dumps({"verified": ok, "rows": len(rows), "bytes": moved, "secs": secs}), flush=True)
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--segment-mb", type=int, default=512)
    ap.add_argument("--role", choices=["rollout", "trainer"])
    ap.add_argument("--master")
    ap.add_argument("--meta")
    args = ap.parse_args()
    if args.role == "rollout":
        return rollout(args)
    if args.role == "trainer":
        return trainer(args)
    master, rpc, http, _ = start_master()
    common = [
        "--master",
        f"127.0.0.1:{rpc}",
        "--meta",
        f"http://127.0.0.1:{http}/metadata",
        "--rows",
        str(args.rows),
        "--width",
        str(args.width),
        "--segment-mb",
        str(args.segment_mb),
    ]
    procs: list[subprocess.Popen[str]] = []
    try:
        wait_port(rpc)
        run = lambda role: subprocess.Popen(
            [sys.executable, __file__, "--role", role, *common],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        producer = run("rollout")
        procs.append(producer)
        assert producer.stdout is not None and producer.stdin is not None
        put = json.loads(producer.stdout.readline() or "{}")
        if "handle" not in put:
            raise SystemExit("the rollout process failed")
        handle = json.dumps(put["handle"])
        print(
            f"rollout: put {args.rows} rows in {put['put_secs']:.3f}s; handle is {len(handle)} bytes",
            flush=True,
        )
        consumer = run("trainer")
        procs.append(consumer)
        assert consumer.stdout is not None and consumer.stdin is not None
        consumer.stdin.write(handle + "\n")
        consumer.stdin.flush()
        got = json.loads(consumer.stdout.readline() or "{}")
        print(
            f"trainer: read input_ids + responses of {got.get('rows')} rows "
            f"({got.get('bytes', 0) / 1e6:.1f} MB moved) in {got.get('secs', 0):.3f}s: "
            f"{'verified' if got.get('verified') else 'MISMATCH'}",
            flush=True,
        )
        producer.stdin.write("done\n")
        producer.stdin.flush()
        producer.wait(timeout=60)
        consumer.wait(timeout=60)
        if not got.get("verified"):
            raise SystemExit(1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        master.kill()
        master.wait()


if __name__ == "__main__":
    main()
