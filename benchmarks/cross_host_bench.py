#!/usr/bin/env python3
"""Store reads and writes across hosts: two network namespaces joined by a
veth pair, under each congestion control as the system default, against the
upstream wheel in the same run.

    sudo python benchmarks/cross_host_bench.py                 # bbr, cubic, reno (~6 min)
    sudo python benchmarks/cross_host_bench.py --cc bbr --quick
    sudo python benchmarks/cross_host_bench.py --only ours --json out.json

Host A (``10.77.0.1``) runs the master and a holder client that owns the only
segment; host B (``10.77.0.2``) runs a pure client (no segment) that loops,
for ``--secs`` per cell: ``get_into`` of one object, ``batch_get_into`` of 32
objects, and ``batch_put_from`` of 32 new objects (removed again between
calls, untimed), for sizes 4 KiB to 16 MiB. The namespaces are created and
removed by the script (root needed); ``net.ipv4.tcp_congestion_control`` is
set inside them only, so the machine's own default is untouched.

Per cell: mean GB/s (bytes over the whole loop), and per call p50, p99 and
max latency in ms. The ceiling row is a bare C client/server pair
(``benchmarks/tcp_loopback_ceiling.c``, run across the same namespaces with
the same congestion control) moving 16 MiB request/response transfers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    KiB,
    MiB,
    add_json,
    add_only,
    add_upstream_python,
    find_sides,
    master_argv,
    print_footer,
    print_table_head,
    write_json,
)
from netns_hosts import cubic_allowed, free_port_in, run, set_default_cc, veth_pair

SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB]
BATCH = 32
HERE = Path(__file__).resolve()
A_IP, B_IP = "10.77.0.1", "10.77.0.2"


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def label(size: int) -> str:
    return f"{size // MiB}MiB" if size >= MiB else f"{size // KiB}KiB"


# ------------------------------------------------------------------ client roles


def new_store(host: str, cfg: dict[str, Any], segment: int) -> Any:
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup(host, cfg["meta"], segment, 64 * MiB, "tcp", "", cfg["rpc"])
    if rc != 0:
        raise SystemExit(f"setup returned {rc}")
    return s


def holder_main(cfg: dict[str, Any]) -> int:
    import numpy as np

    seg = sum(SIZES) * BATCH * 3 + 64 * MiB
    s = new_store(A_IP, cfg, seg)
    for size in SIZES:
        src = np.random.default_rng(size).integers(0, 256, size, np.uint8)
        for i in range(BATCH):
            if s.put_from(f"obj-{size}-{i}", int(src.ctypes.data), size) != 0:
                raise SystemExit("holder put failed")
    print("ready", flush=True)
    sys.stdin.read()  # until the driver closes our stdin
    s.close()
    return 0


def measure(
    op: str, size: int, n_bytes: int, secs: float, call: Any, after: Any = None
) -> dict[str, Any]:
    """Loop ``call`` for ``secs`` (``after`` runs untimed after each call)."""
    call()  # warm (connections, first touch)
    if after:
        after()
    lat: list[float] = []
    t_end = time.monotonic() + secs
    while time.monotonic() < t_end:
        t = time.perf_counter()
        call()
        lat.append(time.perf_counter() - t)
        if after:
            after()
    return {
        "op": op,
        "size": size,
        "calls": len(lat),
        "gbps": n_bytes * len(lat) / sum(lat) / 1e9,
        "p50_ms": percentile(lat, 0.5) * 1e3,
        "p99_ms": percentile(lat, 0.99) * 1e3,
        "max_ms": max(lat) * 1e3,
    }


def reader_main(cfg: dict[str, Any]) -> int:
    import itertools

    import numpy as np

    s = new_store(B_IP, cfg, 0)
    secs = float(cfg["secs"])
    buf = np.zeros(max(SIZES) * BATCH, np.uint8)
    base = int(buf.ctypes.data)
    s.register_buffer(base, buf.nbytes)
    rows = []
    rounds = itertools.count()
    for size in SIZES:
        keys = [f"obj-{size}-{i}" for i in range(BATCH)]
        ptrs = [base + i * size for i in range(BATCH)]
        sizes = [size] * BATCH
        written: list[str] = []

        def get_one(size: int = size, keys: list[str] = keys) -> None:
            if s.get_into(keys[0], base, size) != size:
                raise SystemExit("get_into failed")

        def get_batch(
            keys: list[str] = keys, ptrs: list[int] = ptrs, sizes: list[int] = sizes
        ) -> None:
            if s.batch_get_into(keys, ptrs, sizes) != sizes:
                raise SystemExit("batch_get_into failed")

        def put_batch(
            size: int = size,
            ptrs: list[int] = ptrs,
            sizes: list[int] = sizes,
            written: list[str] = written,
        ) -> None:
            n = next(rounds)
            written[:] = [f"new-{size}-{n}-{i}" for i in range(BATCH)]
            if s.batch_put_from(written, ptrs, sizes) != [0] * BATCH:
                raise SystemExit("batch_put_from failed")

        def remove_written(written: list[str] = written) -> None:
            for k in written:
                s.remove(k, True)

        rows.append(measure("get_into", size, size, secs, get_one))
        rows.append(measure(f"batch_get_into x{BATCH}", size, size * BATCH, secs, get_batch))
        rows.append(
            measure(f"batch_put_from x{BATCH}", size, size * BATCH, secs, put_batch, remove_written)
        )
    s.close()
    print(json.dumps({"rows": rows}), flush=True)
    return 0


# ------------------------------------------------------------------ one side under one cc


def run_side(nss: tuple[str, str], python: str, master: str, secs: float) -> list[dict[str, Any]]:
    a, b = nss
    rpc, http, metrics = free_port_in(a), free_port_in(a), free_port_in(a)
    m = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            a,
            *master_argv(master, rpc, http, metrics, "--eviction_high_watermark_ratio=0.98"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    holder = None
    try:
        time.sleep(1.0)
        cfg = {"rpc": f"{A_IP}:{rpc}", "meta": f"http://{A_IP}:{http}/metadata", "secs": secs}
        holder = subprocess.Popen(
            ["ip", "netns", "exec", a, python, str(HERE), "--role", "holder", json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert holder.stdout is not None
        line = holder.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError("holder did not start")
        r = subprocess.run(
            ["ip", "netns", "exec", b, python, str(HERE), "--role", "reader", json.dumps(cfg)],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith('{"rows"')]
        if r.returncode != 0 or not lines:
            raise RuntimeError(f"reader failed: {r.stderr[-2000:]}")
        return json.loads(lines[-1])["rows"]
    finally:
        if holder is not None:
            with contextlib.suppress(Exception):
                holder.communicate(timeout=30)
            if holder.poll() is None:
                holder.kill()
        m.kill()
        m.wait()


def ceiling(nss: tuple[str, str], cc: str) -> dict[str, Any] | None:
    """A bare C client/server pair across the namespaces (16 MiB transfers)."""
    src = HERE.parent / "tcp_cross_ceiling.c"
    if shutil.which("gcc") is None or not src.exists():
        return None
    exe = Path(tempfile.gettempdir()) / "mc_tcp_cross_ceiling"
    run(["gcc", "-O2", "-pthread", str(src), "-o", str(exe)])
    a, b = nss
    port = free_port_in(a)
    srv = subprocess.Popen(
        ["ip", "netns", "exec", a, str(exe), "server", str(port), f"cc={cc}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)
        r = run(["ip", "netns", "exec", b, str(exe), "client", f"{A_IP}:{port}", f"cc={cc}"])
        return json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        srv.kill()
        srv.wait()


def print_table(
    cc: str, res: dict[str, list[dict[str, Any]] | str], ceil: dict[str, Any] | None
) -> None:
    print(f"\n## system congestion control: {cc}")
    if ceil:
        print(
            f"# ceiling (bare C pair, 16 MiB request/response): {ceil['gbps']:.2f} GB/s, "
            f"p50 {ceil['p50_ms']:.2f} ms, p99 {ceil['p99_ms']:.2f} ms, max {ceil['max_ms']:.2f} ms"
        )
    hdr = (
        f"{'op':20s} {'size':>6s} | {'ours GB/s':>9s} {'p50':>7s} {'p99':>7s} {'max':>7s} | "
        f"{'up GB/s':>8s} {'p50':>7s} {'p99':>7s} {'max':>7s} | {'GB/s x':>6s} {'p99 x':>6s}"
    )
    print_table_head(res, hdr)
    ours = res.get("ours") if isinstance(res.get("ours"), list) else []
    up = res.get("upstream") if isinstance(res.get("upstream"), list) else []
    keyed_up = {(r["op"], r["size"]): r for r in up or []}  # type: ignore[union-attr]
    for r in ours or []:  # type: ignore[union-attr]
        u = keyed_up.get((r["op"], r["size"]))
        cells = f"{r['gbps']:9.3f} {r['p50_ms']:7.3f} {r['p99_ms']:7.3f} {r['max_ms']:7.2f}"
        if u:
            ucells = f"{u['gbps']:8.3f} {u['p50_ms']:7.3f} {u['p99_ms']:7.3f} {u['max_ms']:7.2f}"
            rx = f"{r['gbps'] / u['gbps']:6.2f} {r['p99_ms'] / u['p99_ms']:6.2f}"
        else:
            ucells, rx = f"{'-':>8s} {'-':>7s} {'-':>7s} {'-':>7s}", f"{'-':>6s} {'-':>6s}"
        print(f"{r['op']:20s} {label(r['size']):>6s} | {cells} | {ucells} | {rx}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cc", default="bbr,cubic,reno")
    add_only(ap)
    ap.add_argument("--quick", action="store_true", help="0.5 s per cell instead of 2 s")
    ap.add_argument("--secs", type=float)
    add_upstream_python(ap)
    add_json(ap)
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("cfg", nargs="?", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        cfg = json.loads(args.cfg)
        return holder_main(cfg) if args.role == "holder" else reader_main(cfg)
    if os.geteuid() != 0:
        print("network namespaces need root", file=sys.stderr)
        return 2
    secs = args.secs or (0.5 if args.quick else 2.0)
    sides = find_sides(args.only, args.upstream_python)
    out: dict[str, Any] = {}
    t0 = time.monotonic()
    with cubic_allowed(), veth_pair(A_IP, B_IP) as nss:
        for cc in args.cc.split(","):
            set_default_cc(list(nss), cc)
            res: dict[str, list[dict[str, Any]] | str] = {}
            for name, (python, master) in sides.items():
                if master is None:
                    res[name] = "not found"
                    continue
                print(f"== {cc} / {name}", file=sys.stderr, flush=True)
                try:
                    res[name] = run_side(nss, python, master, secs)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    res[name] = f"failed: {e}"
            ceil = ceiling(nss, cc)
            print_table(cc, res, ceil)
            out[cc] = {"results": res, "ceiling": ceil}
    print_footer(t0)
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
