#!/usr/bin/env python3
"""Mooncake store benchmark: this project vs the upstream 0.3.13 wheel.

    python benchmarks/store_bench.py                # both sides, full run (~5 min)
    python benchmarks/store_bench.py --quick        # ~1 min
    python benchmarks/store_bench.py --only upstream --json out.json

The "ours" side runs with the current interpreter (its ``mooncake`` package and
the ``mooncake_master`` next to it or on PATH). The "upstream" side re-invokes
this script with ``/work/venv-upstream/bin/python`` (see upstream_env.sh) and
``MOONCAKE_MASTER_BIN`` pointing at upstream's master. Each side starts its own
master on free ports. One table is printed with both figures and ours/upstream.

Scenarios:
  inproc     one client owns the segment and reads/writes it
  xproc      a writer child owns the segment and puts; this process, a pure
             client (global_segment_size=0), reads (same-host path for ours)
  xproc-tcp  as xproc with MC_FORCE_TCP=1 and MC_STORE_SAME_HOST=off in the reader
  ranges     get_into_ranges of 64-byte rows (1/16/256/4096 ranges per call)

Units: GB/s (1e9 B/s) for bandwidth rows, ops/s for 4 KiB rows, rows/s for ranges.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    KiB,
    MiB,
    add_rounds,
    comparison_parser,
    env_overrides,
    find_ours_master,
    find_upstream_master,
    new_store,
    print_footer,
    print_table_head,
    rows_by_key,
    run_rounds,
    running_master,
    side_rows,
    write_json,
)

SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB]
RANGE_COUNTS = [1, 16, 256, 4096]
ROW = 64
HERE = Path(__file__).resolve()


# ------------------------------------------------------------------ utilities


def size_label(size: int) -> str:
    return f"{size // MiB}MiB" if size >= MiB else f"{size // KiB}KiB"


class Params:
    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.total = (48 if quick else 192) * MiB  # bytes moved per measurement
        self.max_ops = 600 if quick else 3000  # cap for small objects
        self.range_calls = 0.4 if quick else 1.2  # seconds per ranges measurement
        self.repeats = 3 if quick else 5  # timed passes per figure; the median is reported
        self.segment = self.total + 64 * MiB

    def count(self, size: int) -> int:
        return max(2, min(self.max_ops, self.total // size))


def batch_slices(n: int, size: int) -> list[tuple[int, int]]:
    per = max(1, min(64, (32 * MiB) // size))
    return [(i, min(n, i + per)) for i in range(0, n, per)]


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def check_all(rcs: list[int], want: int, what: str) -> None:
    bad = [r for r in rcs if r != want]
    if bad:
        raise RuntimeError(f"{what}: {len(bad)} calls returned {bad[:3]} (want {want})")


# ------------------------------------------------------------------ operations


class Ops:
    """Write/read workloads over one store, using one source and one dest buffer."""

    def __init__(self, store: Any, p: Params) -> None:
        import numpy as np

        self.s = store
        self.p = p
        self.src = np.random.default_rng(7).integers(0, 256, p.total + 16 * MiB, np.uint8)
        self.dst = np.zeros(p.total + 16 * MiB, np.uint8)
        self.src_ptr = int(self.src.ctypes.data)
        self.dst_ptr = int(self.dst.ctypes.data)
        for ptr, arr in ((self.src_ptr, self.src), (self.dst_ptr, self.dst)):
            rc = store.register_buffer(ptr, arr.nbytes)
            if rc != 0:
                raise RuntimeError(f"register_buffer returned {rc}")
        self.values: dict[int, list[bytes]] = {}

    def keys(self, prefix: str, size: int, n: int) -> list[str]:
        return [f"{prefix}-{size}-{i}" for i in range(n)]

    def write(self, method: str, keys: list[str], size: int) -> float:
        s, n = self.s, len(keys)
        if method == "put":
            vals = [self.src[i * size : (i + 1) * size].tobytes() for i in range(n)]

            def run() -> None:
                check_all([s.put(k, v) for k, v in zip(keys, vals, strict=True)], 0, "put")

        elif method == "put_from":

            def run() -> None:
                rcs = [s.put_from(k, self.src_ptr + i * size, size) for i, k in enumerate(keys)]
                check_all(rcs, 0, "put_from")

        else:

            def run() -> None:
                for a, b in batch_slices(n, size):
                    ptrs = [self.src_ptr + i * size for i in range(a, b)]
                    rcs = s.batch_put_from(keys[a:b], ptrs, [size] * (b - a))
                    check_all(rcs, 0, "batch_put_from")

        return timed(run)

    def read(self, method: str, keys: list[str], size: int) -> float:
        s, n = self.s, len(keys)
        if method == "get":

            def run() -> None:
                for k in keys:
                    if len(s.get(k)) != size:
                        raise RuntimeError(f"get {k} failed")

        elif method == "get_into":

            def run() -> None:
                rcs = [s.get_into(k, self.dst_ptr + i * size, size) for i, k in enumerate(keys)]
                check_all(rcs, size, "get_into")

        else:

            def run() -> None:
                for a, b in batch_slices(n, size):
                    ptrs = [self.dst_ptr + i * size for i in range(a, b)]
                    rcs = s.batch_get_into(keys[a:b], ptrs, [size] * (b - a))
                    check_all(rcs, size, "batch_get_into")

        return timed(run)

    def verify(self, keys: list[str], size: int) -> None:
        n = len(keys)
        if (self.dst[: n * size] != self.src[: n * size]).any():
            raise RuntimeError("read bytes differ from written bytes")

    def ranges(self, key: str, table_rows: int, count: int, seconds: float) -> float:
        """rows/s for get_into_ranges with ``count`` random 64-byte rows per call."""
        import numpy as np

        rng = np.random.default_rng(count)
        rows = rng.integers(0, table_rows, count)
        src = [int(r) * ROW for r in rows]
        dst = [i * ROW for i in range(count)]
        sizes = [ROW] * count
        calls, t0 = 0, time.perf_counter()
        while True:
            r = self.s.get_into_ranges([self.dst_ptr], [[key]], [[dst]], [[src]], [[sizes]])
            bad = [v for v in r[0][0] if v != ROW]
            if bad:
                raise RuntimeError(
                    f"get_into_ranges: {len(bad)}/{count} ranges failed, e.g. {sorted(set(bad))[:4]}"
                )
            calls += 1
            el = time.perf_counter() - t0
            if el >= seconds and calls >= 3:
                return calls * count / el


def figure(size: int, n: int, secs: float) -> tuple[float, str]:
    if size <= 4 * KiB:
        return n / secs, "ops/s"
    return n * size / secs / 1e9, "GB/s"


# ------------------------------------------------------------------ writer child


def writer_main(args: argparse.Namespace) -> int:
    p = Params(args.quick)
    store = new_store(args.rpc, args.meta, p.segment, 64 * MiB)
    ops = Ops(store, p)
    print(json.dumps({"ready": True, "host": store.get_hostname()}), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["op"] == "exit":
            break
        try:
            if msg["op"] == "fill":
                keys = ops.keys(msg["prefix"], msg["size"], msg["n"])
                reply: dict[str, Any] = {"secs": ops.write("batch_put_from", keys, msg["size"])}
            elif msg["op"] == "put_table":
                n = msg["bytes"]
                rc = store.put_from(msg["key"], ops.src_ptr, n)
                reply = {"rc": rc}
            elif msg["op"] == "clear":
                reply = {"removed": store.remove_all(True)}
            else:
                reply = {"error": f"unknown op {msg['op']}"}
        except Exception as e:  # noqa: BLE001 - reported to the parent
            reply = {"error": repr(e)}
        print(json.dumps(reply), flush=True)
    store.close()
    return 0


class Writer:
    def __init__(self, rpc: str, meta: str, quick: bool) -> None:
        cmd = [sys.executable, str(HERE), "--writer", "--rpc", rpc, "--meta", meta]
        if quick:
            cmd.append("--quick")
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.hello = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("writer child died")
        msg = json.loads(line)
        if "error" in msg:
            raise RuntimeError(f"writer: {msg['error']}")
        return msg

    def call(self, **msg: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call(op="exit")
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


# ------------------------------------------------------------------ one side


PAIRS = [("put", "get"), ("put_from", "get_into"), ("batch_put_from", "batch_get_into")]


def side_main(args: argparse.Namespace) -> int:
    p = Params(args.quick)
    os.environ["MOONCAKE_MASTER_BIN"] = args.master_bin
    rows: list[dict[str, Any]] = []

    def add(scenario: str, op: str, size: str, value: float, unit: str) -> None:
        rows.append({"scenario": scenario, "op": op, "size": size, "value": value, "unit": unit})
        print(f"  {scenario:10s} {op:15s} {size:>6s} {value:14.3f} {unit}", file=sys.stderr)

    with running_master(args.master_bin) as (rpc, meta):
        # ---- in-process
        store = new_store(rpc, meta, p.segment, 64 * MiB)
        ops = Ops(store, p)
        for size in SIZES:
            n = p.count(size)
            for wm, rm in PAIRS:
                keys = ops.keys(wm, size, n)
                ops.write(wm, keys[:2], size)  # warm-up
                wsecs, rsecs = [], []
                for _ in range(p.repeats):
                    store.remove_all(True)
                    wsecs.append(ops.write(wm, keys, size))
                    rsecs.append(ops.read(rm, keys, size))
                    if rm != "get":
                        ops.verify(keys, size)
                add("inproc", wm, size_label(size), *figure(size, n, median(wsecs)))
                add("inproc", rm, size_label(size), *figure(size, n, median(rsecs)))
                store.remove_all(True)
        # ranges, in-process
        table_rows = 4096 * 16
        rc = store.put_from("table", ops.src_ptr, table_rows * ROW)
        if rc != 0:
            raise RuntimeError(f"put table: {rc}")
        for c in RANGE_COUNTS:
            add(
                "inproc",
                "get_into_ranges",
                f"{c}r",
                ops.ranges("table", table_rows, c, p.range_calls),
                "rows/s",
            )
        store.remove_all(True)
        store.close()

        # ---- cross-process
        writer = Writer(rpc, meta, args.quick)
        try:
            for scenario, env in (
                ("xproc", {}),
                ("xproc-tcp", {"MC_FORCE_TCP": "1", "MC_STORE_SAME_HOST": "off"}),
            ):
                with env_overrides(env):
                    reader = new_store(rpc, meta, 0, 64 * MiB)
                    rops = Ops(reader, p)
                    for size in SIZES:
                        n = p.count(size)
                        writer.call(op="fill", prefix="x", size=size, n=n)
                        keys = rops.keys("x", size, n)
                        rops.read("get_into", keys[:2], size)  # warm-up / mapping
                        for rm in ("get", "get_into", "batch_get_into"):
                            secs = median([rops.read(rm, keys, size) for _ in range(p.repeats)])
                            add(scenario, rm, size_label(size), *figure(size, n, secs))
                        rops.verify(keys, size)
                        writer.call(op="clear")
                    r = writer.call(op="put_table", key="table", bytes=table_rows * ROW)
                    if r.get("rc") != 0:
                        raise RuntimeError(f"writer put table: {r}")
                    rops.ranges("table", table_rows, 16, 0.05)  # warm-up
                    for c in RANGE_COUNTS:
                        add(
                            scenario,
                            "get_into_ranges",
                            f"{c}r",
                            rops.ranges("table", table_rows, c, p.range_calls),
                            "rows/s",
                        )
                    writer.call(op="clear")
                    reader.close()
        finally:
            writer.close()
    print(json.dumps({"rows": rows}), flush=True)
    return 0


# ------------------------------------------------------------------ orchestration


def run_side(
    name: str,
    python: str,
    master: str,
    quick: bool,
    script: Path = HERE,
    timeout: float = 900,
    env: dict[str, str] | None = None,
) -> list[dict[str, Any]] | str:
    """``script``'s rows for side ``name`` (``--quick`` when ``quick``), its environment
    this one's plus ``MOONCAKE_MASTER_BIN`` and ``env``."""
    side_env = dict(os.environ, MOONCAKE_MASTER_BIN=master, **(env or {}))
    rows: list[dict[str, Any]] | str = side_rows(
        script, name, python, master, ["--quick"] if quick else [], timeout, side_env
    )
    return rows


def print_table(results: dict[str, list[dict[str, Any]] | str]) -> None:
    table = rows_by_key(results)
    hdr = (
        f"{'scenario':10s} {'op':16s} {'size':>6s} {'unit':>6s} {'ours':>12s} "
        f"{'upstream':>12s} {'ours/up':>8s}"
    )
    print_table_head(results, hdr)
    for k, sides in table.items():
        unit = next(iter(sides.values()))["unit"]
        ours, up = (sides[s]["value"] if s in sides else None for s in ("ours", "upstream"))
        ratio = f"{ours / up:8.2f}" if ours is not None and up else f"{'-':>8s}"

        def fmt(v: float | None, unit: str = unit) -> str:
            if v is None:
                return f"{'-':>12s}"
            return f"{v:12.3f}" if unit == "GB/s" else f"{v:12.0f}"

        print(f"{k[0]:10s} {k[1]:16s} {k[2]:>6s} {unit:>6s} {fmt(ours)} {fmt(up)} {ratio}")


def main() -> int:
    ap = comparison_parser(
        __doc__, "~1 minute run", "write all figures as JSON", ("--rpc", "--meta"), "--writer"
    )
    add_rounds(ap, 1)
    args = ap.parse_args()
    if args.writer:
        return writer_main(args)
    if args.side:
        return side_main(args)
    return compare(HERE, args)


def merge_rounds(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One side's rows over several rounds: each row's median value."""
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    values: dict[tuple[str, str, str], list[float]] = {}
    for rows in runs:
        for r in rows:
            k = (r["scenario"], r["op"], r["size"])
            merged.setdefault(k, dict(r))
            values.setdefault(k, []).append(r["value"])
    for k, row in merged.items():
        row["value"] = median(values[k])
        row["rounds"] = values[k]
    return list(merged.values())


def compare(script: Path, args: argparse.Namespace) -> int:
    """Run ``script``'s side mode for ours and upstream, print one table (main of both benches).

    With ``args.rounds`` > 1 the sides alternate which runs first (ours first
    in odd rounds, upstream first in even ones) and each row is the median over
    the rounds: the side that runs first takes whatever state the machine was
    left in (on a VM with free page reporting, its first allocations of fresh
    pages cost a hypervisor fault each), the second inherits pages the first
    just freed. Alternating gives both sides both positions.
    """
    sides: dict[str, tuple[str, str | None, str]] = {}
    if args.only in (None, "ours"):
        sides["ours"] = (sys.executable, find_ours_master(), "mooncake_master not found")
    if args.only in (None, "upstream"):
        up_py = Path(args.upstream_python)
        sides["upstream"] = (
            str(up_py),
            find_upstream_master(up_py) if up_py.exists() else None,
            f"upstream venv not found at {up_py} (run benchmarks/upstream_env.sh)",
        )
    rounds = max(1, getattr(args, "rounds", 1))
    loads: list[str] = []
    t0 = time.monotonic()
    found = {name: (python, master) for name, (python, master, _) in sides.items() if master}
    runs, failures = run_rounds(
        list(found),
        rounds,
        lambda name: run_side(name, found[name][0], found[name][1], args.quick, script),
        loads,
    )
    for name, (_, master, missing) in sides.items():
        if master is None:
            runs[name] = []
            failures[name] = missing
    results: dict[str, list[dict[str, Any]] | str] = {}
    for name in sides:
        results[name] = merge_rounds(runs[name]) if runs[name] else failures[name]
    print_table(results)
    if rounds > 1:
        print(f"# {rounds} rounds, sides alternating which runs first; each figure is the median")
    print_footer(t0, args.quick, loads)
    write_json(args.json, {"quick": args.quick, "rounds": rounds, "results": results})
    ok = any(not isinstance(v, str) for v in results.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
