#!/usr/bin/env python3
"""Standalone-mode benchmark: a dummy client of a ``mooncake_client`` daemon.

    python benchmarks/standalone_bench.py             # all sides, ~2 min
    python benchmarks/standalone_bench.py --rounds 3  # median of 3 rounds per side
    python benchmarks/standalone_bench.py --side ours-dummy --json out.json

Sides, each with its own master on free ports, measured in one run:

  upstream-dummy  upstream's dummy client against upstream's ``mooncake_client``
                  (the 0.3.13 wheel's binaries, run by /work/venv-upstream's
                  python; see upstream_env.sh)
  ours-dummy      our dummy client against our ``mooncake_client``
  ours-inproc     our in-process client owning the segment (``setup``)

Cells: ``batch_put_from`` and ``batch_get_into`` of 64 pages of 64 KiB and of
1 MiB, and ``get_into`` of one 16 MiB object. Every buffer is shared memory
from ``MooncakeHostMemAllocator``, registered with ``register_buffer`` (the
SGLang HiCache layout; the in-process side gets the same memory). Puts write
keys that were written and removed before (untimed), so no side pays for the
first touch of fresh segment pages; gets read the same keys each pass. Figure
per cell: median over the passes of GB/s (1e9 B/s); the ``memcpy`` row is the
machine's ceiling for these copies (numpy copy of a warm 16 MiB buffer),
measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    UPSTREAM_VENV,
    KiB,
    MiB,
    alternating,
    free_port,
    master_argv,
    port_open,
    write_json,
)

PAGES = 64
CELLS = [
    ("batch_put_from", 64 * KiB),
    ("batch_get_into", 64 * KiB),
    ("batch_put_from", 1 * MiB),
    ("batch_get_into", 1 * MiB),
    ("get_into", 16 * MiB),
]
SEGMENT = "2GB"
HERE = Path(__file__).resolve()


def label(size: int) -> str:
    return f"{size // MiB}MiB" if size >= MiB else f"{size // KiB}KiB"


def binaries() -> tuple[str, str]:
    """(mooncake_master, mooncake_client) of the running interpreter's package."""
    import mooncake

    pkg = Path(next(iter(mooncake.__path__)))
    out = []
    for name in ("mooncake_master", "mooncake_client"):
        for cand in (pkg / name, Path(sys.executable).parent / name):
            if cand.exists():
                out.append(str(cand))
                break
        else:
            found = shutil.which(name)
            if not found:
                raise SystemExit(f"{name} not found")
            out.append(found)
    return out[0], out[1]


@contextlib.contextmanager
def processes(dummy: bool) -> Iterator[tuple[str, str, int]]:
    """A master (and a daemon when ``dummy``): (rpc address, metadata url, daemon port)."""
    master_bin, client_bin = binaries()
    rpc, http, metrics, port = free_port(), free_port(), free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    null = subprocess.DEVNULL
    try:
        procs.append(
            subprocess.Popen(
                master_argv(master_bin, rpc, http, metrics, "--default_kv_lease_ttl=5000"),
                stdout=null,
                stderr=null,
            )
        )
        deadline = time.monotonic() + 20
        while not port_open(rpc):
            assert time.monotonic() < deadline, "master did not start"
            time.sleep(0.1)
        meta = f"http://127.0.0.1:{http}/metadata"
        if dummy:
            procs.append(
                subprocess.Popen(
                    [
                        client_bin,
                        "--host=127.0.0.1",
                        f"--port={port}",
                        f"--global_segment_size={SEGMENT}",
                        f"--master_server_address=127.0.0.1:{rpc}",
                        f"--metadata_server={meta}",
                    ],
                    stdout=null,
                    stderr=null,
                )
            )
            while not port_open(port):
                assert time.monotonic() < deadline, "mooncake_client did not start"
                time.sleep(0.1)
        yield f"127.0.0.1:{rpc}", meta, port
    finally:
        for p in reversed(procs):
            p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
            if p.poll() is None:
                p.kill()


def gbps(nbytes: int, secs: float) -> float:
    return nbytes / secs / 1e9


def measure(store: Any, passes: int) -> dict[str, float]:
    from mooncake.store import MooncakeHostMemAllocator

    alloc = MooncakeHostMemAllocator()
    biggest = max(PAGES * size for _, size in CELLS)
    ptr = alloc.alloc(2 * biggest)
    assert ptr, "MooncakeHostMemAllocator.alloc failed"
    assert store.register_buffer(ptr, 2 * biggest) == 0
    ctypes.memset(ptr, 0x5A, 2 * biggest)
    out: dict[str, float] = {}
    for op, size in CELLS:
        n = 1 if op == "get_into" else PAGES
        keys = [f"{op}-{size}-{i}" for i in range(n)]
        src = [ptr + i * size for i in range(n)]
        dst = [ptr + biggest + i * size for i in range(n)]
        sizes = [size] * n

        def put(keys: list[str] = keys, src: list[int] = src, sizes: list[int] = sizes) -> None:
            rcs = store.batch_put_from(keys, src, sizes)
            assert rcs == [0] * len(keys), rcs[:4]

        put()  # warm: the segment pages these keys take are touched once
        figures = []
        if op == "batch_put_from":
            for _ in range(passes):
                store.remove_all(True)
                t = time.perf_counter()
                put()
                figures.append(gbps(n * size, time.perf_counter() - t))
        elif op == "batch_get_into":
            for _ in range(passes + 1):
                t = time.perf_counter()
                rcs = store.batch_get_into(keys, dst, sizes)
                figures.append(gbps(n * size, time.perf_counter() - t))
                assert rcs == sizes, rcs[:4]
            figures = figures[1:]
        else:
            for _ in range(passes + 1):
                t = time.perf_counter()
                rc = store.get_into(keys[0], dst[0], size)
                figures.append(gbps(size, time.perf_counter() - t))
                assert rc == size, rc
            figures = figures[1:]
        assert ctypes.string_at(dst[0], 64) == b"\x5a" * 64
        out[f"{op} {label(size)}"] = statistics.median(figures)
        store.remove_all(True)
    store.unregister_buffer(ptr)
    alloc.free(ptr)
    return out


def memcpy_ceiling(nbytes: int) -> float:
    """GB/s of one warm numpy copy of ``nbytes`` (the copy every cell makes once)."""
    import numpy as np

    a = np.full(nbytes, 7, np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)
    figs = []
    for _ in range(15):
        t = time.perf_counter()
        np.copyto(b, a)
        figs.append(gbps(a.nbytes, time.perf_counter() - t))
    return statistics.median(figs)


def cell_bytes(op: str, size: int) -> int:
    return size if op == "get_into" else PAGES * size


def side_main(side: str, passes: int) -> dict[str, float]:
    from mooncake.store import MooncakeDistributedStore

    dummy = side.endswith("dummy")
    with processes(dummy) as (rpc, meta, port):
        store = MooncakeDistributedStore()
        if dummy:
            # The daemon's store client mounts after its port opens.
            deadline = time.monotonic() + 60
            while (rc := store.setup_dummy(256 * MiB, 16 * MiB, f"127.0.0.1:{port}")) != 0:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        else:
            seg = 2 << 30
            rc = store.setup("127.0.0.1", meta, seg, 16 * MiB, "tcp", "", rpc)
        assert rc == 0, f"{side}: setup returned {rc}"
        try:
            out = measure(store, passes)
        finally:
            store.close()
    for op, size in CELLS:
        out[f"memcpy {op} {label(size)}"] = memcpy_ceiling(cell_bytes(op, size))
    return out


def run_side(side: str, passes: int) -> dict[str, float]:
    """One side in a process of its own (upstream's with its own python)."""
    py = str(UPSTREAM_VENV / "bin" / "python") if side.startswith("upstream") else sys.executable
    res = subprocess.run(
        [py, str(HERE), "--side", side, "--passes", str(passes), "--json", "-"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if res.returncode != 0:
        raise SystemExit(f"side {side} failed:\n{res.stderr[-3000:]}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", choices=["upstream-dummy", "ours-dummy", "ours-inproc"])
    ap.add_argument("--passes", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", help="write the figures here ('-': stdout)")
    args = ap.parse_args()
    if args.side:
        out = side_main(args.side, args.passes)
        if args.json == "-":
            print(json.dumps(out))
        elif args.json:
            Path(args.json).write_text(json.dumps(out))
        else:
            for k, v in out.items():
                print(f"{k:28s} {v:8.2f} GB/s")
        return 0
    sides = ["upstream-dummy", "ours-dummy", "ours-inproc"]
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    for _, s in alternating(sides, args.rounds):
        runs[s].append(run_side(s, args.passes))
    fig = {s: {k: statistics.median(run[k] for run in runs[s]) for k in runs[s][0]} for s in sides}
    up, ours, inproc = fig["upstream-dummy"], fig["ours-dummy"], fig["ours-inproc"]
    print(
        f"| op | bytes per call | upstream dummy | ours dummy | ours in-process "
        f"| ours/upstream | dummy/in-process | memcpy ceiling |\n|{'---|' * 8}"
    )
    for op, size in CELLS:
        k = f"{op} {label(size)}"
        ceiling = statistics.median(fig[s][f"memcpy {k}"] for s in sides)
        print(
            f"| {k} | {label(cell_bytes(op, size))} | {up[k]:.2f} | {ours[k]:.2f} "
            f"| {inproc[k]:.2f} | {ours[k] / up[k]:.2f}x | {ours[k] / inproc[k]:.2f}x "
            f"| {ceiling:.2f} |"
        )
    print(f"(GB/s, median over {args.passes} passes and {args.rounds} round(s))")
    write_json(args.json, fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
