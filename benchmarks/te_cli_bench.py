#!/usr/bin/env python3
"""``transfer_engine_bench`` side by side: this package's command against the
upstream 0.3.13 wheel's binary, with the same flags, in one run.

    python benchmarks/te_cli_bench.py            # ~1.5 min
    python benchmarks/te_cli_bench.py --duration 5

For each side a target process and an initiator process run on this host
(``--metadata_server=P2PHANDSHAKE --protocol=tcp --threads=4
--batch_size=32``), for reads and writes of 64 KiB and 1 MiB blocks; the
table is each initiator's own closing line (``throughput ... GB/s``, 1e9 B/s).
Modes: ``same`` (whatever path each engine takes between processes of one
host: ours copies with process_vm_readv/writev, upstream's tcp transport
uses loopback TCP) and ``tcp`` (``MC_FORCE_TCP=1`` for both sides, so both
move bytes over loopback TCP). The loopback TCP ceiling
(``tcp_loopback_ceiling.c``, via ``te_bench.py``) is measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
UPSTREAM_BIN = (
    Path(os.environ.get("UPSTREAM_VENV", "/work/venv-upstream"))
    / "lib"
    / "python3.11"
    / "site-packages"
    / "mooncake"
    / "transfer_engine_bench"
)
OURS_BIN = Path(sys.executable).parent / "transfer_engine_bench"
COMMON = ["--metadata_server=P2PHANDSHAKE", "--protocol=tcp", "--threads=4", "--batch_size=32"]
DONE = re.compile(r"throughput (\d+\.\d+) GB/s")
SEGMENT = {
    "ours": re.compile(r"target: segment (\S+),"),
    "upstream": re.compile(r"listening on (\S+)"),
}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pair(
    side: str, exe: Path, op: str, block: int, duration: int, env: dict[str, str]
) -> float:
    flags = [*COMMON, f"--block_size={block}", "--buffer_size=268435456"]
    log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - the target writes it while we poll
        prefix=f"te_cli_{side}_", suffix=".log", delete=False
    )
    target = subprocess.Popen(
        [str(exe), "--mode=target", f"--local_server_name=127.0.0.1:{free_port()}", *flags],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        segment = None
        while segment is None and time.monotonic() < deadline:
            m = SEGMENT[side].search(Path(log.name).read_text(errors="replace"))
            segment = m.group(1) if m else None
            time.sleep(0.05)
        if segment is None:
            raise RuntimeError(f"{side} target did not start: {log.name}")
        r = subprocess.run(
            [
                str(exe),
                "--mode=initiator",
                "--local_server_name=127.0.0.1",
                f"--segment_id={segment}",
                f"--operation={op}",
                f"--duration={duration}",
                *flags,
            ],
            capture_output=True,
            text=True,
            timeout=duration + 120,
            env=env,
            check=False,
        )
        m = DONE.search(r.stderr + r.stdout)
        if r.returncode != 0 or not m:
            raise RuntimeError(f"{side} initiator failed ({r.returncode}): {r.stderr[-2000:]}")
        return float(m.group(1))
    finally:
        target.terminate()
        try:
            target.wait(timeout=10)
        except subprocess.TimeoutExpired:
            target.kill()
        log.close()
        os.unlink(log.name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=int, default=3)
    args = ap.parse_args()
    sides = {"ours": OURS_BIN, "upstream": UPSTREAM_BIN}
    for side, exe in sides.items():
        if not exe.exists():
            print(f"{side}: {exe} not found", file=sys.stderr)
            return 1
    sys.path.insert(0, str(HERE.parent))
    from te_bench import loopback_ceiling

    ceiling = loopback_ceiling()
    print(
        f"transfer_engine_bench, {' '.join(COMMON)}, --duration={args.duration}; "
        f"loopback TCP ceiling {ceiling:.2f} GB/s"
        if ceiling
        else "loopback TCP ceiling: not measured"
    )
    print("| mode | op | block | ours GB/s | upstream GB/s | ours/up |")
    print("|---|---|---|---|---|---|")
    for mode in ("same", "tcp"):
        env = dict(os.environ)
        if mode == "tcp":
            env["MC_FORCE_TCP"] = "1"
        for op in ("read", "write"):
            for block in (64 << 10, 1 << 20):
                got = {
                    s: run_pair(s, exe, op, block, args.duration, env) for s, exe in sides.items()
                }
                ratio = got["ours"] / got["upstream"] if got["upstream"] else float("inf")
                label = f"{block >> 10}KiB" if block < (1 << 20) else f"{block >> 20}MiB"
                print(
                    f"| {mode} | {op} | {label} | {got['ours']:.2f} | {got['upstream']:.2f} | "
                    f"{ratio:.2f}x |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
