"""Fixtures for the console-script suite: each command runs as a real
process of this venv (``<venv>/bin/<name>``, as ``pip install`` put it on
``PATH``), on free ports, and is killed at teardown."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.waits import free_port  # noqa: F401  (re-exported for tests)

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# The commands upstream's wheel installs.
UPSTREAM_COMMANDS = (
    "mooncake_master",
    "mooncake_http_metadata_server",
    "mooncake_client",
    "mc_store_rest_server",
    "transfer_engine_bench",
    "transfer_engine_topology_dump",
)
# Upstream commands that this package does not provide yet, with the reason.
PENDING: dict[str, str] = {}


def declared_scripts() -> dict[str, str]:
    """``[project.scripts]`` of pyproject.toml: name -> ``module:function``."""
    text = (REPO / "pyproject.toml").read_text()
    section = re.search(r"^\[project\.scripts\]\n(.*?)(?=^\[|\Z)", text, re.MULTILINE | re.DOTALL)
    assert section, "pyproject.toml has no [project.scripts]"
    scripts = {}
    for line in section.group(1).splitlines():
        m = re.match(r'^\s*([A-Za-z0-9_]+)\s*=\s*"([^"]+)"', line)
        if m:
            scripts[m.group(1)] = m.group(2)
    return scripts


def command(name: str) -> str:
    """The installed console script ``name`` of this venv."""
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed in {BIN} (pip install . / maturin develop)")
    return str(path)


class Proc:
    """A command running in the background, its output in a log file."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen(
            argv,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        return self.p.wait(timeout=timeout)

    def signal(self, sig: int) -> None:
        if self.p.poll() is None:
            self.p.send_signal(sig)

    def stop(self) -> None:
        if self.p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.p.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.p.wait(timeout=10)
        self._out.close()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """``spawn(argv, env=None)``: start a process; all are killed at teardown."""
    procs: list[Proc] = []

    def start(argv: list[str], env: dict[str, str] | None = None) -> Proc:
        p = Proc(argv, tmp_path / f"proc-{len(procs)}.log", env)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


def run(argv: list[str], timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a command to completion, capturing its output."""
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout, **kw)


def wait_port(port: int, proc: Proc | None = None, timeout: float = 30.0) -> None:
    """Wait until ``127.0.0.1:port`` accepts connections (fail early when
    ``proc`` exits first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        if proc is not None and proc.p.poll() is not None:
            raise AssertionError(f"{proc.argv[0]} exited {proc.p.returncode}:\n{proc.text()}")
        time.sleep(0.05)
    raise AssertionError(f"port {port} did not open in {timeout}s")


def http(
    url: str, method: str = "GET", body: bytes | None = None, timeout: float = 10.0
) -> tuple[int, bytes, dict[str, str]]:
    """``(status, body, headers)`` of one request; HTTP errors are returned."""
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(), {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, e.read(), {k.lower(): v for k, v in e.headers.items()}


def raw_http(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` as is on a new connection and read until the server
    closes it (or ``timeout``)."""
    with socket.create_connection(("127.0.0.1", port), timeout) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        with contextlib.suppress(socket.timeout, ConnectionResetError):
            while chunk := s.recv(65536):
                out += chunk
        return out
