#!/usr/bin/env python3
"""GPU benchmark: this build's engine and store with CUDA device memory,
against torch copies of the same bytes in the same run.

    python benchmarks/gpu_bench.py [--json OUT.json] [--quick] [--budget SECONDS]

On a machine without a GPU (no CUDA driver, or torch without a CUDA device)
it prints why, writes ``{"gpu": false, "reason": ...}`` to ``--json``, and
exits 0.

Sizes: 4 KiB, 1 MiB, 16 MiB, 256 MiB (``--quick``: up to 16 MiB). Each row is
the median of several timed calls after one untimed warm-up; every path is
checked byte for byte before it is timed. Units: GB/s (1e9 B/s).

Engine (``mooncake.engine.TransferEngine``, ``transfer_sync_write`` /
``transfer_sync_read``), between this process and a peer process on the
same GPU:
  d2d  write/read  this process's device buffer <-> the peer's device buffer
                   (same host: CUDA IPC where the driver allows it);
  d2d-tcp          the same with ``MC_FORCE_TCP=1`` in both processes
                   (pinned staging at both ends, as between hosts);
  h2d / d2h        a pinned host buffer here -> the peer's device buffer, and
                   a device buffer here -> the peer's pinned host buffer.
Baselines: torch ``copy_`` of the same bytes in this process
(device->device, pinned host->device, device->pinned host).

Store (``MooncakeDistributedStore`` on a master started here, TCP):
``put_tensor`` of a CUDA tensor, ``get_tensor_into`` into a CUDA buffer, and
``get_tensor_into_cuda`` (a dummy client of a ``mooncake_client`` daemon
started here); baseline: the same-run pinned round trip (device -> pinned
host -> device) of the same bytes.

The RDMA devices of the machine (``/sys/class/infiniband``) are recorded;
this build moves bytes over TCP and CUDA IPC only.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    KiB,
    MiB,
    env_overrides,
    find_ours_master,
    free_port,
    json_child,
    start_master,
    stop_child,
    write_json,
)

SIZES = [4 * KiB, 1 * MiB, 16 * MiB, 256 * MiB]
HEADER = 304


def rdma_devices() -> list[str]:
    p = Path("/sys/class/infiniband")
    return sorted(os.listdir(p)) if p.is_dir() else []


def gbps(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 3) if seconds > 0 else 0.0


def timed(fn: Callable[[], Any], nbytes: int, budget_s: float) -> dict[str, Any]:
    """One warm-up, then calls until ~``budget_s`` (3..50 calls): median GB/s."""
    import torch

    fn()
    torch.cuda.synchronize()
    times: list[float] = []
    t_end = time.monotonic() + budget_s
    while len(times) < 3 or (len(times) < 50 and time.monotonic() < t_end):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"gbps": gbps(nbytes, med), "median_us": round(med * 1e6, 1), "calls": len(times)}


# ------------------------------------------------------------------ the peer process


def peer_main() -> int:
    """``--peer MAXBYTES``: an engine with a device and a pinned host buffer."""
    import torch
    from mooncake.engine import TransferEngine

    n = int(sys.argv[sys.argv.index("--peer") + 1])
    e = TransferEngine()
    rc = e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    dev = torch.zeros(n, dtype=torch.uint8, device="cuda")
    host = torch.zeros(n, dtype=torch.uint8).pin_memory()
    torch.cuda.synchronize()
    rcs = [rc, e.register_memory(dev.data_ptr(), n), e.register_memory(host.data_ptr(), n)]
    print(
        json.dumps(
            {
                "rc": rcs,
                "name": f"127.0.0.1:{e.get_rpc_port()}",
                "dev": dev.data_ptr(),
                "host": host.data_ptr(),
            }
        ),
        flush=True,
    )
    sys.stdin.read()
    return 0


@contextlib.contextmanager
def peer(max_bytes: int, env: dict[str, str]) -> Iterator[dict[str, Any]]:
    proc, info = json_child(
        [sys.executable, __file__, "--peer", str(max_bytes)], env={**os.environ, **env}
    )
    try:
        if info.get("rc") != [0, 0, 0]:
            raise RuntimeError(f"the peer did not start: {info}")
        yield info
    finally:
        stop_child(proc)


# ------------------------------------------------------------------ engine


def engine_rows(sizes: list[int], per_row_s: float) -> list[dict[str, Any]]:
    import torch
    from mooncake.engine import TransferEngine

    top = max(sizes)
    rows: list[dict[str, Any]] = []
    src = torch.randint(0, 256, (top,), dtype=torch.uint8, device="cuda")
    back = torch.zeros(top, dtype=torch.uint8, device="cuda")
    pinned = torch.randint(0, 256, (top,), dtype=torch.uint8).pin_memory()
    pinned_back = torch.zeros(top, dtype=torch.uint8).pin_memory()
    torch.cuda.synchronize()

    def run_mode(mode: str, env: dict[str, str]) -> None:
        with env_overrides(env), peer(top, env) as p:
            e = TransferEngine()
            assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
            for t in (src, back, pinned, pinned_back):
                assert e.register_memory(t.data_ptr(), top) == 0
            name = p["name"]
            cases: list[tuple[str, int, int, int, Any]] = [
                ("d2d write", 1, src.data_ptr(), p["dev"], src),
                ("d2d read", 0, back.data_ptr(), p["dev"], None),
            ]
            if mode == "same-host":
                cases += [
                    ("h2d write", 1, pinned.data_ptr(), p["dev"], pinned),
                    ("d2h write", 1, src.data_ptr(), p["host"], src),
                ]
            for n in sizes:
                for what, write, local, remote, origin in cases:
                    op = e.transfer_sync_write if write else e.transfer_sync_read
                    assert op(name, local, remote, n) == 0, f"{what} {n}"
                    if origin is None:
                        torch.cuda.synchronize()
                        assert torch.equal(back[:n], src[:n]), f"{what} {n}"
                    else:
                        # Read the peer's bytes back and compare.
                        scratch = back if remote == p["dev"] else pinned_back
                        assert e.transfer_sync_read(name, scratch.data_ptr(), remote, n) == 0
                        torch.cuda.synchronize()
                        assert torch.equal(scratch[:n].cpu(), origin[:n].cpu()), f"{what} {n}"
                    row = timed(functools.partial(op, name, local, remote, n), n, per_row_s)
                    rows.append(
                        {"section": "engine", "path": f"{what} ({mode})", "bytes": n, **row}
                    )

    run_mode("same-host", {})
    run_mode("tcp", {"MC_FORCE_TCP": "1"})

    dst = torch.zeros(top, dtype=torch.uint8, device="cuda")

    def baselines(n: int) -> None:
        for what, fn in [
            ("torch d2d copy_", lambda: dst[:n].copy_(src[:n])),
            ("torch h2d copy_ (pinned)", lambda: dst[:n].copy_(pinned[:n], non_blocking=True)),
            ("torch d2h copy_ (pinned)", lambda: pinned_back[:n].copy_(src[:n], non_blocking=True)),
        ]:
            rows.append({"section": "engine", "path": what, "bytes": n, **timed(fn, n, per_row_s)})

    for n in sizes:
        baselines(n)
    return rows


# ------------------------------------------------------------------ store


@contextlib.contextmanager
def store_env() -> Iterator[tuple[Any, Any]]:
    """A master, a daemon, a set-up store and a dummy: (store, dummy)."""
    from mooncake.store import MooncakeDistributedStore

    master_bin = find_ours_master()
    client_bin = shutil.which("mooncake_client") or str(
        Path(sys.executable).parent / "mooncake_client"
    )
    if master_bin is None:
        raise RuntimeError("mooncake_master was not found")
    proc, rpc, meta = start_master(master_bin, ["--eviction_high_watermark_ratio=0.98"])
    port = free_port()
    daemon = subprocess.Popen(
        [
            client_bin,
            "--host=127.0.0.1",
            f"--port={port}",
            "--global_segment_size=2GB",
            f"--master_server_address={rpc}",
            f"--metadata_server={meta}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    s = MooncakeDistributedStore()
    d = MooncakeDistributedStore()
    try:
        rc = s.setup("127.0.0.1", meta, 2 << 30, 1 << 30, "tcp", "", rpc)
        if rc != 0:
            raise RuntimeError(f"setup returned {rc}")
        deadline = time.monotonic() + 20
        while d.setup_dummy(512 * MiB, 512 * MiB, f"127.0.0.1:{port}") != 0:
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise RuntimeError("the mooncake_client daemon did not come up")
            time.sleep(0.2)
        yield s, d
    finally:
        for c in (d, s):
            with contextlib.suppress(Exception):
                c.close()
        for p in (daemon, proc):
            p.kill()
            p.wait(timeout=10)


def store_rows(sizes: list[int], per_row_s: float) -> list[dict[str, Any]]:

    rows: list[dict[str, Any]] = []
    with store_env() as (s, d):
        for n in sizes:
            rows.extend(store_size_rows(s, d, n, per_row_s))
    return rows


def store_size_rows(s: Any, d: Any, n: int, per_row_s: float) -> list[dict[str, Any]]:
    import torch

    t = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    buf = torch.zeros(n + HEADER + 64, dtype=torch.uint8, device="cuda")
    dest = torch.zeros(n, dtype=torch.uint8, device="cuda")
    pinned = torch.zeros(n, dtype=torch.uint8).pin_memory()
    torch.cuda.synchronize()
    key = f"gpu-bench-{n}"
    assert s.put_tensor(key, t) == 0
    v = s.get_tensor_into(key, buf.data_ptr(), buf.numel())
    assert v is not None and torch.equal(v, t), f"get_tensor_into {n}"
    assert d.get_tensor_into_cuda(key, dest) == n and torch.equal(dest, t)
    count = [0]

    def put() -> None:
        count[0] += 1
        k = f"{key}-{count[0]}"
        assert s.put_tensor(k, t) == 0
        s.remove(k, True)

    def round_trip() -> None:
        pinned.copy_(t, non_blocking=True)
        dest.copy_(pinned, non_blocking=True)

    rows = []
    for what, fn in [
        ("put_tensor (CUDA tensor, incl. remove)", put),
        (
            "get_tensor_into (CUDA buffer)",
            lambda: s.get_tensor_into(key, buf.data_ptr(), buf.numel()),
        ),
        ("get_tensor_into_cuda (dummy)", lambda: d.get_tensor_into_cuda(key, dest)),
        ("torch pinned round trip d2h+h2d", round_trip),
    ]:
        rows.append({"section": "store", "path": what, "bytes": n, **timed(fn, n, per_row_s)})
    s.remove(key, True)
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(f"{'section':8} {'path':46} {'bytes':>10} {'GB/s':>8} {'median us':>11}")
    for r in rows:
        print(
            f"{r['section']:8} {r['path']:46} {r['bytes']:>10} {r['gbps']:>8.3f} {r['median_us']:>11.1f}"
        )


def main() -> int:
    if "--peer" in sys.argv:
        return peer_main()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="sizes up to 16 MiB")
    ap.add_argument("--budget", type=float, default=0.5, help="seconds of timed calls per row")
    args = ap.parse_args()
    t0 = time.monotonic()
    result: dict[str, Any] = {"rdma_devices": rdma_devices()}
    # Why this machine cannot run it (None when it can): the CUDA tests' check.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
    from cuda_env import SKIP_REASON

    if SKIP_REASON is not None:
        print(f"gpu_bench: no GPU here ({SKIP_REASON}); nothing measured")
        write_json(args.json, {"gpu": False, "reason": SKIP_REASON, **result})
        return 0
    import torch

    sizes = [n for n in SIZES if not args.quick or n <= 16 * MiB]
    result.update(
        gpu=True,
        device=torch.cuda.get_device_name(0),
        torch=torch.__version__,
        rows=[],
        errors=[],
    )
    print(
        f"# {result['device']}, torch {result['torch']}, RDMA devices: {result['rdma_devices'] or 'none'}"
    )
    for section, fn in [("engine", engine_rows), ("store", store_rows)]:
        try:
            rows = fn(sizes, args.budget)
            result["rows"].extend(rows)
            print_rows(rows)
        except Exception as e:  # noqa: BLE001 - reported, the other section still runs
            result["errors"].append(f"{section}: {e!r}")
            print(f"gpu_bench: the {section} section failed: {e!r}")
    result["seconds"] = round(time.monotonic() - t0, 1)
    write_json(args.json, result)
    print(f"# total {result['seconds']}s")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
