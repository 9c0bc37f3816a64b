#!/usr/bin/env python3
"""``all_reduce`` over TCP across hosts: ranks in separate network namespaces
on one bridge, ``mooncake-cpu`` against gloo in the same run, under each
congestion control as the system default.

    sudo python benchmarks/pg_cross_host_bench.py              # bbr and cubic, world 2 and 4
    sudo python benchmarks/pg_cross_host_bench.py --cc bbr --world 2 --iters 50
    sudo python benchmarks/pg_cross_host_bench.py --before /other/checkout/.venv/bin/python

Each rank is its own process in its own namespace (so its own "host": the
ranks talk TCP, as on real hosts). Per cell, rank 0 times ``iters``
``all_reduce`` calls of float32 tensors of 1 MiB and 16 MiB after a warm-up
and a barrier; reported are the median and p99 per call (ms) and the
bus bandwidth of the median (GB/s, ``2 (n-1)/n * bytes / time``); ``cpu``
is rank 0's process CPU time (user + system, all threads) per call (ms).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MiB, add_json, print_footer, print_header, write_json
from netns_hosts import bridged, cubic_allowed, free_port_in, set_default_cc

HERE = Path(__file__).resolve()


def rank_main(cfg: dict[str, Any]) -> int:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if cfg["backend"] == "mooncake-cpu":
        import mooncake.pg  # noqa: F401  (registers the backend)
    rank, world = int(cfg["rank"]), int(cfg["world"])
    dist.init_process_group(cfg["backend"], init_method=cfg["init"], rank=rank, world_size=world)
    out = []
    for size in cfg["sizes"]:
        t = torch.ones(size // 4, dtype=torch.float32)
        for _ in range(5):
            dist.all_reduce(t)
        dist.barrier()
        lat = []
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(int(cfg["iters"])):
            t.fill_(1.0)
            t0 = time.perf_counter()
            dist.all_reduce(t)
            lat.append(time.perf_counter() - t0)
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
        if float(t[0]) != world:
            raise SystemExit(f"wrong sum {float(t[0])}")
        lat.sort()
        med = lat[len(lat) // 2]
        out.append({
            "size": size,
            "p50_ms": med * 1e3,
            "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3,
            "max_ms": lat[-1] * 1e3,
            "busbw": 2 * (world - 1) / world * size / med / 1e9,
            "cpu_ms": cpu / len(lat) * 1e3,
        })  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"rows": out}), flush=True)
    return 0


def run_cell(
    hosts: list[tuple[str, str]],
    backend: str,
    world: int,
    iters: int,
    sizes: list[int],
    python: str = sys.executable,
) -> Any:
    ns0, ip0 = hosts[0]
    init = f"tcp://{ip0}:{free_port_in(ns0)}"
    procs = []
    for rank in range(world):
        ns, _ = hosts[rank]
        cfg = {
            "backend": backend,
            "rank": rank,
            "world": world,
            "init": init,
            "iters": iters,
            "sizes": sizes,
        }
        procs.append(
            subprocess.Popen(
                ["ip", "netns", "exec", ns, python, str(HERE), "--rank", json.dumps(cfg)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="eth0"),
            )
        )
    outs = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        outs.append((p.returncode, o, e))
    _, o, _ = outs[0]
    lines = [ln for ln in o.splitlines() if ln.startswith('{"rows"')]
    if any(r != 0 for r, _, _ in outs) or not lines:
        errs = [err[-800:] for r, _, err in outs if r != 0]
        return f"failed: {errs[:1]}"
    return json.loads(lines[-1])["rows"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cc", default="bbr,cubic")
    ap.add_argument("--world", default="2,4")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--sizes", default="1,16", help="MiB per all_reduce, comma-separated")
    ap.add_argument(
        "--before",
        metavar="PYTHON",
        help="also run mooncake-cpu with this interpreter (another build's venv) in each cell",
    )
    add_json(ap)
    ap.add_argument("--rank", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank:
        return rank_main(json.loads(args.rank))
    if os.geteuid() != 0:
        print("network namespaces need root", file=sys.stderr)
        return 2
    worlds = [int(w) for w in args.world.split(",")]
    sizes = [int(m) * MiB for m in args.sizes.split(",")]
    results: dict[str, Any] = {}
    t0 = time.monotonic()
    with cubic_allowed(), bridged(max(worlds)) as hosts:
        for cc in args.cc.split(","):
            set_default_cc([ns for ns, _ in hosts], cc)
            print(f"\n## system congestion control: {cc}")
            hdr = (
                f"{'world':>5s} {'size':>6s} | {'mooncake p50':>12s} {'p99':>7s} {'busbw':>6s} {'cpu':>6s} | "
                f"{'gloo p50':>8s} {'p99':>7s} {'busbw':>6s} {'cpu':>6s} | {'speedup':>7s} {'p99 x':>6s}"
            )
            if args.before:
                hdr += (
                    f" | {'before p50':>10s} {'p99':>7s} {'cpu':>6s} {'speedup':>7s} {'p99 x':>6s}"
                )
            print_header(hdr)
            for world in worlds:
                cell = {
                    b: run_cell(hosts, b, world, args.iters, sizes)
                    for b in ("mooncake-cpu", "gloo")
                }
                if args.before:
                    cell["before"] = run_cell(
                        hosts, "mooncake-cpu", world, args.iters, sizes, args.before
                    )
                results[f"{cc}/{world}"] = cell
                bad = {k: v for k, v in cell.items() if isinstance(v, str)}
                if bad:
                    print(f"{world:>5d}  failed: {bad}")
                    continue
                mc, gl = cell["mooncake-cpu"], cell["gloo"]
                for i, (m, g) in enumerate(zip(mc, gl, strict=True)):
                    line = (
                        f"{world:>5d} {m['size'] // MiB:>4d}Mi | {m['p50_ms']:12.3f} "
                        f"{m['p99_ms']:7.3f} {m['busbw']:6.2f} {m['cpu_ms']:6.2f} | {g['p50_ms']:8.3f} "
                        f"{g['p99_ms']:7.3f} {g['busbw']:6.2f} {g['cpu_ms']:6.2f} | "
                        f"{g['p50_ms'] / m['p50_ms']:7.2f} "
                        f"{m['p99_ms'] / g['p99_ms']:6.2f}"
                    )
                    if args.before:
                        b = cell["before"][i]
                        line += (
                            f" | {b['p50_ms']:10.3f} {b['p99_ms']:7.3f} {b['cpu_ms']:6.2f} "
                            f"{g['p50_ms'] / b['p50_ms']:7.2f} {b['p99_ms'] / g['p99_ms']:6.2f}"
                        )
                    print(line)
    print_footer(t0)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
