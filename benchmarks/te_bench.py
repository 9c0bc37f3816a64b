#!/usr/bin/env python3
"""Transfer-engine benchmark: this project's ``mooncake.engine`` vs the upstream
0.3.13 wheel's, in one run.

    python benchmarks/te_bench.py              # both sides, both modes (~4 min)
    python benchmarks/te_bench.py --quick      # ~1.5 min
    python benchmarks/te_bench.py --only ours --mode same

Each side (ours with this interpreter, upstream with
``/work/venv-upstream/bin/python``, see upstream_env.sh) runs a target process
and an initiator process on this host, both ``initialize("127.0.0.1",
"P2PHANDSHAKE", "tcp", "")``. The target registers 64 blocks of the largest
size holding a known pattern. For each block size (4 KiB, 64 KiB, 1 MiB,
16 MiB) the initiator times ``transfer_sync_write`` / ``transfer_sync_read`` of
one block and ``batch_transfer_sync_write`` / ``batch_transfer_sync_read`` of
64 blocks. Before any timing, every read is checked byte for byte against the
target's pattern, and every write by reading it back.

Modes: ``same`` (processes of one host, whatever path each engine takes) and
``tcp`` (``MC_FORCE_TCP=1`` in both processes of both sides).

Ceilings measured in the same run: a single-thread copy (numpy ``copyto``) of
the same bytes between two buffers of this process (the 64-block rows copy
block by block), and the loopback TCP ceiling of
``benchmarks/tcp_loopback_ceiling.c`` (16 MiB reads, ``cc=reno`` as our
same-host connections use; the best of 1 and 4 streams).

Units: GB/s (1e9 B/s). 4 KiB rows also show the median latency of one call.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import KiB, MiB, add_only, json_child, stop_child, write_json

SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB]
BLOCKS = 64
UPSTREAM_PY = Path(os.environ.get("UPSTREAM_VENV", "/work/venv-upstream")) / "bin" / "python"
HERE = Path(__file__).resolve()
OPS = ["write", "read", "batch_write", "batch_read"]


def size_label(size: int) -> str:
    return f"{size // MiB}MiB" if size >= MiB else f"{size // KiB}KiB"


def pattern(n: int) -> Any:
    """``n`` pseudo-random bytes (a multiple of 1 MiB or below it), made
    without temporaries larger than 1 MiB."""
    import numpy as np

    base = ((np.arange(min(n, MiB), dtype=np.uint32) * np.uint32(2654435761)) >> 7).astype(np.uint8)
    out = np.empty(n, np.uint8)
    for i, off in enumerate(range(0, n, MiB)):
        np.add(base[: n - off], np.uint8(i * 37 % 251), out=out[off : off + MiB])
    return out


# ------------------------------------------------------------------ target


def target_main() -> int:
    import numpy as np
    from mooncake.engine import TransferEngine

    extent = BLOCKS * max(SIZES)
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = pattern(extent)
    assert e.register_memory(buf.ctypes.data, buf.nbytes) == 0
    print(json.dumps({"session": f"127.0.0.1:{e.get_rpc_port()}", "addr": buf.ctypes.data}))
    sys.stdout.flush()
    sys.stdin.read()  # until the initiator closes our stdin
    del np
    return 0


# ------------------------------------------------------------------ initiator


def timed_cell(fn: Any, budget: float, min_iters: int, max_iters: int) -> list[float]:
    """Per-call seconds of ``fn`` over about ``budget`` seconds."""
    fn()  # warm-up
    laps: list[float] = []
    start = time.perf_counter()
    while len(laps) < max_iters and (len(laps) < min_iters or time.perf_counter() - start < budget):
        t0 = time.perf_counter()
        fn()
        laps.append(time.perf_counter() - t0)
    return laps


def make_cells(e: Any, sess: str, addrs: tuple[int, int, int], size: int) -> dict[str, Any]:
    """The timed call of each op at ``size``, and the bytes it moves."""
    s0, d0, raddr = addrs
    offs = [i * size for i in range(BLOCKS)]
    srcs, dsts, rems = [s0 + o for o in offs], [d0 + o for o in offs], [raddr + o for o in offs]
    lens = [size] * BLOCKS
    return {
        "write": (lambda: e.transfer_sync_write(sess, s0, raddr, size), size),
        "read": (lambda: e.transfer_sync_read(sess, d0, raddr, size), size),
        "batch_write": (lambda: e.batch_transfer_sync_write(sess, srcs, rems, lens), BLOCKS * size),
        "batch_read": (lambda: e.batch_transfer_sync_read(sess, dsts, rems, lens), BLOCKS * size),
    }


def side_main(args: argparse.Namespace) -> int:
    import numpy as np
    from mooncake.engine import TransferEngine

    env = dict(os.environ)
    if args.mode == "tcp":
        env["MC_FORCE_TCP"] = "1"
        os.environ["MC_FORCE_TCP"] = "1"
    tgt, info = json_child([sys.executable, str(HERE), "--target"], env)
    sess, raddr = info["session"], info["addr"]
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    extent = BLOCKS * max(SIZES)
    src = pattern(extent)
    dst = np.empty(extent, np.uint8)
    dst.fill(0)
    assert e.register_memory(src.ctypes.data, extent) == 0
    assert e.register_memory(dst.ctypes.data, extent) == 0
    s0, d0 = src.ctypes.data, dst.ctypes.data
    budget, min_iters = (0.4, 3) if args.quick else (1.0, 5)
    results: list[dict[str, Any]] = []

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise SystemExit(f"{what} returned {rc}")

    for size in SIZES:
        ext = BLOCKS * size
        offs = [i * size for i in range(BLOCKS)]
        lens = [size] * BLOCKS
        # Reads are checked against the target's pattern before timing.
        dst[:ext] = 0
        check(e.transfer_sync_read(sess, d0, raddr, size), "read")
        assert np.array_equal(dst[:size], src[:size]), f"read {size} mismatch"
        dst[:ext] = 0
        check(
            e.batch_transfer_sync_read(
                sess, [d0 + o for o in offs], [raddr + o for o in offs], lens
            ),
            "batch_read",
        )
        assert np.array_equal(dst[:ext], src[:ext]), f"batch read {size} mismatch"
        # Writes are checked by reading a different pattern back, then the
        # target's pattern is restored.
        np.bitwise_xor(src[:ext], 0x5A, out=dst[:ext])
        check(
            e.batch_transfer_sync_write(
                sess, [d0 + o for o in offs], [raddr + o for o in offs], lens
            ),
            "batch_write",
        )
        check(e.transfer_sync_write(sess, d0, raddr, size), "write")
        dst[:ext] = 0
        check(
            e.batch_transfer_sync_read(
                sess, [d0 + o for o in offs], [raddr + o for o in offs], lens
            ),
            "batch_read",
        )
        assert np.array_equal(dst[:ext], src[:ext] ^ 0x5A), f"write {size} mismatch"
        check(
            e.batch_transfer_sync_write(
                sess, [s0 + o for o in offs], [raddr + o for o in offs], lens
            ),
            "batch_write",
        )
        max_iters = 20000 if size <= 64 * KiB else 2000

        cells = make_cells(e, sess, (s0, d0, raddr), size)
        for op in OPS:
            fn, nbytes = cells[op]
            laps = timed_cell(fn, budget, min_iters, max_iters if "batch" not in op else 500)
            total = sum(laps)
            results.append(
                {
                    "mode": args.mode,
                    "op": op,
                    "size": size_label(size),
                    "gbps": nbytes * len(laps) / total / 1e9,
                    "p50_us": statistics.median(laps) * 1e6,
                    "iters": len(laps),
                }
            )
        # Reads stayed correct through the timing.
        assert np.array_equal(dst[:ext], src[:ext]), f"timed read {size} mismatch"
    stop_child(tgt)
    out = json.dumps(results)
    if args.json:
        Path(args.json).write_text(out)
    else:
        print(out)
    return 0


# ------------------------------------------------------------------ ceilings


def copier(src: Any, dst: Any, size: int, blocks: int) -> Any:
    """A single-thread copy of ``blocks`` blocks of ``size``, block by block."""
    import numpy as np

    def run() -> None:
        for i in range(blocks):
            np.copyto(dst[i * size : (i + 1) * size], src[i * size : (i + 1) * size])

    return run


def copy_ceilings(quick: bool) -> dict[tuple[str, str], float]:
    """Single-thread copy GB/s of the bytes each row moves, in this process."""
    import numpy as np

    extent = BLOCKS * max(SIZES)
    src = pattern(extent)
    dst = np.empty(extent, np.uint8)
    dst.fill(0)
    budget = 0.3 if quick else 0.8
    out: dict[tuple[str, str], float] = {}
    for size in SIZES:
        single = timed_cell(copier(src, dst, size, 1), budget, 5, 20000)
        out[("single", size_label(size))] = size * len(single) / sum(single) / 1e9
        laps = timed_cell(copier(src, dst, size, BLOCKS), budget, 3, 500)
        out[("batch", size_label(size))] = BLOCKS * size * len(laps) / sum(laps) / 1e9
    return out


def loopback_ceiling() -> float | None:
    """Best overall GB/s of the C loopback pair (16 MiB reads, reno)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return None
    exe = Path(tempfile.gettempdir()) / f"te_tcp_ceiling_{os.getpid()}"
    src = HERE.parent / "tcp_loopback_ceiling.c"
    subprocess.run([cc, "-O2", "-pthread", str(src), "-o", str(exe)], check=True)
    best = 0.0
    try:
        for streams in (1, 4):
            r = subprocess.run(
                [
                    str(exe),
                    f"streams={streams}",
                    "objs=12",
                    "sendfile",
                    "block",
                    "iters=120",
                    "cc=reno",
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            for word in r.stdout.split("overall ")[1:]:
                best = max(best, float(word.split()[0]))
    finally:
        exe.unlink(missing_ok=True)
    return best or None


# ------------------------------------------------------------------ driver


def run_side(python: str, mode: str, quick: bool) -> list[dict[str, Any]] | str:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [python, str(HERE), "--side", "--mode", mode, "--json", path]
    if quick:
        cmd.append("--quick")
    env = {k: v for k, v in os.environ.items() if k != "MC_FORCE_TCP"}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, check=False)
    try:
        if r.returncode != 0:
            return f"failed (rc={r.returncode}): {r.stderr.strip()[-600:]}"
        return json.loads(Path(path).read_text())  # type: ignore[no-any-return]
    finally:
        Path(path).unlink(missing_ok=True)


def print_table(
    modes: list[str],
    results: dict[str, dict[str, list[dict[str, Any]] | str]],
    copies: dict[tuple[str, str], float],
    ceiling: float | None,
) -> list[dict[str, Any]]:
    """Prints the markdown table (ours, upstream and the ceiling per mode, op and
    size) and returns its rows."""

    def cell(side: str, mode: str, op: str, size: str) -> dict[str, Any] | None:
        rows = results.get(side, {}).get(mode)
        if not isinstance(rows, list):
            return None
        return next((r for r in rows if r["op"] == op and r["size"] == size), None)

    rows_out = []
    print(
        "| mode | op | size | ours GB/s | upstream GB/s | ours/up | ceiling GB/s | ours/ceiling |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for mode in modes:
        for size in SIZES:
            sl = size_label(size)
            for op in OPS:
                o, u = cell("ours", mode, op, sl), cell("upstream", mode, op, sl)
                ceil = copies[("batch" if "batch" in op else "single", sl)]
                ceil_name = "copy"
                if mode == "tcp" and size == 16 * MiB and ceiling:
                    ceil, ceil_name = ceiling, "tcp"
                og = o["gbps"] if o else None
                ug = u["gbps"] if u else None
                ratio = f"{og / ug:.2f}x" if og and ug else "-"
                lat = ""
                if size == 4 * KiB and o and u:
                    lat = f" (p50 {o['p50_us']:.0f} / {u['p50_us']:.0f} us)"
                print(
                    f"| {mode} | {op} | {sl} | {og or 0:.3f} | {ug or 0:.3f} | {ratio}{lat} "
                    f"| {ceil:.2f} ({ceil_name}) | {(og or 0) / ceil:.2f}x |"
                )
                rows_out.append(
                    {
                        "mode": mode,
                        "op": op,
                        "size": sl,
                        "ours": o,
                        "upstream": u,
                        "ceiling": ceil,
                        "ceiling_kind": ceil_name,
                    }
                )
    return rows_out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    add_only(p)
    p.add_argument("--mode", choices=["same", "tcp"])
    p.add_argument("--json", help="write the table's rows here")
    p.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--target", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.target:
        return target_main()
    if args.side:
        return side_main(args)

    modes = [args.mode] if args.mode else ["same", "tcp"]
    sides = {"ours": sys.executable, "upstream": str(UPSTREAM_PY)}
    if args.only:
        sides = {args.only: sides[args.only]}
    if "upstream" in sides and not UPSTREAM_PY.exists():
        print(f"no upstream venv at {UPSTREAM_PY} (run benchmarks/upstream_env.sh)")
        sides.pop("upstream")
    results: dict[str, dict[str, list[dict[str, Any]] | str]] = {s: {} for s in sides}
    for mode in modes:
        for side, py in sides.items():
            t0 = time.perf_counter()
            results[side][mode] = run_side(py, mode, args.quick)
            print(f"# {side} {mode}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    copies = copy_ceilings(args.quick)
    ceiling = loopback_ceiling() if "tcp" in modes else None

    rows_out = print_table(modes, results, copies, ceiling)
    for side, by_mode in results.items():
        for mode, r in by_mode.items():
            if isinstance(r, str):
                print(f"{side} {mode}: {r}")
    write_json(args.json, rows_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
