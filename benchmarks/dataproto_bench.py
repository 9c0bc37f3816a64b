#!/usr/bin/env python3
"""DataProto transfer benchmark: ``mooncake.structured_object_store`` of this
project vs the upstream wheel's module, in one run.

    python benchmarks/dataproto_bench.py                    # 8192 x 4096, both sides
    python benchmarks/dataproto_bench.py --rows 2048 --quick
    python benchmarks/dataproto_bench.py --only ours
    python benchmarks/dataproto_bench.py --rounds 3         # sides alternate; median per op

The batch: ``input_ids`` and ``attention_mask`` (int64 ``[rows, width]``), a
ragged ``responses`` column (one int64 tensor per row, ``width/8 ..
width/2`` long), text ``prompt``s and JSON ``metadata``; an appended stage
adds ``old_log_probs`` (float32 ``[rows, width]``). Each side runs under its
own interpreter (upstream: ``/work/venv-upstream/bin/python``, with this
repository's torch on its path) with its own master and one client that
owns the segment. Ops, each the median of the repeats (a fresh batch per
put; every read is checked against the data before it is timed; ``append``,
an op of a few milliseconds where one scheduling stall of a 2-core machine
moves a median of 3, takes the median of at least 9):

  put            put_dataproto of the rollout stage
  get-full       get_dataproto of every field
  get-2x1024     get_dataproto(fields=[input_ids, responses], rows=1024 random rows)
  append         append_dataproto_fields(old_log_probs) as a new stage
  xproc-full     get-full from another process (exported handle)
  xproc-2x1024   get-2x1024 from another process

References measured in the same run (ours column only): ``pickle-shm``,
``pickle.dumps`` of the same dict into a ``multiprocessing.shared_memory``
block and ``pickle.loads`` out of it (a round trip through shared memory),
``memcpy``, one copy of the rollout bytes into fresh memory, and
``copy-warm``, ``Tensor.copy_`` of the appended field into memory already in
place (the machine's ceiling for ``append``). Figures are
seconds and GB/s of the op's payload bytes; ``speedup`` is upstream's time
over ours.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
from _common import (
    add_rounds,
    alternating,
    comparison_parser,
    find_sides,
    import_torch,
    median_time,
    running_master,
    write_json,
)
from store_bench import new_store

LOCAL_BUFFER = 512 << 20
APPEND_REPEATS = 9
TORCH_SITE = os.environ.get(
    "MOONCAKE_TORCH_SITE", str(ROOT / ".venv" / "lib" / "python3.11" / "site-packages")
)


torch = import_torch(TORCH_SITE)
import numpy as np


def make_batch(rows: int, width: int, seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50_000, (rows, width), generator=g)
    lengths = torch.randint(max(1, width // 8), max(2, width // 2), (rows,), generator=g).tolist()
    responses = np.empty(rows, dtype=object)
    for i, n in enumerate(lengths):
        responses[i] = ids[i, :n].clone()
    return {
        "batch": {"input_ids": ids, "attention_mask": torch.ones(rows, width, dtype=torch.int64)},
        "non_tensor_batch": {
            "responses": responses,
            "prompt": np.array(
                [
                    f"Question {i}: a train leaves at {i % 12} o'clock going {i % 90} mph; "
                    f"when does it arrive if the distance is {i * 7 % 500} miles?"
                    for i in range(rows)
                ],
                dtype=object,
            ),
            "metadata": np.array(
                [
                    {"id": i, "source": "gsm8k", "difficulty": i % 5, "tags": ["math", "word"]}
                    for i in range(rows)
                ],
                dtype=object,
            ),
        },
        "meta_info": {"global_step": 1, "temperature": 0.7},
    }


def payload_bytes(
    batch: dict[str, Any], names: list[str] | None = None, rows: list[int] | None = None
) -> int:
    total = 0
    for section in ("batch", "non_tensor_batch"):
        for name, value in batch[section].items():
            if names is not None and name not in names:
                continue
            sel = range(len(value)) if rows is None else rows
            if isinstance(value, torch.Tensor):
                total += value[0].numel() * value.element_size() * len(sel)
            else:
                for r in sel:
                    v = value[r]
                    total += (
                        v.numel() * v.element_size()
                        if isinstance(v, torch.Tensor)
                        else len(json.dumps(v))
                    )
    return total


def same(got: dict[str, Any], want: dict[str, Any], rows: list[int] | None = None) -> bool:
    for section in ("batch", "non_tensor_batch"):
        for name, value in got[section].items():
            ref = want[section][name]
            if isinstance(ref, torch.Tensor):
                if not torch.equal(value, ref if rows is None else ref[rows]):
                    return False
            else:
                expect = list(ref) if rows is None else [ref[r] for r in rows]
                for a, b in zip(value, expect, strict=True):
                    if isinstance(b, torch.Tensor):
                        if not torch.equal(a, b):
                            return False
                    elif a != b:
                        return False
                if len(value) != len(expect):
                    return False
    return True


def shape_argv(args: argparse.Namespace) -> list[str]:
    """The batch shape and repeat count, as options for a child of this script."""
    return ["--rows", str(args.rows), "--width", str(args.width), "--repeats", str(args.repeats)]


def minibatch_rows(n: int) -> list[int]:
    """The rows a trainer reads: up to 1024 of ``n``, a fixed random choice, in order."""
    return sorted(np.random.default_rng(1).choice(n, size=min(1024, n), replace=False).tolist())


def reader_main(args: argparse.Namespace) -> int:
    from mooncake.structured_object_store import MooncakeBundleTransfer, import_ref

    store = new_store(args.rpc, args.meta, 64 << 20, LOCAL_BUFFER)
    transfer = MooncakeBundleTransfer(store, key_prefix="bench")
    handle = json.loads(sys.stdin.readline())
    want = make_batch(args.rows, args.width)
    rows = minibatch_rows(args.rows)
    out: dict[str, Any] = {}
    full = transfer.get_dataproto(import_ref(handle))
    ok = same(full, want)
    del full
    out["xproc-full"] = (
        median_time(lambda: transfer.get_dataproto(import_ref(handle)), args.repeats)
        if ok
        else "wrong"
    )
    sub = transfer.get_dataproto(import_ref(handle), fields=["input_ids", "responses"], rows=rows)
    ok = same(sub, want, rows)
    out["xproc-2x1024"] = (
        median_time(
            lambda: transfer.get_dataproto(
                import_ref(handle), fields=["input_ids", "responses"], rows=rows
            ),
            args.repeats,
        )
        if ok
        else "wrong"
    )
    print(json.dumps(out), flush=True)
    store.close()
    return 0


def side_main(args: argparse.Namespace) -> int:
    from mooncake.structured_object_store import MooncakeBundleTransfer, export_ref

    with running_master(args.master_bin) as (rpc, meta):
        segment = (5 * args.rows * args.width * 8 + (512 << 20)) // (1 << 20) << 20
        store = new_store(rpc, meta, segment, LOCAL_BUFFER)
        transfer = MooncakeBundleTransfer(store, key_prefix="bench")
        batch = make_batch(args.rows, args.width)
        rows = minibatch_rows(args.rows)
        results: dict[str, Any] = {}
        sizes = {
            "put": payload_bytes(batch),
            "get-full": payload_bytes(batch),
            "get-2x1024": payload_bytes(batch, ["input_ids", "responses"], rows),
            "append": args.rows * args.width * 4,
        }
        sizes["xproc-full"], sizes["xproc-2x1024"] = sizes["get-full"], sizes["get-2x1024"]
        put_times = []
        refs = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            refs.append(
                transfer.put_dataproto(batch, namespace="bench", partition="p", stage="rollout")
            )
            put_times.append(time.perf_counter() - t0)
            if len(refs) > 1:
                transfer.cleanup_dataproto(refs.pop(0))
        results["put"] = statistics.median(put_times)
        ref = refs[-1]
        full = transfer.get_dataproto(ref)
        ok = same(full, batch)
        del full
        results["get-full"] = (
            median_time(lambda: transfer.get_dataproto(ref), args.repeats) if ok else "wrong"
        )
        sub = transfer.get_dataproto(ref, fields=["input_ids", "responses"], rows=rows)
        ok = same(sub, batch, rows)
        results["get-2x1024"] = (
            median_time(
                lambda: transfer.get_dataproto(ref, fields=["input_ids", "responses"], rows=rows),
                args.repeats,
            )
            if ok
            else "wrong"
        )
        logp = torch.randn(args.rows, args.width)
        app_times = []
        append_repeats = args.repeats if args.quick else max(args.repeats, APPEND_REPEATS)
        for _ in range(append_repeats):
            t0 = time.perf_counter()
            r2 = transfer.append_dataproto_fields(
                ref, {"old_log_probs": logp}, stage="old_log_prob"
            )
            app_times.append(time.perf_counter() - t0)
            got = transfer.get_dataproto(r2, fields=["old_log_probs"])["batch"]["old_log_probs"]
            if not torch.equal(got, logp):
                app_times = []
                break
            transfer.remove_bundle(r2.stage_refs["old_log_prob"])
        results["append"] = statistics.median(app_times) if app_times else "wrong"
        env = dict(os.environ)
        child = subprocess.Popen(
            [
                sys.executable,
                str(HERE),
                "--reader",
                "--rpc",
                rpc,
                "--meta",
                meta,
                *shape_argv(args),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps(export_ref(ref)) + "\n")
        child.stdin.flush()
        line = child.stdout.readline()
        child.wait(timeout=600)
        results.update(
            json.loads(line) if line else {"xproc-full": "failed", "xproc-2x1024": "failed"}
        )
        if args.side == "ours":
            results.update(references(batch, args.repeats))
            sizes["pickle-shm"] = sizes["memcpy"] = sizes["get-full"]
            results["copy-warm"] = warm_copy(logp, append_repeats)
            sizes["copy-warm"] = sizes["append"]
        transfer.cleanup_dataproto(ref)
        store.close()
    print(json.dumps({"results": results, "sizes": sizes}), flush=True)
    return 0


def warm_copy(src: Any, repeats: int) -> float:
    """The machine's ceiling for ``append``: ``Tensor.copy_`` of the appended
    field into a tensor already in memory (torch spreads it over the cores)."""
    dst = torch.empty_like(src)
    dst.copy_(src)
    return median_time(lambda: dst.copy_(src), repeats)


def references(batch: dict[str, Any], repeats: int) -> dict[str, float]:
    def pickle_round_trip() -> Any:
        blob = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        shm = shared_memory.SharedMemory(create=True, size=len(blob))
        try:
            shm.buf[: len(blob)] = blob
            del blob
            out = pickle.loads(shm.buf)
            return out
        finally:
            shm.close()
            shm.unlink()

    tensors = [v for v in batch["batch"].values()] + list(batch["non_tensor_batch"]["responses"])

    def memcpy() -> None:
        for t in tensors:
            dst = torch.empty_like(t)
            ctypes.memmove(dst.data_ptr(), t.data_ptr(), t.numel() * t.element_size())

    return {
        "pickle-shm": median_time(pickle_round_trip, repeats),
        "memcpy": median_time(memcpy, repeats),
    }


def run_side(name: str, python: str, master: str, args: argparse.Namespace) -> dict[str, Any] | str:
    cmd = [
        python,
        str(HERE),
        "--side",
        name,
        "--master-bin",
        master,
        *shape_argv(args),
    ]
    env = dict(os.environ, MOONCAKE_TORCH_SITE=TORCH_SITE)
    print(f"== {name}: {python}", file=sys.stderr, flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, timeout=3600, check=False)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith('{"results"')]
    if r.returncode != 0 or not lines:
        return f"failed (exit {r.returncode})"
    return json.loads(lines[-1])


OPS = [
    "put",
    "get-full",
    "get-2x1024",
    "append",
    "xproc-full",
    "xproc-2x1024",
    "pickle-shm",
    "memcpy",
    "copy-warm",
]


def print_table(results: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"\nDataProto {args.rows} rows x {args.width}; seconds (GB/s of payload); speedup = upstream / ours\n"
    )
    print("| op | bytes | ours | upstream | speedup |")
    print("|---|---|---|---|---|")
    ours = results.get("ours")
    up = results.get("upstream")

    def cell(side: Any, op: str) -> tuple[str, float | None]:
        if not isinstance(side, dict):
            return (side or "-"), None
        v = side["results"].get(op)
        if not isinstance(v, float):
            return (v or "-"), None
        return f"{v:.3f} s ({side['sizes'][op] / v / 1e9:.2f})", v

    for op in OPS:
        sizes = (ours or up or {}).get("sizes", {}) if isinstance(ours or up, dict) else {}
        o, ov = cell(ours, op)
        u, uv = cell(up, op)
        speed = f"{uv / ov:.1f}x" if ov and uv else "-"
        print(f"| {op} | {sizes.get(op, 0) / 1e6:.0f} MB | {o} | {u} | {speed} |")
    if isinstance(ours, dict):
        r = ours["results"]
        if isinstance(r.get("get-full"), float) and isinstance(r.get("pickle-shm"), float):
            print(
                f"\nfull read vs pickle round trip through shared memory: {r['pickle-shm'] / r['get-full']:.2f}x"
            )


def median_of_rounds(runs: list[Any]) -> Any:
    """One side's rounds as one result: per op, the median of the rounds that
    measured it (a round that failed, or an op that was wrong in any round,
    is reported as such)."""
    good = [r for r in runs if isinstance(r, dict)]
    if len(good) < len(runs) or not good:
        return next(r for r in runs if not isinstance(r, dict))
    merged: dict[str, Any] = {"sizes": good[0]["sizes"], "results": {}}
    for op in good[0]["results"]:
        vals = [r["results"].get(op) for r in good]
        bad = [v for v in vals if not isinstance(v, float)]
        merged["results"][op] = bad[0] if bad else statistics.median(vals)
    return merged


def main() -> int:
    ap = comparison_parser(__doc__, "one repeat", None, ("--rpc", "--meta"), "--reader")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    add_rounds(ap, 1)
    args = ap.parse_args()
    if args.quick:
        args.repeats = 1
    if args.reader:
        return reader_main(args)
    if args.side:
        return side_main(args)
    missing = {"ours": "no master", "upstream": "no upstream venv"}
    sides = find_sides(args.only, args.upstream_python)
    rounds: dict[str, list[Any]] = {name: [] for name in sides}
    for _, name in alternating(list(sides), args.rounds):
        python, master = sides[name]
        rounds[name].append(run_side(name, python, master, args) if master else missing[name])
    results = {name: median_of_rounds(runs) for name, runs in rounds.items()}
    if args.rounds > 1:
        print(f"\n(median over {args.rounds} rounds, the sides alternating which runs first)")
    print_table(results, args)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
