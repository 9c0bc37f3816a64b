#!/usr/bin/env python3
"""Upserts of a hot key under concurrent readers: this project vs the upstream wheel.

    python benchmarks/upsert_bench.py                  # both sides (~3 min)
    python benchmarks/upsert_bench.py --quick          # shorter cells
    python benchmarks/upsert_bench.py --baseline-python /path/venv/bin/python
                                                       # adds a third side, "before"

One process upserts a key (``upsert_from`` of 1 MiB or 16 MiB) in a loop for
a fixed time while 0, 1 or 4 reader processes loop ``get_into`` of the same
key, on the same host (our mapped path; upstream's TCP) and with TCP forced
(``MC_FORCE_TCP=1``). The writer owns the only segment; readers lend none.
The master runs with ``--default_kv_lease_ttl=500``.

Every value is self-describing: the writer rotates four pre-filled buffers
whose every byte is the same (1..4), so a read that mixes two versions shows
as two different bytes (checked every 512 bytes and at both ends). Reported
per cell: upserts/s and failed upserts, reads/s over all readers, read p50
and p99 (ms), torn reads and failed reads. Units: ops/s, ms, counts.

Our readers move many times more bytes per second than upstream's, and on a
small machine they take the memory bandwidth the writer's copy needs. So
after both sides ran, ours runs once more ("ours@up") with every reader paced
so that all readers together read at upstream's measured reads/s for that
cell: the writer then competes with the same read load on both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    MiB,
    comparison_parser,
    env_overrides,
    find_sides,
    new_store,
    print_footer,
    run_noted,
    run_sides,
    running_master,
    side_rows,
    write_json,
)

SIZES = [1 * MiB, 16 * MiB]
READERS = [0, 1, 4]
MODES = {"same_host": {}, "tcp": {"MC_FORCE_TCP": "1"}}
HERE = Path(__file__).resolve()
FILLS = (1, 2, 3, 4)


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


# ------------------------------------------------------------------ reader process


def reader_main(args: argparse.Namespace) -> int:
    import numpy as np

    cfg = json.loads(args.reader)
    s = new_store(cfg["rpc"], cfg["meta"], 0, 64 * MiB)
    size = int(cfg["size"])
    dst = np.zeros(size, np.uint8)
    p = int(dst.ctypes.data)
    s.register_buffer(p, size)
    key, ready, stop = cfg["key"], Path(cfg["ready"]), Path(cfg["stop"])
    # Reads per second this reader keeps to (0: as fast as it can).
    rate = float(cfg.get("rate") or 0)
    stamps: list[tuple[float, float]] = []
    torn = failed = 0
    announced = False
    paced_from = time.monotonic()
    n = 0
    while not stop.exists():
        if rate:
            n += 1
            wait = paced_from + n / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        t0 = time.monotonic()
        rc = s.get_into(key, p, size)
        t1 = time.monotonic()
        if rc != size:
            failed += announced
            continue
        sample = dst[::512]
        if not (bool(np.all(sample == sample[0])) and dst[-1] == sample[0]):
            torn += 1
        stamps.append((t0, t1))
        if not announced:
            Path(ready, str(os.getpid())).touch()
            announced = True
    s.close()
    print(json.dumps({"stamps": stamps, "torn": torn, "failed": failed}), flush=True)
    return 0


# ------------------------------------------------------------------ one side


def run_cell(
    rpc: str,
    meta: str,
    writer: Any,
    bufs: list[Any],
    size: int,
    n_readers: int,
    secs: float,
    env: dict[str, str],
    read_rate: float = 0.0,
) -> dict[str, Any]:
    key = f"hot-{size}-{n_readers}-{time.monotonic_ns()}"
    ptrs = [int(b.ctypes.data) for b in bufs]
    if writer.upsert_from(key, ptrs[0], size) != 0:
        raise RuntimeError("the first upsert failed")
    tmp = Path(tempfile.mkdtemp(prefix="upsert-bench-"))
    ready, stop = tmp / "ready", tmp / "stop"
    ready.mkdir()
    cfg = {
        "rpc": rpc,
        "meta": meta,
        "size": size,
        "key": key,
        "ready": str(ready),
        "stop": str(stop),
        "rate": read_rate / n_readers if n_readers else 0,
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE), "--reader", json.dumps(cfg)],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, **env),
        )
        for _ in range(n_readers)
    ]
    try:
        deadline = time.monotonic() + 60
        while len(list(ready.iterdir())) < n_readers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("readers did not start")
            time.sleep(0.01)
        ok = bad = 0
        i = 0
        t_start = time.monotonic()
        t_end = t_start + secs
        while time.monotonic() < t_end:
            i += 1
            if writer.upsert_from(key, ptrs[i % len(ptrs)], size) == 0:
                ok += 1
            else:
                bad += 1
        t_end = time.monotonic()
        stop.touch()
        outs = [json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in procs]
    finally:
        stop.touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    lat = [(b - a) * 1e3 for o in outs for a, b in o["stamps"] if t_start <= a and b <= t_end]
    span = t_end - t_start
    return {
        "upserts_s": ok / span,
        "failed_upserts": bad,
        "reads_s": len(lat) / span if n_readers else None,
        "read_p50_ms": percentile(lat, 0.5) if lat else None,
        "read_p99_ms": percentile(lat, 0.99) if lat else None,
        "torn": sum(o["torn"] for o in outs),
        "failed_reads": sum(o["failed"] for o in outs),
    }


def side_main(args: argparse.Namespace) -> int:
    import numpy as np

    secs = 1.0 if args.quick else 2.0
    # Paced readers: total reads/s per "mode/size/readers" cell.
    rates: dict[str, float] = json.loads(args.read_rates) if args.read_rates else {}
    rows = []
    for mode, env in MODES.items():
        with (
            env_overrides(env),
            running_master(args.master_bin, ["--default_kv_lease_ttl=500"]) as (
                rpc,
                meta,
            ),
        ):
            writer = new_store(rpc, meta, 512 * MiB, 64 * MiB)
            try:
                for size in SIZES:
                    bufs = [np.full(size, f, np.uint8) for f in FILLS]
                    for b in bufs:
                        writer.register_buffer(int(b.ctypes.data), size)
                    for n in READERS:
                        rate = rates.get(f"{mode}/{size}/{n}", 0.0)
                        if rates and not rate:
                            continue
                        cell = run_cell(rpc, meta, writer, bufs, size, n, secs, env, rate)
                        rows.append(dict(cell, mode=mode, size=size, readers=n))
                        print(
                            f"  {mode} {size >> 20}MiB readers={n}: {cell}",
                            file=sys.stderr,
                            flush=True,
                        )
                    for b in bufs:
                        writer.unregister_buffer(int(b.ctypes.data))
            finally:
                writer.close()
    print(json.dumps({"rows": rows}), flush=True)
    return 0


# ------------------------------------------------------------------ orchestration


def run_side(
    name: str, python: str, master: str, quick: bool, rates: dict[str, float] | None = None
) -> list[dict[str, Any]] | str:
    extra = ["--quick"] if quick else []
    if rates:
        extra += ["--read-rates", json.dumps(rates)]
    env = dict(os.environ, MOONCAKE_MASTER_BIN=master)
    rows: list[dict[str, Any]] | str = side_rows(HERE, name, python, master, extra, 900, env)
    return rows


def fmt(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}"


def print_table(results: dict[str, list[dict[str, Any]] | str]) -> None:
    sides = [s for s, r in results.items() if not isinstance(r, str)]
    for s, r in results.items():
        if isinstance(r, str):
            print(f"# {s}: {r}")
    if not sides:
        return
    cols = ["upserts/s", "failed", "reads/s", "p50 ms", "p99 ms", "torn", "failed rd"]
    print(
        f"{'mode':9s} {'size':>5s} {'rd':>2s} {'side':8s} "
        + " ".join(f"{c:>9s}" for c in cols)
        + f" {'up/s x':>7s} {'rd/s x':>7s}"
    )
    by: dict[tuple[str, int, int], dict[str, dict[str, Any]]] = {}
    for s in sides:
        for row in results[s]:  # type: ignore[union-attr]
            by.setdefault((row["mode"], row["size"], row["readers"]), {})[s] = row
    for (mode, size, n), per in by.items():
        up = per.get("upstream")
        for s, row in per.items():
            ratio_u = ratio_r = "-"
            if s != "upstream" and up:
                if up["upserts_s"]:
                    ratio_u = f"{row['upserts_s'] / up['upserts_s']:.2f}"
                if n and up["reads_s"]:
                    ratio_r = f"{row['reads_s'] / up['reads_s']:.2f}"
            vals = [
                fmt(row["upserts_s"]),
                str(row["failed_upserts"]),
                fmt(row["reads_s"]),
                fmt(row["read_p50_ms"], 2),
                fmt(row["read_p99_ms"], 2),
                str(row["torn"]),
                str(row["failed_reads"]),
            ]
            print(
                f"{mode:9s} {size >> 20:>3d}Mi {n:>2d} {s:8s} "
                + " ".join(f"{v:>9s}" for v in vals)
                + f" {ratio_u:>7s} {ratio_r:>7s}"
            )


def main() -> int:
    ap = comparison_parser(__doc__, True, None, ("--reader", "--read-rates"))
    ap.add_argument(
        "--baseline-python", help="a venv with an earlier build of ours, shown as 'before'"
    )
    args = ap.parse_args()
    if args.reader:
        return reader_main(args)
    if args.side:
        return side_main(args)
    before: dict[str, tuple[str, str | None]] = {}
    if args.baseline_python:
        base = Path(args.baseline_python)
        before["before"] = (str(base), str(base.parent / "mooncake_master"))
    sides = find_sides(args.only, args.upstream_python, before)
    results: dict[str, list[dict[str, Any]] | str] = {}
    loads: list[str] = []
    t0 = time.monotonic()
    run_sides(
        sides,
        lambda name, python, master: run_side(name, python, master, args.quick),
        results,
        loads,
    )
    up_rows = results.get("upstream")
    if "ours" in sides and isinstance(up_rows, list):
        rates = {
            f"{r['mode']}/{r['size']}/{r['readers']}": r["reads_s"]
            for r in up_rows
            if r["readers"] and r["reads_s"]
        }
        python, master = sides["ours"]
        if master is not None and rates:
            run_noted(
                "ours@up",
                lambda: run_side("ours@up", python, master, args.quick, rates),
                results,
                loads,
            )
    print_table(results)
    print_footer(t0, args.quick, loads)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
