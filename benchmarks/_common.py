"""Helpers shared by the benchmark scripts: free ports, starting a master,
finding ours and upstream's ``mooncake_master``, the options every comparison
takes, running a side in a child process and collecting its rows, the
machine-load note, the lines printed around a table, and the byte units
``KiB``/``MiB``/``GiB``.

Standard library only: scripts run under the upstream venv import it too.
Scripts import it as a sibling module (``benchmarks/`` is on ``sys.path``).

Importing it sets ``OPENBLAS_NUM_THREADS=1`` (unless set otherwise) for the
script and every process it starts, before any of them imports numpy:
numpy's BLAS threads spin for their first 100-200 ms after the import, and
a child process that measures right away (a reader of ``kv_tail_bench``)
then had one of a 2-core machine's cores taken by that spin, on either
side (read p99s of 2 ms and more). No benchmark times a BLAS call.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

UPSTREAM_VENV = Path(os.environ.get("UPSTREAM_VENV", "/work/venv-upstream"))
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


# ------------------------------------------------------------------ ports and processes


def free_port() -> int:
    """A free loopback port outside the store clients' data port range (12300-14300)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not 12300 <= port <= 14300:
            return port


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def master_argv(master_bin: str, rpc: int, http: int, metrics: int, *extra: str) -> list[str]:
    """A ``mooncake_master`` command line with the embedded HTTP metadata server on."""
    return [
        master_bin,
        f"--rpc_port={rpc}",
        "--enable_http_metadata_server=true",
        f"--http_metadata_server_port={http}",
        f"--metrics_port={metrics}",
        *extra,
    ]


def start_master(
    master_bin: str, extra: list[str], timeout: float = 15.0
) -> tuple[subprocess.Popen[bytes], str, str]:
    """A master on free ports, its RPC port open: (process, rpc address, metadata URL)."""
    rpc, http, metrics = free_port(), free_port(), free_port()
    proc = subprocess.Popen(
        master_argv(master_bin, rpc, http, metrics, *extra),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout
    while not port_open(rpc):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait(timeout=10)
            raise RuntimeError(f"master {master_bin} did not start")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{rpc}", f"http://127.0.0.1:{http}/metadata"


@contextlib.contextmanager
def running_master(master_bin: str, extra: list[str] | None = None) -> Iterator[tuple[str, str]]:
    """A master on free ports for the ``with`` block: yields (rpc address, metadata URL)."""
    proc, rpc, meta = start_master(
        master_bin, ["--eviction_high_watermark_ratio=0.98", *(extra or [])]
    )
    try:
        yield rpc, meta
    finally:
        proc.kill()
        proc.wait(timeout=10)


def json_child(
    argv: list[str], env: dict[str, str] | None = None, stderr: int | None = None
) -> tuple[subprocess.Popen[str], Any]:
    """Start ``argv`` with its stdin and stdout piped (text): the process, and the
    first line it prints decoded as JSON (``{}`` when it printed none)."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    return proc, json.loads(proc.stdout.readline() or "{}")


def stop_child(proc: subprocess.Popen[Any], timeout: float = 30) -> None:
    """Stop a child that runs until its stdin closes: close it, wait up to
    ``timeout`` seconds, then kill the child if it is still running."""
    with contextlib.suppress(Exception):
        assert proc.stdin is not None
        proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def env_overrides(env: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def import_torch(site: str) -> Any:
    """``torch``, borrowed from ``site`` when this interpreter has none."""
    try:
        import torch
    except ImportError:
        sys.path.append(site)
        import torch
    return torch


def new_store(rpc: str, meta: str, segment: int, local_buffer: int) -> Any:
    """A ``MooncakeDistributedStore`` (of whichever ``mooncake`` this interpreter
    imports) set up over TCP on 127.0.0.1; raises ``RuntimeError`` when setup fails."""
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", meta, segment, local_buffer, "tcp", "", rpc)
    if rc != 0:
        raise RuntimeError(f"setup returned {rc}")
    return s


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``repeats`` timed calls of ``fn``."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ------------------------------------------------------------------ finding the masters


def find_ours_master() -> str | None:
    env = os.environ.get("MOONCAKE_MASTER_BIN_OURS")
    if env:
        return env
    sib = Path(sys.executable).parent / "mooncake_master"
    if sib.exists():
        return str(sib)
    return shutil.which("mooncake_master")


def upstream_env() -> dict[str, str]:
    """This process's environment for the upstream wheel's interpreter: without
    ``PYTHONPATH``, which may select one of our builds and would shadow the wheel."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def find_upstream_master(python: Path) -> str | None:
    code = (
        "import os, mooncake\n"
        "for b in mooncake.__path__:\n"
        "    p = os.path.join(b, 'mooncake_master')\n"
        "    if os.path.exists(p): print(p); break\n"
    )
    try:
        out = subprocess.run(
            [str(python), "-c", code],
            capture_output=True, text=True, timeout=60, check=False, env=upstream_env(),
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out or None


# ------------------------------------------------------------------ options


def add_only(ap: argparse.ArgumentParser) -> None:
    """``--only ours|upstream``: run one side."""
    ap.add_argument("--only", choices=["ours", "upstream"])


def add_json(ap: argparse.ArgumentParser, help_text: str | None = None) -> None:
    """``--json OUT``: where ``write_json`` puts the figures."""
    ap.add_argument("--json", metavar="OUT", help=help_text)


def add_upstream_python(ap: argparse.ArgumentParser) -> None:
    """``--upstream-python``: the interpreter of the venv with the upstream wheel."""
    ap.add_argument("--upstream-python", default=str(UPSTREAM_VENV / "bin" / "python"))


def comparison_parser(
    doc: str | None,
    quick: str | bool = False,
    json_help: str | None = None,
    side_options: tuple[str, ...] = (),
    switch: str | None = None,
) -> argparse.ArgumentParser:
    """A parser with the options every ours-vs-upstream comparison takes: ``--quick``
    when ``quick`` is set (a string is its help), ``--only``, ``--json`` (help
    ``json_help``), ``--upstream-python``, and the hidden options of its internal
    modes (``add_side_args`` with ``side_options`` and ``switch``). Its description
    is the first paragraph of ``doc`` (the script's docstring)."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    if quick:
        help_text = quick if isinstance(quick, str) else None
        ap.add_argument("--quick", action="store_true", help=help_text)
    add_only(ap)
    add_json(ap, json_help)
    add_upstream_python(ap)
    add_side_args(ap, *side_options, switch=switch)
    return ap


def add_rounds(ap: argparse.ArgumentParser, default: int) -> None:
    """``--rounds N``: run the sides N times, alternating which goes first; each
    row is the median over the rounds."""
    ap.add_argument(
        "--rounds",
        type=int,
        default=default,
        help=f"rounds with the sides alternating which runs first (default {default}); "
        "median per row",
    )


def alternating(names: Sequence[str], rounds: int) -> Iterator[tuple[int, str]]:
    """``(round, name)`` for ``rounds`` rounds over ``names``, the order
    reversed in every second round: the side that runs first takes whatever
    state the machine was left in, so each side gets both positions."""
    for r in range(rounds):
        for name in names if r % 2 == 0 else list(reversed(names)):
            yield r, name


def run_rounds(
    names: Sequence[str], rounds: int, run: Callable[[str], Any], loads: list[str]
) -> tuple[dict[str, list[Any]], dict[str, str]]:
    """``run(name)`` for each side, ``rounds`` times in :func:`alternating`
    order, noting the machine's load while each ran in ``loads``. Returns each
    side's results, one per round it succeeded in, and the last reason each
    side failed (a ``run`` that returns a string failed)."""
    runs: dict[str, list[Any]] = {name: [] for name in names}
    failures: dict[str, str] = {}
    for rnd, name in alternating(names, rounds):
        load = MachineLoad()
        got = run(name)
        loads.append(f"# machine while {name} ran (round {rnd + 1}): {load.summary()}")
        if isinstance(got, str):
            failures[name] = got
        else:
            runs[name].append(got)
    return runs, failures


def add_side_args(ap: argparse.ArgumentParser, *options: str, switch: str | None = None) -> None:
    """The hidden options of a script's internal modes: ``--side`` and ``--master-bin``
    (what ``side_rows`` passes), then ``options`` (each takes a value) and ``switch``
    (an on/off flag)."""
    for opt in ("--side", "--master-bin", *options):
        ap.add_argument(opt, help=argparse.SUPPRESS)
    if switch:
        ap.add_argument(switch, action="store_true", help=argparse.SUPPRESS)


# ------------------------------------------------------------------ running the sides


Sides = dict[str, tuple[str, str | None]]


def find_sides(only: str | None, upstream_python: str, extra: Sides | None = None) -> Sides:
    """(python, master or None) per side: ours, then ``extra``, then upstream; ``only``
    keeps one of ours and upstream."""
    sides: Sides = {}
    if only in (None, "ours"):
        sides["ours"] = (sys.executable, find_ours_master())
    sides.update(extra or {})
    if only in (None, "upstream"):
        up = Path(upstream_python)
        sides["upstream"] = (str(up), find_upstream_master(up) if up.exists() else None)
    return sides


def side_rows(
    script: Path,
    name: str,
    python: str,
    master: str,
    extra: list[str],
    timeout: float,
    env: dict[str, str] | None = None,
) -> Any:
    """Run ``script --side name --master-bin master *extra`` under ``python``; its rows
    (the last ``{"rows": ...}`` line of its stdout), or why there are none."""
    print(f"== {name}: {python} (master {master})", file=sys.stderr, flush=True)
    cmd = [python, str(script), "--side", name, "--master-bin", master, *extra]
    if name == "upstream" and env is None:
        env = upstream_env()
    try:
        r = subprocess.run(
            cmd, stdout=subprocess.PIPE, text=True, env=env, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return "timed out"
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith('{"rows"')]
    if r.returncode != 0 or not lines:
        return f"failed (exit {r.returncode})"
    return json.loads(lines[-1])["rows"]


class MachineLoad:
    """What else the machine did while a side ran: the hypervisor's steal time
    (``/proc/stat``) and CPU pressure (``/proc/pressure/cpu``, the share of
    time some runnable task waited for a core). Printed under the table, so a
    figure taken while the machine was busy or the host took the vCPUs shows."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.cpu0 = self._cpu()
        self.psi0 = self._psi()

    @staticmethod
    def _cpu() -> list[int]:
        try:
            with open("/proc/stat") as f:
                return [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return []

    @staticmethod
    def _psi() -> int | None:
        try:
            with open("/proc/pressure/cpu") as f:
                some = f.readline().split()
            return int(some[-1].split("=")[1])
        except (OSError, ValueError, IndexError):
            return None

    def summary(self) -> str:
        cpu1, psi1 = self._cpu(), self._psi()
        parts = []
        if self.cpu0 and cpu1:
            d = [b - a for a, b in zip(self.cpu0, cpu1, strict=True)]
            total = sum(d) or 1
            parts.append(f"busy {100 * (total - d[3] - d[4]) / total:.0f}%")
            parts.append(f"steal {100 * d[7] / total:.1f}%")
        if self.psi0 is not None and psi1 is not None:
            wall_us = (time.monotonic() - self.t0) * 1e6 or 1
            parts.append(f"cpu pressure {100 * (psi1 - self.psi0) / wall_us:.0f}%")
        return ", ".join(parts) or "not available"


def run_noted(name: str, run: Callable[[], Any], res: dict[str, Any], loads: list[str]) -> None:
    """``res[name] = run()``, noting the machine's load while it ran in ``loads``."""
    load = MachineLoad()
    res[name] = run()
    loads.append(f"# machine while {name} ran: {load.summary()}")


def run_sides(
    sides: Sides, run: Callable[[str, str, str], Any], res: dict[str, Any], loads: list[str]
) -> None:
    """Run each side that has a master (``run(name, python, master)``) into ``res``,
    noting the machine's load while it ran in ``loads``."""
    for name, (python, master) in sides.items():
        if master is None:
            res[name] = "master not found"
            continue
        run_noted(name, lambda: run(name, python, master), res, loads)  # noqa: B023 - called at once


# ------------------------------------------------------------------ output


def rows_by_key(results: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Every side's rows keyed by (scenario, op, size), in the order first seen:
    key -> {side: row}. A side without rows (a string saying why) adds nothing."""
    table: dict[tuple[str, str, str], dict[str, Any]] = {}
    for side, rows in results.items():
        if isinstance(rows, str):
            continue
        for r in rows:
            table.setdefault((r["scenario"], r["op"], r["size"]), {})[side] = r
    return table


def print_failures(results: dict[str, Any]) -> None:
    """One ``# side: why`` line for each side that has no rows."""
    for side, rows in results.items():
        if isinstance(rows, str):
            print(f"# {side}: {rows}")


def print_header(hdr: str) -> None:
    """A table's header line, underlined."""
    print(hdr)
    print("-" * len(hdr))


def print_table_head(results: dict[str, Any], hdr: str) -> None:
    """The ``# side: why`` lines of the sides without rows, then the header ``hdr``."""
    print_failures(results)
    print_header(hdr)


def print_footer(t0: float, quick: bool = False, loads: list[str] | None = None) -> None:
    """Under a table: the machine-load notes, then the run's total time since ``t0``."""
    for line in loads or []:
        print(line)
    print(f"# total {time.monotonic() - t0:.0f}s{' (quick)' if quick else ''}")


def write_json(path: str | None, obj: Any) -> None:
    """Write ``obj`` to ``path`` (the ``--json`` option), when one was given."""
    if path:
        Path(path).write_text(json.dumps(obj, indent=1))
