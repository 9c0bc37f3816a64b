"""SSD offload: upstream's SSD-offload scenario, ours against the upstream
wheel in one run, with the device's sequential read measured in the same run.

Each side starts its own master with ``--root_fs_dir=<dir>`` (and a 500 ms
lease, as upstream's test), sets up a plain client lending ``--segment-mib``,
writes three times that in 1 MiB objects (retrying NO_AVAILABLE_HANDLE while
eviction frees memory), waits ``--settle`` seconds (upstream's test waits 5),
and reads every object back, comparing bytes. Reported per side: the success
rate, write GB/s, and read GB/s of the objects memory no longer holds (the
oldest two thirds: they come from the disk tier) and of the rest.

Before the reads the side's files are synced and dropped from the page cache
(``posix_fadvise(DONTNEED)`` on each file, so other processes' caches are
untouched); the disk-tier figure is therefore a device read. The device
ceiling is the same: a file of the disk-tier bytes written, synced, dropped
from the cache and read sequentially in 1 MiB reads (dd-style), in the same
directory, in the same run.

Concurrent writers (``--writers``, default 1,4,8): each side's master has
``--root_fs_dir``, a plain client lends ``--segment-mib``, and W threads put
twice that in distinct 1 MiB keys (thread t the keys t, t+W, ...) once each,
with no retry: writers faster than eviction can move objects to disk.
Reported per side and W: puts/s (successful puts over the wall time of the
phase), put p99, the share of puts that returned 0, and the share of the
keys read back byte for byte afterwards.

    python benchmarks/offload_bench.py            # both sides and the ceiling
    python benchmarks/offload_bench.py --quick    # 64 MiB segment
    python benchmarks/offload_bench.py --writers-only --rounds 3
"""

from __future__ import annotations

import argparse
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
    MachineLoad,
    MiB,
    add_upstream_python,
    find_ours_master,
    find_upstream_master,
    running_master,
)


def drop_cache(root: Path) -> int:
    """fsync and drop from the page cache every file under ``root``; bytes."""
    total = 0
    for p in root.rglob("*"):
        if not p.is_file():
            continue
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def cached_bytes(root: Path) -> int | None:
    """Bytes of the files under ``root`` in the page cache (``fincore``), if it runs."""
    files = [str(p) for p in root.rglob("*") if p.is_file()]
    if not files or shutil.which("fincore") is None:
        return None
    r = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", *files],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        return None
    return sum(int(x) for x in r.stdout.split())


def value(block: bytes, i: int) -> bytes:
    b = bytearray(block)
    b[:8] = i.to_bytes(8, "little")
    b[-8:] = (i * 7919).to_bytes(8, "little")
    return bytes(b)


def side_main(args: argparse.Namespace) -> int:
    from mooncake.store import MooncakeDistributedStore

    root = Path(args.dir)
    seg = args.segment_mib * MiB
    n = 3 * args.segment_mib
    block = os.urandom(MiB)
    with running_master(args.master, [f"--root_fs_dir={root}", "--default_kv_lease_ttl=500"]) as (
        rpc,
        meta,
    ):
        s = MooncakeDistributedStore()
        rc = s.setup("127.0.0.1", meta, seg, 512 * MiB, "tcp", "", rpc)
        if rc != 0:
            print(json.dumps({"error": f"setup returned {rc}"}))
            return 1
        put_fail = 0
        t0 = time.perf_counter()
        for i in range(n):
            v = value(block, i)
            deadline = time.monotonic() + 30
            while True:
                rc = s.put(f"k_{i}", v)
                if rc != -200 or time.monotonic() > deadline:
                    break
            if rc != 0:
                put_fail += 1
        t_write = time.perf_counter() - t0
        time.sleep(args.settle)
        on_disk = drop_cache(root)
        disk_keys = range(n - args.segment_mib)
        mem_keys = range(n - args.segment_mib, n)
        res: dict[str, Any] = {"n": n, "put_fail": put_fail, "disk_bytes": on_disk}
        res["cached_after_drop"] = cached_bytes(root)
        res["write_gbs"] = n * MiB / t_write / 1e9
        for name, keys in (("disk", disk_keys), ("mem", mem_keys)):
            ok = 0
            t0 = time.perf_counter()
            for i in keys:
                got = s.get(f"k_{i}")
                ok += got == value(block, i)
            t = time.perf_counter() - t0
            res[f"{name}_ok"] = ok
            res[f"{name}_n"] = len(keys)
            res[f"{name}_gbs"] = len(keys) * MiB / t / 1e9
        stats = s.get_client_stats() if hasattr(s, "get_client_stats") else {}
        if isinstance(stats, dict) and "disk_bytes_read" in stats:
            res["disk_reads_mib"] = stats["disk_bytes_read"] / MiB
        s.close()
    print(json.dumps(res))
    return 0


def writers_main(args: argparse.Namespace) -> int:
    """One side, one writer count: the concurrent-writers row as JSON."""
    import threading

    from mooncake.store import MooncakeDistributedStore

    root = Path(args.dir)
    seg = args.segment_mib * MiB
    n = 2 * args.segment_mib
    w = args.threads
    block = os.urandom(MiB)
    with running_master(args.master, [f"--root_fs_dir={root}"]) as (rpc, meta):
        s = MooncakeDistributedStore()
        rc = s.setup("127.0.0.1", meta, seg, 64 * MiB, "tcp", "", rpc)
        if rc != 0:
            print(json.dumps({"error": f"setup returned {rc}"}))
            return 1
        lat: list[list[float]] = [[] for _ in range(w)]
        codes: list[dict[int, int]] = [{} for _ in range(w)]

        def writer(t: int) -> None:
            for i in range(t, n, w):
                v = value(block, i)
                t0 = time.perf_counter()
                rc = s.put(f"c_{i}", v)
                lat[t].append(time.perf_counter() - t0)
                codes[t][rc] = codes[t].get(rc, 0) + 1

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(w)]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
        all_lat = sorted(x for part in lat for x in part)
        merged: dict[int, int] = {}
        for c in codes:
            for k, v in c.items():
                merged[k] = merged.get(k, 0) + v
        ok_puts = merged.get(0, 0)
        read_ok = sum(s.get(f"c_{i}") == value(block, i) for i in range(n))
        s.close()
    p99 = all_lat[min(len(all_lat) - 1, int(len(all_lat) * 0.99))] if all_lat else 0.0
    res = {
        "n": n,
        "threads": w,
        "puts_ok": ok_puts,
        "codes": {str(k): v for k, v in sorted(merged.items())},
        "puts_per_s": ok_puts / wall if wall > 0 else 0.0,
        "p99_ms": p99 * 1000,
        "reads_ok": read_ok,
    }
    print(json.dumps(res))
    return 0


def side_result(name: str, cmd: list[str]) -> Any:
    """Run one side's child ``cmd``: the last JSON line it printed, or a
    failure line naming ``name`` when it failed or printed none."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        return f"{name} failed (rc {r.returncode}): {r.stderr[-800:]}"
    return json.loads(lines[-1])


def run_writers_side(
    name: str, python: str, master: str, args: argparse.Namespace, d: Path, threads: int
) -> Any:
    cmd = [
        python,
        __file__,
        "--side",
        "--mode=writers",
        f"--master={master}",
        f"--dir={d}",
        f"--segment-mib={args.segment_mib}",
        f"--threads={threads}",
    ]
    return side_result(name, cmd)


def print_writers(rows: list[tuple[int, int, str, Any]], seg: int) -> None:
    print(
        f"# concurrent writers: W threads put {2 * seg} distinct 1 MiB keys once each "
        f"(no retry) into a {seg} MiB segment, then every key is read back"
    )
    print("| round | W | impl | puts ok | puts/s | put p99 ms | reads ok | other codes |")
    print("|---|---|---|---|---|---|---|---|")
    for rnd, w, name, r in rows:
        if isinstance(r, str):
            print(f"| {rnd} | {w} | {name} | {r} |  |  |  |  |")
            continue
        other = {k: v for k, v in r["codes"].items() if k != "0"}
        print(
            f"| {rnd} | {w} | {name} | {100.0 * r['puts_ok'] / r['n']:.1f}% | "
            f"{r['puts_per_s']:.0f} | {r['p99_ms']:.1f} | "
            f"{100.0 * r['reads_ok'] / r['n']:.1f}% | {other or ''} |"
        )
    by: dict[tuple[int, int], dict[str, Any]] = {}
    for rnd, w, name, r in rows:
        if isinstance(r, dict):
            by.setdefault((rnd, w), {})[name] = r
    for (rnd, w), pair in sorted(by.items()):
        o, u = pair.get("ours"), pair.get("upstream")
        if o and u and u["puts_per_s"] > 0 and u["p99_ms"] > 0:
            print(
                f"# round {rnd}, W={w}: ours / upstream puts/s "
                f"{o['puts_per_s'] / u['puts_per_s']:.2f}x, put p99 "
                f"{o['p99_ms'] / u['p99_ms']:.2f}x"
            )


def writers_rows(
    sides: list[tuple[str, str, str | None]], args: argparse.Namespace, work: Path
) -> tuple[list[tuple[int, int, str, Any]], list[str]]:
    """The concurrent-writers rows of every round, writer count and side
    (the sides alternate which goes first), and the machine's load during each."""
    counts = [int(x) for x in args.writers.split(",") if x.strip()]
    rows: list[tuple[int, int, str, Any]] = []
    loads: list[str] = []
    try:
        for rnd in range(1, args.rounds + 1):
            for w in counts:
                order = sides if (rnd + w) % 2 == 0 else list(reversed(sides))
                for name, py, master in order:
                    if not master:
                        rows.append((rnd, w, name, f"{name}: no mooncake_master found"))
                        continue
                    d = work / f"{name}-w{w}-r{rnd}"
                    d.mkdir()
                    load = MachineLoad()
                    rows.append((rnd, w, name, run_writers_side(name, py, master, args, d, w)))
                    loads.append(
                        f"# machine while round {rnd}, W={w}, {name} ran: {load.summary()}"
                    )
                    shutil.rmtree(d, ignore_errors=True)
    finally:
        if args.writers_only:
            shutil.rmtree(work, ignore_errors=True)
    return rows, loads


def device_read(dirpath: Path, size: int) -> float:
    """GB/s of a dd-style sequential read of a fresh, uncached file of ``size`` bytes."""
    p = dirpath / "ceiling.dat"
    block = os.urandom(MiB)
    with open(p, "wb") as f:
        f.writelines(block for _ in range(size // MiB))
        f.flush()
        os.fsync(f.fileno())
    drop_cache(dirpath)
    buf = bytearray(MiB)
    t0 = time.perf_counter()
    with open(p, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    t = time.perf_counter() - t0
    p.unlink()
    return size / t / 1e9


def run_side(name: str, python: str, master: str, args: argparse.Namespace, d: Path) -> Any:
    cmd = [
        python,
        __file__,
        "--side",
        f"--master={master}",
        f"--dir={d}",
        f"--segment-mib={args.segment_mib}",
        f"--settle={args.settle}",
    ]
    return side_result(name, cmd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="scenario", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--segment-mib", type=int, default=256)
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--writers", default="1,4,8", help="writer thread counts of the concurrent-writers rows"
    )
    ap.add_argument("--writers-only", action="store_true", help="only the concurrent-writers rows")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the concurrent-writers rows")
    ap.add_argument("--work-dir", default=None, help="where the files go (default: a temp dir)")
    add_upstream_python(ap)
    args = ap.parse_args()
    if args.side:
        return writers_main(args) if args.mode == "writers" else side_main(args)
    if args.quick:
        args.segment_mib = 64
    work = Path(tempfile.mkdtemp(prefix="offload-bench-", dir=args.work_dir))
    results: dict[str, Any] = {}
    ours = find_ours_master()
    sides = [("ours", sys.executable, ours)]
    up_py = Path(args.upstream_python)
    if up_py.exists():
        sides.append(("upstream", str(up_py), find_upstream_master(up_py)))
    rows, loads = writers_rows(sides, args, work)
    if args.writers_only:
        print_writers(rows, args.segment_mib)
        print("\n".join(loads))
        return 0
    try:
        for name, py, master in sides:
            if not master:
                results[name] = f"{name}: no mooncake_master found"
                continue
            d = work / name
            d.mkdir()
            results[name] = run_side(name, py, master, args, d)
            shutil.rmtree(d, ignore_errors=True)
        disk_bytes = 2 * args.segment_mib * MiB
        ceiling = device_read(work, disk_bytes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seg = args.segment_mib
    print(f"# SSD offload: {3 * seg} x 1 MiB objects into a {seg} MiB segment, then read all back")
    print(f"# device: dd-style sequential read of {2 * seg} MiB, uncached: {ceiling:.2f} GB/s")
    print("| impl | success | write GB/s | disk-tier read GB/s | x device | memory read GB/s |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        if isinstance(r, str):
            print(f"| {name} | {r} |  |  |  |  |")
            continue
        ok = r["disk_ok"] + r["mem_ok"]
        rate = 100.0 * ok / r["n"]
        print(
            f"| {name} | {rate:.1f}% ({ok}/{r['n']}) | {r['write_gbs']:.2f} | "
            f"{r['disk_gbs']:.2f} | {r['disk_gbs'] / ceiling:.2f} | {r['mem_gbs']:.2f} |"
        )
    for name, r in results.items():
        if isinstance(r, dict):
            c = r.get("cached_after_drop")
            c_txt = "unknown" if c is None else f"{c / MiB:.0f} MiB"
            print(
                f"# {name}: {r['disk_bytes'] / MiB:.0f} MiB of files, cached after the drop: "
                f"{c_txt}; {r['put_fail']} puts failed"
                + (
                    f"; {r['disk_reads_mib']:.0f} MiB read from its disk tier"
                    if "disk_reads_mib" in r
                    else ""
                )
            )
    o, u = results.get("ours"), results.get("upstream")
    if isinstance(o, dict) and isinstance(u, dict):
        print(
            f"# ours / upstream: disk-tier reads {o['disk_gbs'] / u['disk_gbs']:.2f}x, "
            f"writes {o['write_gbs'] / u['write_gbs']:.2f}x"
        )
    print_writers(rows, seg)
    print("\n".join(loads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
