"""Fixtures for the standalone-service suite: a real ``mooncake_client``
daemon (the console script next to ``sys.executable``, else on ``PATH``,
else ``$MOONCAKE_CLIENT_BIN``) on a free port, mounted on a real
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
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.bins import console_script
from helpers.fixtures import default_timeouts, started_by
from helpers.json_child import PipedJsonChild
from helpers.logged import LoggedProcess
from helpers.waits import free_port, wait_until

HERE = Path(__file__).resolve().parent
DUMMY_PROC = HERE / "dummy_proc.py"
MiB = 1 << 20


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    default_timeouts(items, config, 120)


def client_bin() -> str:
    return console_script("mooncake_client", "MOONCAKE_CLIENT_BIN")


READY = "serving dummy clients"


class Daemon(LoggedProcess):
    """A real ``mooncake_client`` process."""

    def __init__(
        self,
        master: Any,
        tmpdir: Path,
        port: int | None = None,
        segment: str = "256MB",
        env: dict[str, str] | None = None,
        extra: tuple[str, ...] = (),
        wait: bool = True,
    ) -> None:
        self.master = master
        self.port = port or free_port()
        self.env = dict(os.environ)
        self.env.update(env or {})
        self.argv = [
            client_bin(),
            "--host=127.0.0.1",
            f"--port={self.port}",
            f"--global_segment_size={segment}",
            f"--master_server_address={master.rpc_addr}",
            f"--metadata_server={master.metadata_url}",
            *extra,
        ]
        self.log_path = tmpdir / f"daemon-{self.port}-{time.monotonic_ns()}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start(wait)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> None:
        self.starts = getattr(self, "starts", 0) + 1
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
            )
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 20.0) -> None:
        want = self.starts
        ok = wait_until(
            lambda: (
                self.log_text().count(READY) >= want
                or (self.proc is not None and self.proc.poll() is not None)
            ),
            timeout,
        )
        assert ok and self.alive(), f"daemon did not come up:\n{self.log_text()[-3000:]}"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def terminate(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def restart(self) -> None:
        self.kill()
        deadline = time.monotonic() + 20
        while True:
            self.start(wait=False)
            ok = wait_until(
                lambda: self.log_text().count(READY) >= self.starts or not self.alive(), 20
            )
            if ok and self.alive():
                return
            assert time.monotonic() < deadline, self.log_text()[-3000:]
            time.sleep(0.2)


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
