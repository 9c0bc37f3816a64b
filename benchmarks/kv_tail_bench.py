#!/usr/bin/env python3
"""Tail latency of single-page reads in a KV-cache loop: this project vs the
upstream wheel, in one run.

    python benchmarks/kv_tail_bench.py               # every cell (~3 min)
    python benchmarks/kv_tail_bench.py --iters 300   # fewer reads per cell
    python benchmarks/kv_tail_bench.py --writer      # with a concurrent writer

The pattern of a serving engine's cache lookups: a writer stores a batch of
200 pages with ``batch_put_from``; then, for each request, the reader asks
``batch_is_exist`` for 32 page keys, writes into its destination buffer (as
the model does into the KV memory it is about to fill) and reads one page
with ``batch_get_into`` into that buffer. That read is timed, and so are
the existence checks: the 32-key ``batch_is_exist``, then ``batch_is_exist``
and ``is_exist`` of one of those keys (second table).

Pages are 64 KiB (one key) or 2 x 1 MiB (a K and a V key read in one call).
The reader is the writer's own process (``same-proc``) or another process
(``other-proc``), over the same-host path or with ``MC_FORCE_TCP=1``
(``tcp``; upstream's transport is TCP either way). Per cell: p50, p99 and
max of the timed read in µs, and the ratios to upstream.

With ``--writer``, a third process of the same side keeps writing while
every cell is measured, as another engine of the same cache would: it puts
16 fresh 64 KiB pages (``put`` per key, its own keys) and removes the 16 it
put before, in a loop, into a segment of its own on the same master. By
default it loops as fast as it can, so a side whose writes are faster also
puts more load beside its reads; ``--writer-rate R`` caps it at R rounds a
second, the same load for both sides. Each side prints the rounds a second
its writer made.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    KiB,
    MiB,
    comparison_parser,
    find_sides,
    print_table_head,
    run_sides,
    running_master,
    side_rows,
    write_json,
)
from store_bench import new_store

PAGES = 200
EXIST = 32
HERE = Path(__file__).resolve()
SHAPES = {"64KiB": [64 * KiB], "2x1MiB": [MiB, MiB]}
CELLS = [(shape, who, path) for shape in SHAPES for who in ("same-proc", "other-proc")
         for path in ("same-host", "tcp")]  # fmt: skip


def keys_of(prefix: str, page: int, parts: int) -> list[str]:
    return [f"{prefix}-p{page}-k{j}" for j in range(parts)]


EXIST_OPS = ("is_exist", "batch_is_exist1", "batch_is_exist32")


def read_loop(s: Any, prefix: str, sizes: list[int], iters: int) -> dict[str, list[float]]:
    """The request loop; the latencies (seconds) of the timed read
    (``get``) and of the existence checks: ``is_exist`` of one page key,
    ``batch_is_exist`` of one key and of the 32 probed keys."""
    import numpy as np

    total = sum(sizes)
    dst = np.zeros(total, np.uint8)
    base = int(dst.ctypes.data)
    s.register_buffer(base, total)
    ptrs = [base + sum(sizes[:j]) for j in range(len(sizes))]
    rnd = random.Random(3)
    lat: dict[str, list[float]] = {op: [] for op in ("get", *EXIST_OPS)}
    for i in range(iters):
        probe = [k for p in rnd.sample(range(PAGES), EXIST) for k in keys_of(prefix, p, 1)]
        t = time.perf_counter()
        found = s.batch_is_exist(probe)
        lat["batch_is_exist32"].append(time.perf_counter() - t)
        one = probe[0]
        t = time.perf_counter()
        single = s.batch_is_exist([one])
        lat["batch_is_exist1"].append(time.perf_counter() - t)
        t = time.perf_counter()
        exists = s.is_exist(one)
        lat["is_exist"].append(time.perf_counter() - t)
        if list(found) != [1] * EXIST or list(single) != [1] or exists != 1:
            raise RuntimeError(f"existence checks answered {found}, {single}, {exists}")
        dst.fill(i & 0xFF)  # the caller writes the destination first
        keys = keys_of(prefix, rnd.randrange(PAGES), len(sizes))
        t = time.perf_counter()
        got = s.batch_get_into(keys, ptrs, sizes)
        lat["get"].append(time.perf_counter() - t)
        if list(got) != sizes:
            raise RuntimeError(f"batch_get_into returned {got}")
    s.unregister_buffer(base)
    return lat


def churn_main(cfg: dict[str, Any]) -> int:
    """The concurrent writer: put 16 fresh pages, remove the previous 16,
    until stdin closes; ``rate`` such rounds a second at most (0: as fast
    as it can). Prints the rounds a second it made when it stops."""
    import threading

    s = new_store(cfg["rpc"], cfg["meta"], 64 * MiB, 16 * MiB)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    value = os.urandom(64 * KiB)
    prev: list[str] = []
    n = 0
    rate = float(cfg.get("rate", 0))
    print(json.dumps({"ready": True}), flush=True)
    start = time.perf_counter()
    while not stop.is_set():
        keys = [f"churn-{n}-{j}" for j in range(16)]
        for k in keys:
            s.put(k, value)
        for k in prev:
            s.remove(k)
        prev = keys
        n += 1
        if rate > 0:
            stop.wait(max(0.0, start + n / rate - time.perf_counter()))
    made = n / max(time.perf_counter() - start, 1e-9)
    s.close()
    print(json.dumps({"rounds_per_s": made}), flush=True)
    return 0


def stop_writer(churn: subprocess.Popen[str]) -> list[float]:
    """Stop the concurrent writer; the rounds a second it reported."""
    if churn.stdin is not None:
        churn.stdin.close()
    tail = churn.stdout.read() if churn.stdout is not None else ""
    churn.wait(timeout=60)
    lines = [ln for ln in tail.splitlines() if ln.startswith('{"rounds_per_s"')]
    return [json.loads(ln)["rounds_per_s"] for ln in lines]


def reader_main(cfg: dict[str, Any]) -> int:
    s = new_store(cfg["rpc"], cfg["meta"], 0, 16 * MiB)
    lat = read_loop(s, cfg["prefix"], cfg["sizes"], int(cfg["iters"]))
    s.close()
    print(json.dumps({"lat": lat}), flush=True)
    return 0


def side_main(args: argparse.Namespace) -> int:
    import numpy as np

    rows = []
    writer_rates: list[float] = []
    for path in ("same-host", "tcp"):
        env = {"MC_FORCE_TCP": "1"} if path == "tcp" else {}
        os.environ.update(env)
        if path != "tcp":
            os.environ.pop("MC_FORCE_TCP", None)
        with running_master(args.master_bin) as (rpc, meta):
            seg = PAGES * 2 * MiB * 2 + 64 * MiB
            w = new_store(rpc, meta, seg, 16 * MiB)
            churn = None
            if args.writer:
                churn_cfg = {"rpc": rpc, "meta": meta, "rate": args.writer_rate}
                churn = subprocess.Popen(
                    [sys.executable, str(HERE), "--churn", json.dumps(churn_cfg)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                    env=dict(os.environ, **env),
                )  # fmt: skip
                if churn.stdout is None or not churn.stdout.readline().startswith('{"ready"'):
                    raise RuntimeError("the concurrent writer did not start")
            try:
                for shape, sizes in SHAPES.items():
                    prefix = f"{shape}-{path}"
                    src = np.random.default_rng(5).integers(0, 256, sum(sizes) * PAGES, np.uint8)
                    base = int(src.ctypes.data)
                    w.register_buffer(base, src.nbytes)
                    keys, ptrs, lens = [], [], []
                    for p in range(PAGES):
                        for j, k in enumerate(keys_of(prefix, p, len(sizes))):
                            keys.append(k)
                            ptrs.append(base + (p * len(sizes) + j) * sizes[0])
                            lens.append(sizes[j])
                    if any(rc != 0 for rc in w.batch_put_from(keys, ptrs, lens)):
                        raise RuntimeError("the 200-page batch failed")
                    w.unregister_buffer(base)
                    lat = read_loop(w, prefix, sizes, args.iters)
                    rows.append({"shape": shape, "who": "same-proc", "path": path, "lat": lat})
                    cfg = {"rpc": rpc, "meta": meta, "prefix": prefix, "sizes": sizes,
                           "iters": args.iters}  # fmt: skip
                    r = subprocess.run(
                        [sys.executable, str(HERE), "--reader", json.dumps(cfg)],
                        capture_output=True, text=True, timeout=600, check=False,
                        env=dict(os.environ, **env),
                    )  # fmt: skip
                    lines = [ln for ln in r.stdout.splitlines() if ln.startswith('{"lat"')]
                    if r.returncode != 0 or not lines:
                        raise RuntimeError(f"reader failed: {r.stderr[-2000:]}")
                    rows.append({"shape": shape, "who": "other-proc", "path": path,
                                 "lat": json.loads(lines[-1])["lat"]})  # fmt: skip
            finally:
                if churn is not None:
                    writer_rates += stop_writer(churn)
                w.close()
    out = []
    for r in rows:
        by_op = r.pop("lat")
        for op, lat in by_op.items():
            lat = sorted(lat)
            stats = {
                "p50": lat[len(lat) // 2] * 1e6,
                "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e6,
                "max": lat[-1] * 1e6,
            }
            if op == "get":
                r.update(stats)
            else:
                r[op] = stats
        out.append(r)
    if writer_rates:
        out.append({"writer_rounds_per_s": writer_rates})
    print(json.dumps({"rows": out}), flush=True)
    return 0


def run_side(
    name: str, python: str, master: str, iters: int, writer: bool, rate: float
) -> list[dict[str, Any]] | str:
    extra = ["--iters", str(iters)]
    if writer:
        extra += ["--writer", "--writer-rate", str(rate)]
    rows: list[dict[str, Any]] | str = side_rows(HERE, name, python, master, extra, 1800)
    return rows


def main() -> int:
    ap = comparison_parser(__doc__, side_options=("--reader", "--churn"))
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--writer", action="store_true", help="a concurrent writer process")
    ap.add_argument("--writer-rate", type=float, default=0.0, help="writer rounds/s cap; 0: none")
    args = ap.parse_args()
    if args.reader:
        return reader_main(json.loads(args.reader))
    if args.churn:
        return churn_main(json.loads(args.churn))
    if args.side:
        return side_main(args)
    sides = find_sides(args.only, args.upstream_python)
    res: dict[str, Any] = {}
    loads: list[str] = []
    run_sides(
        sides,
        lambda name, python, master: run_side(
            name, python, master, args.iters, args.writer, args.writer_rate
        ),
        res,
        loads,
    )
    if args.writer:
        pace = f"at most {args.writer_rate:g} rounds/s" if args.writer_rate > 0 else "flat out"
        print(f"with a concurrent writer process (16 x 64 KiB puts and removes a round, {pace})")
        for name, rows in res.items():
            made = [
                x for r in rows if isinstance(r, dict) for x in r.get("writer_rounds_per_s", [])
            ]
            if isinstance(rows, list) and made:
                print(f"# {name}'s writer made {', '.join(f'{x:.0f}' for x in made)} rounds/s")
    keyed = {
        name: {(r["shape"], r["who"], r["path"]): r for r in rows if "shape" in r}
        for name, rows in res.items()
        if isinstance(rows, list)
    }
    hdr = (f"{'page':7s} {'reader':10s} {'path':9s} | {'ours p50':>9s} {'p99':>8s} {'max':>8s} | "
           f"{'up p50':>8s} {'p99':>8s} {'max':>8s} | {'p50 x':>6s} {'p99 x':>6s}")  # fmt: skip
    print_table_head(res, hdr)
    for cell in CELLS:
        o = keyed.get("ours", {}).get(cell)
        u = keyed.get("upstream", {}).get(cell)
        oc = (
            f"{o['p50']:9.0f} {o['p99']:8.0f} {o['max']:8.0f}"
            if o
            else f"{'-':>9s} {'-':>8s} {'-':>8s}"
        )
        uc = (
            f"{u['p50']:8.0f} {u['p99']:8.0f} {u['max']:8.0f}"
            if u
            else f"{'-':>8s} {'-':>8s} {'-':>8s}"
        )
        rx = (
            f"{o['p50'] / u['p50']:6.2f} {o['p99'] / u['p99']:6.2f}"
            if o and u
            else f"{'-':>6s} {'-':>6s}"
        )
        print(f"{cell[0]:7s} {cell[1]:10s} {cell[2]:9s} | {oc} | {uc} | {rx}")
    print()
    print("existence checks (µs; ratio = ours / upstream)")
    print(f"{'page':7s} {'reader':10s} {'path':9s} {'call':16s} | {'ours p50':>9s} {'p99':>8s} | "
          f"{'up p50':>8s} {'p99':>8s} | {'p50 x':>6s} {'p99 x':>6s}")  # fmt: skip
    for cell in CELLS:
        o = keyed.get("ours", {}).get(cell)
        u = keyed.get("upstream", {}).get(cell)
        for op in EXIST_OPS:
            oo = o.get(op) if o else None
            uu = u.get(op) if u else None
            oc = f"{oo['p50']:9.0f} {oo['p99']:8.0f}" if oo else f"{'-':>9s} {'-':>8s}"
            uc = f"{uu['p50']:8.0f} {uu['p99']:8.0f}" if uu else f"{'-':>8s} {'-':>8s}"
            rx = (
                f"{oo['p50'] / uu['p50']:6.2f} {oo['p99'] / uu['p99']:6.2f}"
                if oo and uu
                else f"{'-':>6s} {'-':>6s}"
            )
            print(f"{cell[0]:7s} {cell[1]:10s} {cell[2]:9s} {op:16s} | {oc} | {uc} | {rx}")
    for line in loads:
        print(line)
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
