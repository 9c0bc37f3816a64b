#!/usr/bin/env python3
"""Tensor IO benchmark: this project vs the upstream 0.3.13 wheel, in one run.

    python benchmarks/tensor_bench.py            # both sides (~3-6 min)
    python benchmarks/tensor_bench.py --quick    # fewer repeats
    python benchmarks/tensor_bench.py --only ours --json out.json

Tensors are float32 ``[rows, 4096]`` of 1, 16 and 64 MiB. Every read is checked
with ``torch.equal`` against the expected tensor before it is timed (a side
whose result is wrong reports ``wrong`` instead of a figure). Each side starts
its own master; the upstream side runs under ``/work/venv-upstream/bin/python``
with upstream's master (``benchmarks/upstream_env.sh``). The upstream wheel
imports torch lazily; when its venv has none, this repository's ``.venv``
torch is appended to its ``sys.path`` (``MOONCAKE_TORCH_SITE`` overrides).

Scenarios:
  ref        this machine's local copy costs: ``t.clone()`` (one copy into a
             fresh tensor) and ``torch.save`` + ``torch.load`` through BytesIO
  ceiling    bare ``memmove`` of 64 MiB with 1 and 2 threads into memory in
             place and into fresh pages (4 KiB or transparent huge pages):
             what one copy can do on this machine
  inproc     one client owns the segment, writes and reads it
  xproc      a writer child owns the data; this process (a pure client) reads
             (the mapped same-host path for ours)
  xproc-tcp  as xproc with ``MC_FORCE_TCP=1`` / ``MC_STORE_SAME_HOST=off`` in the reader

Ops: put_tensor, get_tensor, get_tensor_into; tp8-write (``put_tensor_with_tp``,
8 shards from the full tensor); tp8-full (``ReadTarget(mode="full")`` of that
set); tp8->2 (both ``shard`` reads of ``TP(r, 2, 0)``, re-sharded from the
TP=8 set); batch-get 32x1MiB (``batch_get_tensor``); batch-par 64 keys
(``batch_get_tensor_with_parallelism``, each key a TP=2 set rebuilt full).
Figures are GB/s (1e9 B/s) of tensor bytes returned or written, the median of
the repeats. For ours, ``rpc/call`` is master RPCs per call and ``moved`` is
bytes read from the store over bytes returned (``get_client_stats``).
"""

from __future__ import annotations

import argparse
import ctypes
import io
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    MiB,
    comparison_parser,
    env_overrides,
    find_sides,
    import_torch,
    json_child,
    print_footer,
    print_table_head,
    rows_by_key,
    running_master,
    stop_child,
    write_json,
)
from store_bench import new_store, run_side

COLS = 4096
SIZES = [1, 16, 64]
HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
# Where this interpreter may borrow torch from when its venv has none: a
# project venv of the same Python version (benchmarks/upstream_env.sh
# installs torch into the upstream venv itself).
TORCH_SITE = os.environ.get(
    "MOONCAKE_TORCH_SITE",
    next(
        (
            str(site)
            for venv in (".venv", ".venv-py310")
            for site in [
                ROOT
                / venv
                / "lib"
                / f"python{sys.version_info[0]}.{sys.version_info[1]}"
                / "site-packages"
            ]
            if site.is_dir()
        ),
        "",
    ),
)


torch = import_torch(TORCH_SITE)


def tensor_of(mib: int, seed: int = 0) -> Any:
    rows = mib * MiB // (4 * COLS)
    return torch.arange(rows * COLS, dtype=torch.float32).reshape(rows, COLS) + seed


def read_target(mode: str, axes: list[Any] | None = None) -> Any:
    """A ReadTarget built the upstream way (no-arg constructors, attributes)."""
    from mooncake.store import ReadTarget, TensorParallelism

    t = ReadTarget()
    t.mode = mode
    if axes is not None:
        p = TensorParallelism()
        p.axes = axes
        t.parallelism = p
    return t


def tp_axis(rank: int, size: int, split_dim: int = 0) -> Any:
    from mooncake.store import ParallelAxis

    a = ParallelAxis()
    a.kind, a.rank, a.size, a.split_dim = "tp", rank, size, split_dim
    return a


MIN_PASS_SECS = 0.05


def median_secs(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds per call over ``repeats`` passes; each pass repeats the
    call enough times to last about ``MIN_PASS_SECS`` (short calls are noise
    otherwise)."""
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-6)
    per_pass = max(1, min(200, int(MIN_PASS_SECS / once)))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(per_pass):
            fn()
        times.append((time.perf_counter() - t0) / per_pass)
    return statistics.median(times)


def equal(a: Any, b: Any) -> bool:
    return a is not None and b is not None and a.shape == b.shape and bool(torch.equal(a, b))


class Side:
    """Measurements of one implementation; rows are JSON-able dicts."""

    def __init__(self, name: str, repeats: int) -> None:
        self.name = name
        self.repeats = repeats
        self.rows: list[dict[str, Any]] = []
        self.ours = name == "ours"

    def row(self, scenario: str, op: str, size: str, value: Any, **extra: Any) -> None:
        self.rows.append({"scenario": scenario, "op": op, "size": size, "value": value, **extra})
        print(f"  {scenario:9s} {op:14s} {size:>8s} {value}", file=sys.stderr, flush=True)

    def stats(self, store: Any) -> dict[str, int] | None:
        return store.get_client_stats() if self.ours else None

    def measure_read(
        self,
        scenario: str,
        op: str,
        size: str,
        store: Any,
        fn: Callable[[], Any],
        check: Callable[[Any], bool],
        nbytes: int,
    ) -> None:
        """Verify ``fn()``'s result, then time it; GB/s of ``nbytes`` per call."""
        got = fn()
        if not check(got):
            self.row(scenario, op, size, "wrong")
            return
        del got
        s0 = self.stats(store)
        fn()
        s1 = self.stats(store)
        secs = median_secs(fn, self.repeats)
        extra: dict[str, Any] = {}
        if s0 is not None and s1 is not None:
            calls = 1
            moved = sum(
                s1[k] - s0[k]
                for k in ("bytes_read_local", "bytes_read_same_host", "bytes_read_tcp")
            )
            extra["rpc_per_call"] = (s1["master_rpcs"] - s0["master_rpcs"]) / calls
            extra["moved"] = moved / (nbytes * calls)
        self.row(scenario, op, size, nbytes / secs / 1e9, **extra)

    def measure_write(
        self,
        scenario: str,
        op: str,
        size: str,
        fn: Callable[[int], int],
        cleanup: Callable[[int], Any],
        nbytes: int,
    ) -> None:
        """Median seconds of ``fn(i)`` (must return 0); each pass writes enough
        distinct keys to last about ``MIN_PASS_SECS`` (at most 512 MiB), then
        ``cleanup`` removes them untimed."""
        t0 = time.perf_counter()
        rc = fn(-1)
        once = max(time.perf_counter() - t0, 1e-6)
        cleanup(-1)
        if rc != 0:
            self.row(scenario, op, size, f"rc {rc}")
            return
        per_pass = max(1, min(int(MIN_PASS_SECS / once), (512 * MiB) // nbytes, 200))
        times = []
        for p in range(self.repeats):
            ids = range(p * per_pass, (p + 1) * per_pass)
            t0 = time.perf_counter()
            rcs = [fn(i) for i in ids]
            times.append((time.perf_counter() - t0) / per_pass)
            for i in ids:
                cleanup(i)
            if any(rcs):
                self.row(scenario, op, size, f"rc {next(r for r in rcs if r)}")
                return
        self.row(scenario, op, size, nbytes / statistics.median(times) / 1e9)


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MAP_FAILED = ctypes.c_void_p(-1).value
MADV_HUGEPAGE = 14


def fresh_pages(n: int, huge: bool) -> tuple[int, int, int]:
    """A new private anonymous mapping of ``n`` bytes, 2 MiB-aligned inside a
    larger one: (mapping, length, aligned address); ``huge`` advises THP."""
    length = n + 2 * MiB
    m = _LIBC.mmap(None, length, 3, 0x22, -1, 0)  # RW, MAP_PRIVATE|MAP_ANONYMOUS
    if m is None or m == MAP_FAILED:
        raise OSError(ctypes.get_errno(), "mmap failed")
    a = (m + 2 * MiB - 1) & ~(2 * MiB - 1)
    if huge:
        _LIBC.madvise(a, n, MADV_HUGEPAGE)
    return m, length, a


def memmove_threads(dst: int, src: int, n: int, threads: int) -> None:
    """``memmove`` of ``n`` bytes cut into ``threads`` parts copied in
    parallel (ctypes releases the GIL during the call)."""
    per = (n // threads) & ~63
    parts = [(i * per, n - i * per if i == threads - 1 else per) for i in range(threads)]
    ts = [
        threading.Thread(target=ctypes.memmove, args=(dst + o, src + o, ln)) for o, ln in parts[1:]
    ]
    for t in ts:
        t.start()
    ctypes.memmove(dst + parts[0][0], src + parts[0][0], parts[0][1])
    for t in ts:
        t.join()


def ceiling_rows(side: Side) -> None:
    """This machine's copy ceilings for 64 MiB, in the same run: a bare
    ``memmove`` into memory already in place (what ``get_tensor_into``
    needs at least) and into fresh pages (what a read into a new tensor
    needs at least), 4 KiB pages or transparent huge pages, 1 and 2 threads."""
    n = 64 * MiB
    src_t = tensor_of(64)
    src = src_t.data_ptr()
    dst_t = torch.empty(n, dtype=torch.uint8)
    dst = dst_t.data_ptr()
    for threads in (1, 2):
        secs = median_secs(lambda th=threads: memmove_threads(dst, src, n, th), side.repeats)
        side.row("ceiling", f"memcpy-resident/{threads}t", "64MiB", n / secs / 1e9)
    for huge in (False, True):
        for threads in (1, 2):

            def fresh(th: int = threads, huge: bool = huge) -> None:
                m, length, a = fresh_pages(n, huge)
                try:
                    memmove_threads(a, src, n, th)
                finally:
                    _LIBC.munmap(m, length)

            secs = median_secs(fresh, side.repeats)
            kind = "thp" if huge else "4k"
            side.row("ceiling", f"memcpy-fresh-{kind}/{threads}t", "64MiB", n / secs / 1e9)


def reference_rows(side: Side) -> None:
    for mib in SIZES:
        t = tensor_of(mib)
        side.row(
            "ref", "t.clone()", f"{mib}MiB", mib * MiB / median_secs(t.clone, side.repeats) / 1e9
        )

        def save_load(t: Any = t) -> Any:
            b = io.BytesIO()
            torch.save(t, b)
            b.seek(0)
            return torch.load(b)

        assert equal(save_load(), t)
        side.row(
            "ref", "save+load", f"{mib}MiB", mib * MiB / median_secs(save_load, side.repeats) / 1e9
        )


def inproc(side: Side, rpc: str, meta: str) -> None:
    s = new_store(rpc, meta, 1536 * MiB, 256 * MiB)
    try:
        for mib in SIZES:
            t = tensor_of(mib)
            n = mib * MiB
            label = f"{mib}MiB"
            side.measure_write(
                "inproc",
                "put_tensor",
                label,
                lambda i, t=t, mib=mib: s.put_tensor(f"w{mib}-{i}", t),
                lambda i, mib=mib: s.remove(f"w{mib}-{i}", True),
                n,
            )
            key = f"t{mib}"
            assert s.put_tensor(key, t) == 0
            side.measure_read(
                "inproc",
                "get_tensor",
                label,
                s,
                lambda key=key: s.get_tensor(key),
                lambda g, t=t: equal(g, t),
                n,
            )
            buf = torch.empty(304 + n, dtype=torch.uint8)
            p = buf.data_ptr()
            side.measure_read(
                "inproc",
                "get_tensor_into",
                label,
                s,
                lambda key=key, p=p, n=n: s.get_tensor_into(key, p, 304 + n),
                lambda g, t=t: equal(g, t),
                n,
            )
            s.remove(key, True)
        t = tensor_of(64)
        n = 64 * MiB
        side.measure_write(
            "inproc",
            "tp8-write",
            "64MiB",
            lambda i: s.put_tensor_with_tp(f"tpw-{i}", t, 0, 8, 0),
            lambda i: [s.remove(f"tpw-{i}_tp_{r}", True) for r in range(8)],
            n,
        )
        tp_set_reads(
            side, "inproc", s, "set", writer=lambda: s.put_tensor_with_tp("set", t, 0, 8, 0)
        )
        for r in range(8):
            s.remove(f"set_tp_{r}", True)
        batch_reads(side, s)
    finally:
        s.close()


def tp_set_reads(
    side: Side, scenario: str, s: Any, key: str, writer: Callable[[], Any] | None
) -> None:
    """tp8-full and tp8->2 of the 64 MiB TP=8 set at ``key``."""
    if writer is not None:
        assert writer() == 0
    t = tensor_of(64)
    n = 64 * MiB
    full_target = read_target("full", [tp_axis(0, 8)])
    side.measure_read(
        scenario,
        "tp8-full",
        "64MiB",
        s,
        lambda: s.get_tensor_with_parallelism(key, full_target),
        lambda g: equal(g, t),
        n,
    )
    halves = [read_target("shard", [tp_axis(r, 2)]) for r in range(2)]
    rows = t.shape[0] // 2

    def reshard() -> list[Any]:
        return [s.get_tensor_with_parallelism(key, h) for h in halves]

    side.measure_read(
        scenario,
        "tp8->2",
        "64MiB",
        s,
        reshard,
        lambda g: equal(g[0], t[:rows]) and equal(g[1], t[rows:]),
        n,
    )
    side.measure_read(
        scenario,
        "get_tensor",
        "8MiB-shard",
        s,
        lambda: s.get_tensor(f"{key}_tp_3"),
        lambda g: equal(g, t[3 * t.shape[0] // 8 : 4 * t.shape[0] // 8]),
        n // 8,
    )


def batch_reads(side: Side, s: Any) -> None:
    from mooncake.store import TensorParallelism

    ts = [tensor_of(1, seed=i) for i in range(64)]
    keys = [f"b{i}" for i in range(32)]
    assert s.batch_put_tensor(keys, ts[:32]) == [0] * 32
    side.measure_read(
        "inproc",
        "batch-get",
        "32x1MiB",
        s,
        lambda: s.batch_get_tensor(keys),
        lambda g: all(equal(a, b) for a, b in zip(g, ts[:32], strict=True)),
        32 * MiB,
    )
    pkeys = [f"p{i}" for i in range(64)]
    rows = ts[0].shape[0] // 2
    for k, t in zip(pkeys, ts, strict=True):
        for r in range(2):
            p = TensorParallelism()
            p.axes = [tp_axis(r, 2)]
            assert s.put_tensor_with_parallelism(k, t[r * rows : (r + 1) * rows], p) == 0
    targets = [read_target("full", [tp_axis(0, 2)]) for _ in pkeys]
    side.measure_read(
        "inproc",
        "batch-par",
        "64x1MiB",
        s,
        lambda: s.batch_get_tensor_with_parallelism(pkeys, targets),
        lambda g: all(equal(a, b) for a, b in zip(g, ts, strict=True)),
        64 * MiB,
    )


# ------------------------------------------------------------------ cross process


def writer_main(args: argparse.Namespace) -> int:
    """Child: hold a TP=8 set of the 64 MiB tensor and a FULL copy; serve until stdin closes."""
    s = new_store(args.rpc, args.meta, 512 * MiB, 128 * MiB)
    t = tensor_of(64)
    rc = [s.put_tensor_with_tp("xset", t, 0, 8, 0), s.put_tensor("xfull", t)]
    print(json.dumps({"rc": rc}), flush=True)
    sys.stdin.read()
    s.close()
    return 0


def xproc(side: Side, rpc: str, meta: str, scenario: str, env: dict[str, str]) -> None:
    cmd = [sys.executable, str(HERE), "--writer", "--rpc", rpc, "--meta", meta]
    child, hello = json_child(cmd)
    try:
        if hello.get("rc") != [0, 0]:
            side.row(scenario, "writer", "-", f"setup failed {hello}")
            return
        with env_overrides(env):
            s = new_store(rpc, meta, 0, 256 * MiB)
        try:
            t = tensor_of(64)
            side.measure_read(
                scenario,
                "get_tensor",
                "64MiB",
                s,
                lambda: s.get_tensor("xfull"),
                lambda g: equal(g, t),
                64 * MiB,
            )
            tp_set_reads(side, scenario, s, "xset", writer=None)
        finally:
            s.close()
    finally:
        stop_child(child)


def side_main(args: argparse.Namespace) -> int:
    side = Side(args.side, 3 if args.quick else 7)
    os.environ["MOONCAKE_MASTER_BIN"] = args.master_bin
    if side.ours:
        reference_rows(side)
        ceiling_rows(side)
    with running_master(args.master_bin) as (rpc, meta):
        inproc(side, rpc, meta)
    with running_master(args.master_bin) as (rpc, meta):
        xproc(side, rpc, meta, "xproc", {})
    with running_master(args.master_bin) as (rpc, meta):
        xproc(side, rpc, meta, "xproc-tcp", {"MC_FORCE_TCP": "1", "MC_STORE_SAME_HOST": "off"})
    print(json.dumps({"rows": side.rows}), flush=True)
    return 0


# ------------------------------------------------------------------ orchestration

TARGETS = {
    ("inproc", "tp8-full"): ">=10x up, >=0.7x clone",
    ("xproc", "tp8-full"): ">=10x up",
    ("xproc-tcp", "tp8-full"): ">=2x up",
    ("inproc", "tp8->2"): ">=10x up, moved<=1.05",
    ("xproc", "tp8->2"): ">=10x up, moved<=1.05",
    ("inproc", "get_tensor"): ">=0.8x clone (16/64)",
    ("inproc", "get_tensor_into"): ">=1.5x up",
    ("inproc", "put_tensor"): ">=1x up",
    ("inproc", "tp8-write"): ">=1x up",
    ("inproc", "batch-get"): ">=2x up, <=3 rpc",
    ("inproc", "batch-par"): ">=2x up, <=3 rpc",
}


def fmt(v: Any) -> str:
    if v is None:
        return f"{'-':>9s}"
    if isinstance(v, (int, float)):
        return f"{v:9.2f}"
    return f"{v!s:>9s}"


def print_table(results: dict[str, list[dict[str, Any]] | str]) -> None:
    table = rows_by_key(results)
    clone = {
        k[2]: v["ours"]["value"]
        for k, v in table.items()
        if k[:2] == ("ref", "t.clone()") and "ours" in v
    }
    hdr = (
        f"{'scenario':10s} {'op':15s} {'size':>10s} {'ours GB/s':>9s} {'up GB/s':>9s} "
        f"{'ours/up':>8s} {'/clone':>7s} {'rpc/call':>8s} {'moved':>6s}  target"
    )
    print_table_head(results, hdr)
    for k, row in table.items():
        o = row.get("ours", {}).get("value")
        u = row.get("upstream", {}).get("value")
        num = isinstance(o, (int, float)) and isinstance(u, (int, float)) and u > 0
        ratio = f"{o / u:8.2f}" if num else f"{'-':>8s}"
        c = clone.get(k[2]) if k[0] not in ("ref", "ceiling") else None
        vs_clone = f"{o / c:7.2f}" if isinstance(o, (int, float)) and c else f"{'-':>7s}"
        rpc = row.get("ours", {}).get("rpc_per_call")
        moved = row.get("ours", {}).get("moved")
        rpc_s = f"{rpc:8.1f}" if rpc is not None else f"{'-':>8s}"
        moved_s = f"{moved:6.3f}" if moved is not None else f"{'-':>6s}"
        target = TARGETS.get((k[0], k[1]), "")
        print(
            f"{k[0]:10s} {k[1]:15s} {k[2]:>10s} {fmt(o)} {fmt(u)} {ratio} {vs_clone} "
            f"{rpc_s} {moved_s}  {target}"
        )


def main() -> int:
    quick_help = "3 repeats per figure instead of 7"
    side = ("--rpc", "--meta")
    ap = comparison_parser(__doc__, quick_help, "write all figures as JSON", side, "--writer")
    args = ap.parse_args()
    if args.writer:
        return writer_main(args)
    if args.side:
        return side_main(args)
    results: dict[str, list[dict[str, Any]] | str] = {}
    t0 = time.monotonic()
    up = Path(args.upstream_python)
    missing = {
        "ours": "no master",
        "upstream": f"upstream venv not found at {up} (run benchmarks/upstream_env.sh)",
    }
    env = {"MOONCAKE_TORCH_SITE": TORCH_SITE}
    for name, (python, m) in find_sides(args.only, args.upstream_python).items():
        results[name] = (
            run_side(name, python, m, args.quick, HERE, 1800, env) if m else missing[name]
        )
    print_table(results)
    print_footer(t0, args.quick)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
