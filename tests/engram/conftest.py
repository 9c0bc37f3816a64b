"""Fixtures for EngramStore tests: a real ``mooncake_master`` on free
loopback ports and store clients set up against it (no mocks).

Clients are real ``MooncakeDistributedStore`` instances.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Child scripts import this file with only tests/engram on their path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.master_proc import ephemeral_flags, read_ports

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A currently free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def master_command() -> list[str]:
    """How to start the master: the venv entry point when the extension
    provides it, else the cargo-built binary."""
    explicit = os.environ.get("MOONCAKE_MASTER_BIN")
    if explicit:
        return [explicit]
    from mooncake import _native

    exe = shutil.which("mooncake_master")
    if exe and hasattr(_native, "run_master"):
        return [exe]
    for profile in ("release", "debug"):
        p = ROOT / "target" / profile / "mooncake_master"
        if p.exists():
            return [str(p)]
    pytest.skip("no mooncake_master available")
    raise AssertionError("unreachable")


class Master:
    """A running master process on ports the kernel picked (see
    ``helpers.master_proc``)."""

    def __init__(self, lease_ms: int, extra: tuple[str, ...] = ()) -> None:
        cmd = master_command() + [
            *ephemeral_flags(),
            "--enable_http_metadata_server",
            f"--default_kv_lease_ttl={lease_ms}",
            *extra,
        ]
        fd, log = tempfile.mkstemp(prefix="engram-master-", suffix=".log")
        os.close(fd)
        self.log_path = Path(log)
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            ports = read_ports(self.log_path, self.proc, 20.0)
        except AssertionError as e:
            self.stop()
            raise RuntimeError(str(e)) from e
        self.rpc_port = ports["rpc_port"]
        self.http_port = ports["http_metadata_server_port"]
        self.metrics_port = ports["metrics_port"]

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def make_client(master_addr: str, segment: int = 64 << 20, **kw: Any) -> Any:
    """A ``MooncakeDistributedStore`` set up against ``master_addr`` (tcp,
    P2PHANDSHAKE metadata)."""
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup(
        kw.get("local_hostname", "127.0.0.1"),
        "P2PHANDSHAKE",
        segment,
        64 << 20,
        "tcp",
        "",
        master_addr,
    )
    assert rc == 0, rc
    return store


@pytest.fixture(scope="module")
def master() -> Iterator[Master]:
    m = Master(lease_ms=500)
    yield m
    m.stop()


@pytest.fixture(scope="module")
def master_default_lease() -> Iterator[Master]:
    m = Master(lease_ms=10_000)
    yield m
    m.stop()


@pytest.fixture(scope="module")
def master_tiny_lease() -> Iterator[Master]:
    """A master whose read lease (1 ms) expires during every lookup."""
    m = Master(lease_ms=1)
    yield m
    m.stop()


@pytest.fixture()
def client_factory(master: Master) -> Iterator[Callable[..., Any]]:
    made: list[Any] = []

    def factory(addr: str | None = None, segment: int = 64 << 20) -> Any:
        c = make_client(addr or master.addr, segment)
        made.append(c)
        return c

    yield factory
    for c in made:
        c.close()


@pytest.fixture()
def client(client_factory: Callable[..., Any]) -> Any:
    return client_factory()


def owner_process(master_addr: str, script: str, segment: int = 64 << 20) -> subprocess.Popen[str]:
    """Start a Python process that sets up its own client, runs ``script``
    (with ``client`` bound) and then waits for stdin to close."""
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from conftest import make_client\n"
        f"client = make_client({master_addr!r}, {segment})\n"
        f"{script}\n"
        "print('READY', flush=True)\n"
        "sys.stdin.read()\n"
        "client.close()\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.strip() == "READY", line
    return p
