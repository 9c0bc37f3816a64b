"""Fixtures for the standalone-service suite: a real ``mooncake_client``
daemon (``helpers/daemon.py``) on a free port, mounted on a real
``mooncake_master`` (``master_factory`` of ``tests/conftest.py``), and dummy
clients in this process (``setup_dummy``) or in child processes
(``dummy_proc.py``).

Every process started here is killed at teardown; every wait is bounded.
Tests share the module's daemon and take unique keys from ``key`` of
``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.daemon import READY, Daemon, client_bin  # noqa: F401  (re-exported for tests)
from helpers.fixtures import default_timeouts, started_by
from helpers.json_child import PipedJsonChild
from helpers.waits import free_port, wait_until  # noqa: F401  (re-exported for tests)

HERE = Path(__file__).resolve().parent
DUMMY_PROC = HERE / "dummy_proc.py"
MiB = 1 << 20


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    default_timeouts(items, config, 120)


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    yield from started_by(lambda master, **kw: Daemon(master, tmp_path, **kw), Daemon.kill)


@pytest.fixture(scope="module")
def daemon(shared_master: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon (256 MB segment) on the module's master, per test module."""
    d = Daemon(shared_master, tmp_path_factory.mktemp("standalone"))
    yield d
    d.kill()


class Dummies:
    """Dummy clients of this process, closed at teardown."""

    def __init__(self) -> None:
        self.stores: list[Any] = []

    def __call__(
        self, daemon: Daemon, mem_pool_size: int = 64 * MiB, local_buffer_size: int = 16 * MiB
    ) -> Any:
        from mooncake.store import MooncakeDistributedStore

        s = MooncakeDistributedStore()
        rc = s.setup_dummy(mem_pool_size, local_buffer_size, daemon.address)
        assert rc == 0, f"setup_dummy returned {rc}"
        self.stores.append(s)
        return s

    def close_all(self) -> None:
        for s in self.stores:
            with contextlib.suppress(Exception):
                s.close()


@pytest.fixture
def dummies() -> Iterator[Dummies]:
    d = Dummies()
    yield d
    d.close_all()


class DummyProc(PipedJsonChild):
    """A dummy client in a child process (dummy_proc.py), driven by JSON lines."""

    def __init__(self, address: str, env: dict[str, str] | None = None) -> None:
        super().__init__(
            [sys.executable, str(DUMMY_PROC), address], {**(env or {}), "PYTHONUNBUFFERED": "1"}
        )

    def call(self, **req: Any) -> Any:
        line = self._send(req)
        assert line, f"dummy process exited (rc={self.proc.poll()}) during {req}"
        out = json.loads(line)
        assert "error" not in out, out
        return out["result"]


@pytest.fixture
def dummy_procs() -> Iterator[Callable[..., DummyProc]]:
    yield from started_by(DummyProc, DummyProc.kill)
