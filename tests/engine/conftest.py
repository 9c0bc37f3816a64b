"""Fixtures for the transfer-engine suite: real peer processes
(``engine_peer.py``) and a real ``mooncake_master`` for the HTTP metadata
server (the suite-wide fixtures of ``tests/conftest.py``).

``meta`` runs a test over both ways of finding peers: ``P2PHANDSHAKE`` and
the master's HTTP metadata server. ``path`` runs it between processes of this
host (cross-process copies) and with TCP forced (``MC_FORCE_TCP`` in both
processes).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.fixtures import default_timeouts, started_by

HERE = Path(__file__).resolve().parent
PEER = HERE / "engine_peer.py"
_names = itertools.count(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    default_timeouts(items, config, 120)


class Peer:
    """An engine in a child process (see engine_peer.py)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        full = dict(os.environ)
        full.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=full,
            text=True,
        )
        self.name = ""
        self.port = 0

    def call_op(self, **req: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"peer exited (rc={self.proc.poll()}) during {req['op']}"
        return json.loads(line)  # type: ignore[no-any-return]

    def init(
        self, meta: str, host: str = "127.0.0.1", protocol: str = "tcp", name: str = ""
    ) -> str:
        r = self.call_op(op="init", host=name or host, meta=meta, protocol=protocol, name=name)
        assert r["rc"] == 0, r
        self.name, self.port = r["name"], r["port"]
        return self.name

    def array(self, size: int, register: bool = True) -> int:
        r = self.call_op(op="array", size=size, register=register)
        if register:
            assert r["rc"] == 0, r
        return int(r["addr"])

    def managed(self, size: int) -> int:
        return int(self.call_op(op="managed", size=size)["addr"])

    def fill(self, addr: int, data: bytes) -> None:
        self.call_op(op="fill", addr=addr, hex=data.hex())

    def read(self, addr: int, n: int) -> bytes:
        return bytes.fromhex(self.call_op(op="read", addr=addr, len=n)["hex"])

    def call(self, method: str, *args: Any) -> Any:
        return self.call_op(op="call", method=method, args=list(args))["result"]

    def notifies(self) -> list[list[str]]:
        return self.call_op(op="notifies")["notifies"]  # type: ignore[no-any-return]

    def logs(self) -> list[str]:
        return self.call_op(op="logs")["logs"]  # type: ignore[no-any-return]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


@pytest.fixture
def peers() -> Iterator[Callable[..., Peer]]:
    """``peers(env=None)`` starts a peer process; all are killed at teardown."""
    yield from started_by(Peer, Peer.kill)


@pytest.fixture
def engine_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """``caplog`` capturing the ``mooncake.engine`` logger from INFO up."""
    caplog.set_level(logging.INFO, logger="mooncake.engine")
    return caplog


def engine_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "mooncake.engine"]


def unique_name() -> str:
    """A segment name for engines published to a metadata server."""
    return f"127.0.0.1:{20000 + os.getpid() % 10000 + 97 * next(_names)}"


@pytest.fixture(params=["p2p", "http"])
def meta(request: pytest.FixtureRequest) -> str:
    """The metadata server string: P2PHANDSHAKE or the master's HTTP server."""
    if request.param == "p2p":
        return "P2PHANDSHAKE"
    m = request.getfixturevalue("shared_master")
    return str(m.metadata_url)


@pytest.fixture(params=["same-host", "tcp"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of both sides: nothing, or MC_FORCE_TCP=1."""
    if request.param == "tcp":
        monkeypatch.setenv("MC_FORCE_TCP", "1")
        return {"MC_FORCE_TCP": "1"}
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    return {}


def init_local(engine: Any, meta: str, host: str = "127.0.0.1", protocol: str = "tcp") -> str:
    """Initialize an engine of this process; returns its segment name."""
    if meta == "P2PHANDSHAKE":
        assert engine.initialize(host, meta, protocol, "") == 0
        return f"{host}:{engine.get_rpc_port()}"
    name = unique_name()
    assert engine.initialize(name, meta, protocol, "") == 0
    return name


def init_peer(peer: Peer, meta: str, protocol: str = "tcp") -> str:
    """Initialize a peer process's engine; returns its segment name."""
    if meta == "P2PHANDSHAKE":
        return peer.init(meta, protocol=protocol)
    return peer.init(meta, protocol=protocol, name=unique_name())
