#!/usr/bin/env python3
"""How the metadata service's cost grows with the number of objects: this
project vs the upstream wheel, in one run.

    python benchmarks/scale_bench.py                   # 10k, 100k, 1M objects (~6 min)
    python benchmarks/scale_bench.py --counts 10000,100000
    python benchmarks/scale_bench.py --counts 10000000 --only ours   # 10M (needs ~12 GiB)
    python benchmarks/scale_bench.py --rounds 3        # median of 3 rounds per side

For each object count N, each side starts a fresh master and one client that
lends a segment big enough for N objects of 1 KiB, and then:

- puts N objects with ``batch_put_from`` in batches of 512 (put ops/s);
- samples single-object ``get_into`` of random keys (p50, p99 in µs);
- times ``batch_get_into`` and ``batch_is_exist`` of 128 random keys (keys/s);
- reads the master's RSS (``/proc/<pid>/status``) before the first put and
  after the last: bytes per object is the growth over N;
- waits for the read leases to lapse, times ``remove_all()`` and reads the
  master's RSS again (how much of the growth is given back).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    KiB,
    comparison_parser,
    find_sides,
    print_failures,
    print_footer,
    run_rounds,
    side_rows,
    start_master,
    write_json,
)
from store_bench import new_store

OBJ = 1 * KiB
BATCH = 512
SAMPLES = 2000
LEASE_MS = 1000
HERE = Path(__file__).resolve()


def rss(pid: int) -> int:
    """Resident bytes of ``pid`` (``VmRSS``)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def one_count(master_bin: str, n: int) -> dict[str, Any]:
    import numpy as np

    proc, rpc, meta = start_master(
        master_bin,
        [f"--default_kv_lease_ttl={LEASE_MS}", "--eviction_high_watermark_ratio=0.99"],
        timeout=20,
    )
    try:
        seg = (n * OBJ * 11) // 10 + (64 << 20)
        s = new_store(rpc, meta, seg, 64 << 20)
        src = np.random.default_rng(1).integers(0, 256, BATCH * OBJ, np.uint8)
        dst = np.zeros(128 * OBJ, np.uint8)
        s.register_buffer(int(src.ctypes.data), src.nbytes)
        s.register_buffer(int(dst.ctypes.data), dst.nbytes)
        time.sleep(0.5)  # let the master settle before its baseline
        rss0 = rss(proc.pid)
        ptrs = [int(src.ctypes.data) + i * OBJ for i in range(BATCH)]
        sizes = [OBJ] * BATCH
        t0 = time.perf_counter()
        for start in range(0, n, BATCH):
            m = min(BATCH, n - start)
            keys = [f"key-{i:09d}" for i in range(start, start + m)]
            rcs = s.batch_put_from(keys, ptrs[:m], sizes[:m])
            if any(rc != 0 for rc in rcs):
                raise RuntimeError(f"batch_put_from failed: {set(rcs)}")
        put_s = time.perf_counter() - t0
        rss1 = rss(proc.pid)
        rnd = random.Random(7)
        lat = []
        p = int(dst.ctypes.data)
        for _ in range(SAMPLES):
            k = f"key-{rnd.randrange(n):09d}"
            t = time.perf_counter()
            if s.get_into(k, p, OBJ) != OBJ:
                raise RuntimeError("get_into failed")
            lat.append(time.perf_counter() - t)
        lat.sort()
        dptrs = [p + i * OBJ for i in range(128)]
        # The same number of batches at every count, so that the small
        # counts are timed over as long a window as the large ones.
        rounds = 400

        def batch_keys() -> list[str]:
            return [f"key-{rnd.randrange(n):09d}" for _ in range(128)]

        t = time.perf_counter()
        for _ in range(rounds):
            got = s.batch_get_into(batch_keys(), dptrs, [OBJ] * 128)
            if any(g != OBJ for g in got):
                raise RuntimeError("batch_get_into failed")
        bget = 128 * rounds / (time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(rounds):
            s.batch_is_exist(batch_keys())
        bexist = 128 * rounds / (time.perf_counter() - t)
        time.sleep(LEASE_MS / 1000 + 0.3)  # every read lease lapsed
        t = time.perf_counter()
        removed = s.remove_all()
        remove_s = time.perf_counter() - t
        time.sleep(0.5)
        rss2 = rss(proc.pid)
        s.close()
        return {
            "n": n,
            "put_ops": n / put_s,
            "get_p50_us": lat[len(lat) // 2] * 1e6,
            "get_p99_us": lat[int(len(lat) * 0.99)] * 1e6,
            "bget_keys": bget,
            "bexist_keys": bexist,
            "rss_empty": rss0,
            "bytes_per_obj": (rss1 - rss0) / n,
            "removed": removed,
            "remove_all_s": remove_s,
            "rss_after_remove_over_empty": (rss2 - rss0),
        }
    finally:
        proc.kill()
        proc.wait()


def side_main(args: argparse.Namespace) -> int:
    rows = []
    for n in [int(c) for c in args.counts.split(",")]:
        rows.append(one_count(args.master_bin, n))
        print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    print(json.dumps({"rows": rows}), flush=True)
    return 0


def run_side(name: str, python: str, master: str, counts: str) -> list[dict[str, Any]] | str:
    rows: list[dict[str, Any]] | str = side_rows(
        HERE, name, python, master, ["--counts", counts], 3600
    )
    return rows


def fmt_n(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def print_table(res: dict[str, Any]) -> None:
    print_failures(res)
    cols = [
        ("put ops/s", "put_ops", "{:.0f}"),
        ("get p50 µs", "get_p50_us", "{:.1f}"),
        ("get p99 µs", "get_p99_us", "{:.1f}"),
        ("bget keys/s", "bget_keys", "{:.0f}"),
        ("exist keys/s", "bexist_keys", "{:.0f}"),
        ("B/object", "bytes_per_obj", "{:.0f}"),
        ("remove_all s", "remove_all_s", "{:.3f}"),
        ("RSS after rm MiB", "rss_after_remove_over_empty", "{:.1f}"),
    ]
    print(f"{'objects':>7s} {'side':9s} " + " ".join(f"{c[0]:>16s}" for c in cols))
    by_n: dict[int, dict[str, dict[str, Any]]] = {}
    for side, rows in res.items():
        if isinstance(rows, list):
            for r in rows:
                by_n.setdefault(r["n"], {})[side] = r
    for n, per in sorted(by_n.items()):
        for side, r in per.items():
            vals = []
            for _, key, f in cols:
                v = r[key] / (1 << 20) if key == "rss_after_remove_over_empty" else r[key]
                vals.append(f.format(v))
            print(f"{fmt_n(n):>7s} {side:9s} " + " ".join(f"{v:>16s}" for v in vals))
        if "ours" in per and "upstream" in per:
            o, u = per["ours"], per["upstream"]
            ratios = [
                f"put {o['put_ops'] / u['put_ops']:.2f}x",
                f"get p50 {o['get_p50_us'] / u['get_p50_us']:.2f}x",
                f"bget {o['bget_keys'] / u['bget_keys']:.2f}x",
                f"B/obj {o['bytes_per_obj'] / u['bytes_per_obj']:.2f}x",
                f"remove_all {o['remove_all_s'] / u['remove_all_s']:.2f}x",
            ]
            print(f"{'':>7s} {'ours/up':9s} " + ", ".join(ratios))
    ours = [r for r in res.get("ours", []) if isinstance(res.get("ours"), list)]
    if len(ours) >= 2:
        lo, hi = ours[0], ours[-1]
        print(
            f"# ours at {fmt_n(hi['n'])} vs {fmt_n(lo['n'])}: put ops/s "
            f"{hi['put_ops'] / lo['put_ops']:.2f}x, batch_get_into keys/s "
            f"{hi['bget_keys'] / lo['bget_keys']:.2f}x"
        )


def median_rows(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each count's figures, the median over the rounds' rows for it."""
    return [
        {
            k: v if k == "n" else statistics.median(run[i][k] for run in runs)
            for k, v in runs[0][i].items()
        }
        for i in range(len(runs[0]))
    ]


def main() -> int:
    ap = comparison_parser(__doc__)
    ap.add_argument("--counts", default="10000,100000,1000000")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds, the sides alternating which runs first; each figure is the median",
    )
    args = ap.parse_args()
    if args.side:
        return side_main(args)
    sides = find_sides(args.only, args.upstream_python)
    res: dict[str, Any] = {}
    loads: list[str] = []
    t0 = time.monotonic()
    found = {name: (python, master) for name, (python, master) in sides.items() if master}
    runs, failures = run_rounds(
        list(found),
        args.rounds,
        lambda name: run_side(name, found[name][0], found[name][1], args.counts),
        loads,
    )
    for name in sides:
        if runs.get(name):
            res[name] = median_rows(runs[name])
        else:
            res[name] = failures.get(name, "master not found")
    print_table(res)
    if args.rounds > 1:
        print(
            f"# {args.rounds} rounds, sides alternating which runs first; each figure is the median"
        )
    print_footer(t0, loads=loads)
    write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
