"""EngramStore lookup benchmark.

One configuration per run::

    python benchmarks/engram_bench.py --shape upstream --dtype float32 \
        --mode own --input numpy --impl ours --batches 1,4,16,64,128,256

``--impl``: ``ours`` (this project), ``numpy`` (``np.take`` per head into a
preallocated output; the memory-speed floor), ``upstream`` (the upstream
wheel; run with the interpreter of ``/work/venv-upstream`` and its master).
``--mode``: ``own`` (tables in this process's segment), ``same-host`` (a
second process owns the tables, read through the shared mapping), ``tcp``
(a second process owns them, ``MC_FORCE_TCP=1`` in the reader).
Shapes: ``upstream`` (H=8, N=50,000, D=16), ``h16`` (H=16, N=262,144,
D=160), ``27b`` (H=16, N=1,130,000, D=160), ``27b-scaled`` (N=282,500).

``--all`` runs the full matrix in subprocesses (starting masters as
needed) and prints a Markdown report. Each measurement is 10 warm-up and
50 timed lookups; reported: mean, p50, p99 (ms) and tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _common
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM_PY = Path("/work/venv-upstream/bin/python")
SHAPES: dict[str, tuple[int, int, int]] = {
    "upstream": (8, 50_000, 16),
    "h16": (16, 262_144, 160),
    "27b": (16, 1_130_000, 160),
    "27b-scaled": (16, 282_500, 160),
}
NP_DTYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.float32}
WARMUP, ITERS = 10, 50


# ----------------------------------------------------------------- helpers
def start_master(upstream: bool) -> tuple[subprocess.Popen[bytes], str]:
    """Start a master (ours, or the upstream wheel's) on free ports."""
    if upstream:
        exe = str(UPSTREAM_PY.parent / "mooncake_master")
    else:
        exe = os.environ.get("MOONCAKE_MASTER_BIN") or ""
        if not exe:
            from mooncake import _native

            if hasattr(_native, "run_master"):
                exe = shutil.which("mooncake_master") or ""
        for p in (ROOT / "target/release/mooncake_master", ROOT / "target/debug/mooncake_master"):
            if not exe and p.exists():
                exe = str(p)
    proc, rpc, _meta = _common.start_master(exe, [])
    return proc, rpc


def connect(impl: str, master: str, segment: int) -> Any:
    """A set-up store client (upstream's with a larger local buffer)."""
    from mooncake.store import MooncakeDistributedStore

    local = 256 << 20 if impl == "upstream" else 64 << 20
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", segment, local, "tcp", "", master)
    assert rc == 0, rc
    return s


def engram_classes(impl: str) -> tuple[Any, Any]:
    from mooncake.store import EngramStore, EngramStoreConfig

    return EngramStore, EngramStoreConfig


def make_tables(shape: str, seed: int = 0) -> list[np.ndarray]:
    h, n, d = SHAPES[shape]
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, d), dtype=np.float32) for _ in range(h)]


def make_engram(impl: str, shape: str, dtype: str, store: Any, layer: int) -> Any:
    es, ec = engram_classes(impl)
    h, n, d = SHAPES[shape]
    cfg = ec()
    cfg.table_vocab_sizes = [n] * h
    cfg.embedding_dim = d
    if dtype != "float32":
        cfg.table_dtype = dtype
    return es(layer, cfg, store)


def make_ids(shape: str, batch: int, length: int) -> np.ndarray:
    h, n, _ = SHAPES[shape]
    if shape == "upstream":
        b = np.arange(batch)[:, None, None]
        l_ = np.arange(length)[None, :, None]
        hh = np.arange(h)[None, None, :]
        return ((b * length + l_ + hh) % n).astype(np.int64)
    rng = np.random.default_rng(1234)
    return rng.integers(0, n, (batch, length, h), dtype=np.int64)


def stats(times: list[float], tokens: int) -> dict[str, float]:
    a = np.array(times)
    return {
        "mean_ms": float(a.mean() * 1e3),
        "p50_ms": float(np.percentile(a, 50) * 1e3),
        "p99_ms": float(np.percentile(a, 99) * 1e3),
        "tokens_per_s": float(tokens / np.percentile(a, 50)),
    }


def timed(fn: Any, warmup: int = WARMUP, iters: int = ITERS) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


# ----------------------------------------------------------------- roles
def run_owner(args: argparse.Namespace) -> None:
    """Own the tables in this process until stdin closes."""
    tables = make_tables(args.shape)
    seg = sum(t.nbytes for t in tables) + (64 << 20)
    store = connect("ours", args.master, seg)
    e = make_engram("ours", args.shape, args.dtype, store, args.layer)
    e.populate(tables)
    print("READY", flush=True)
    sys.stdin.read()
    store.close()


def run_numpy(
    args: argparse.Namespace, batches: list[int], base: dict[str, Any]
) -> list[dict[str, Any]]:
    """The numpy reference: ``np.take`` per head into a preallocated output."""
    h, _n, d = SHAPES[args.shape]
    results: list[dict[str, Any]] = []
    tables = [t.astype(NP_DTYPE[args.dtype]) for t in make_tables(args.shape)]
    for b in batches:
        ids = make_ids(args.shape, b, args.length)
        out = np.empty((b, args.length, h, d), tables[0].dtype)

        def take(ids: np.ndarray = ids, out: np.ndarray = out) -> None:
            for hh in range(h):
                np.take(tables[hh], ids[..., hh], axis=0, out=out[..., hh, :])

        results.append(
            {**base, "batch": b, **stats(timed(take, args.warmup, args.iters), b * args.length)}
        )
    return results


def populate_own(
    args: argparse.Namespace, master: str, populate_s: list[float], setup_s: list[float]
) -> tuple[Any, Any]:
    """Populates the tables ``args.populate_reps`` times, each into a fresh
    client's segment; records the setup and populate times; returns the last
    (store, engram)."""
    store: Any = None
    if args.prefault:
        os.environ["MC_STORE_PREFAULT"] = "on"
    tables = make_tables(args.shape)
    seg = sum(t.nbytes for t in tables) + (64 << 20)
    # Each populate goes into a fresh client's (never touched) segment.
    for rep in range(args.populate_reps):
        if store is not None:
            store.close()
        t0 = time.perf_counter()
        store = connect(args.impl, master, seg)
        setup_s.append(time.perf_counter() - t0)
        e = make_engram(args.impl, args.shape, args.dtype, store, args.layer + rep)
        t0 = time.perf_counter()
        e.populate(tables)
        populate_s.append(time.perf_counter() - t0)
    del tables
    return store, e


def run_one(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Measure one (impl, shape, dtype, mode, input) over all batch sizes."""
    batches = [int(x) for x in args.batches.split(",")]
    results: list[dict[str, Any]] = []
    base = {k: getattr(args, k) for k in ("impl", "shape", "dtype", "mode", "input", "iters")}
    if args.impl == "numpy":
        return run_numpy(args, batches, base)

    proc = owner = None
    master = args.master
    if not master:
        proc, master = start_master(args.impl == "upstream")
    try:
        populate_s: list[float] = []
        setup_s: list[float] = []
        store: Any = None
        if args.mode == "own":
            store, e = populate_own(args, master, populate_s, setup_s)
        else:
            owner = subprocess.Popen(
                [sys.executable, __file__, "--role", "owner", "--master", master]
                + ["--shape", args.shape, "--dtype", args.dtype, "--layer", str(args.layer)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert owner.stdout is not None
            if owner.stdout.readline().strip() != "READY":
                raise SystemExit("owner failed")
            if args.mode == "tcp":
                os.environ["MC_FORCE_TCP"] = "1"
            store = connect(args.impl, master, 0)
            e = make_engram(args.impl, args.shape, args.dtype, store, args.layer)
        for b in batches:
            ids = make_ids(args.shape, b, args.length)
            arg: Any = ids.tolist() if args.input == "list" else ids
            times = timed(lambda arg=arg: e.lookup(arg), args.warmup, args.iters)
            r = {**base, "batch": b, **stats(times, b * args.length)}
            if populate_s:
                r["populate_s"] = populate_s
                r["setup_s"] = setup_s
                r["prefault"] = args.prefault
            results.append(r)
        store.close()
    finally:
        if owner is not None:
            _common.stop_child(owner)
        if proc is not None:
            proc.terminate()
            proc.wait()
    return results


# ----------------------------------------------------------------- driver
def run_sub(py: str, extra: list[str]) -> list[dict[str, Any]]:
    cmd = [py, __file__, "--role", "one", "--json", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if r.returncode != 0:
        print(f"FAILED {' '.join(extra)}: {r.stderr[-800:]}", file=sys.stderr)
        return []
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_all(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    a = "1,4,16,64,128,256"
    b = "1,64,1024,4096"
    plan: list[tuple[str, list[str]]] = []
    for impl in ("numpy", "ours"):
        modes = ["own"] if impl == "numpy" else ["own", "same-host", "tcp"]
        for mode in modes:
            inputs = ["numpy", "list"] if impl == "ours" else ["numpy"]
            for inp in inputs:
                plan.append(
                    (impl, ["--shape", "upstream", "--mode", mode, "--input", inp, "--batches", a])
                )
            reps = ["--populate-reps", "3"] if mode == "own" and impl == "ours" else []
            plan.append(
                (
                    impl,
                    ["--shape", "h16", "--mode", mode, "--input", "numpy", "--batches", b] + reps,
                )
            )
    # populate again into segments committed at setup (MC_STORE_PREFAULT=on)
    plan.append(
        (
            "ours",
            ["--shape", "h16", "--mode", "own", "--batches", "1", "--populate-reps", "3"]
            + ["--prefault"],
        )
    )
    # Row width of the Engram-27B shape (scaled to fit 24 GiB), and the
    # half-precision tables.
    for impl in ("numpy", "ours"):
        plan.append((impl, ["--shape", "27b-scaled", "--mode", "own", "--batches", a]))
    for dtype in ("float16", "bfloat16"):
        plan.append(("ours", ["--shape", "upstream", "--dtype", dtype, "--batches", a]))
        plan.append(("ours", ["--shape", "27b-scaled", "--dtype", dtype, "--batches", a]))
    if args.skip_tcp:
        plan = [p for p in plan if "tcp" not in p[1]]
    if UPSTREAM_PY.exists() and not args.skip_upstream:
        for inp in ("numpy", "list"):
            plan.append(
                (
                    "upstream",
                    ["--shape", "upstream", "--mode", "own", "--input", inp, "--batches", a],
                )
            )
        plan.append(
            (
                "upstream",
                ["--shape", "h16", "--mode", "own", "--input", "numpy", "--batches", b]
                + ["--warmup", "1", "--iters", "5"],
            )
        )
    for impl, extra in plan:
        py = str(UPSTREAM_PY) if impl == "upstream" else sys.executable
        print(f"running {impl} {' '.join(extra)}", file=sys.stderr, flush=True)
        rows += run_sub(py, ["--impl", impl, *extra])
    print(report(rows))


def report(rows: list[dict[str, Any]]) -> str:
    lines = [
        (
            "| impl | shape | dtype | mode | input | B (tokens) | iters | mean ms | p50 ms "
            "| p99 ms | tokens/s |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['impl']} | {r['shape']} | {r['dtype']} | {r['mode']} | {r['input']} "
            f"| {r['batch']} "
            f"| {r.get('iters', ITERS)} "
            f"| {r['mean_ms']:.4f} | {r['p50_ms']:.4f} | {r['p99_ms']:.4f} "
            f"| {r['tokens_per_s']:,.0f} |"
        )
    pops = {
        (r["impl"], r["shape"], r["dtype"], r.get("prefault", False)): r
        for r in rows
        if "populate_s" in r
    }
    for (impl, shape, dtype, prefault), r in pops.items():
        h, n, d = SHAPES[shape]
        nbytes = h * n * d * (2 if dtype in ("float16", "bfloat16") else 4)
        ts = r["populate_s"]
        med, best = float(np.median(ts)), min(ts)
        each = ", ".join(f"{nbytes / t / 1e9:.2f}" for t in ts)
        kind = "segments committed at setup" if prefault else "fresh segments"
        setup = float(np.median(r.get("setup_s") or [0.0]))
        lines.append(
            f"\npopulate {impl} {shape} {dtype} ({nbytes / 1e9:.2f} GB, {len(ts)} {kind}): "
            f"median {med * 1e3:.1f} ms = {nbytes / med / 1e9:.2f} GB/s, "
            f"best {nbytes / best / 1e9:.2f} GB/s (each: {each} GB/s); "
            f"setup median {setup * 1e3:.0f} ms"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description="EngramStore lookup benchmark")
    ap.add_argument("--role", choices=["one", "owner"], default="one")
    ap.add_argument("--all", action="store_true", help="run the full matrix")
    ap.add_argument("--skip-upstream", action="store_true")
    ap.add_argument("--skip-tcp", action="store_true", help="--all: leave out the tcp rows")
    ap.add_argument("--impl", choices=["ours", "numpy", "upstream"], default="ours")
    ap.add_argument("--shape", choices=list(SHAPES), default="upstream")
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    ap.add_argument("--mode", choices=["own", "same-host", "tcp"], default="own")
    ap.add_argument("--input", choices=["numpy", "list"], default="numpy")
    ap.add_argument("--batches", default="1,4,16,64,128,256")
    ap.add_argument("--length", type=int, default=1, help="L (tokens per batch row)")
    ap.add_argument("--layer", type=int, default=9000)
    ap.add_argument("--master", default="")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--warmup", type=int, default=WARMUP)
    ap.add_argument("--iters", type=int, default=ITERS)
    ap.add_argument(
        "--prefault",
        action="store_true",
        help="own mode: commit each segment at setup (MC_STORE_PREFAULT=on)",
    )
    ap.add_argument(
        "--populate-reps",
        type=int,
        default=1,
        help="own mode: populate this many times, each into a fresh client's segment",
    )
    args = ap.parse_args()
    if args.all:
        run_all(args)
    elif args.role == "owner":
        run_owner(args)
    else:
        rows = run_one(args)
        print(json.dumps(rows) if args.json else report(rows))


if __name__ == "__main__":
    main()
