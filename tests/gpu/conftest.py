"""Fixtures of the CUDA suite: a ``mooncake_client`` daemon for dummy
clients, CUDA engine peers in child processes (``gpu_peer.py``), and the
suite-wide master and store fixtures of ``tests/conftest.py``.

Every test module but ``test_without_cuda.py`` is skipped at module level
when this machine has no usable CUDA (``cuda_env.SKIP_REASON``: "no CUDA
driver was found ..." on machines without a driver)."""

from __future__ import annotations

import json
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
from helpers.waits import free_port, wait_until

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
MiB = 1 << 20


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    default_timeouts(items, config, 120)


class Daemon:
    """A real ``mooncake_client`` daemon (dummy clients attach to it)."""

    def __init__(self, master: Any, tmpdir: Path, segment: str = "1GB") -> None:
        self.port = free_port()
        self.log_path = tmpdir / f"daemon-{self.port}.log"
        argv = [
            console_script("mooncake_client", "MOONCAKE_CLIENT_BIN"),
            "--host=127.0.0.1",
            f"--port={self.port}",
            f"--global_segment_size={segment}",
            f"--master_server_address={master.rpc_addr}",
            f"--metadata_server={master.metadata_url}",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        ok = wait_until(
            lambda: (
                "serving dummy clients" in self.log_path.read_text(errors="replace")
                or self.proc.poll() is not None
            ),
            20,
        )
        assert ok and self.proc.poll() is None, self.log_path.read_text()[-3000:]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def daemon(shared_master: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(shared_master, tmp_path_factory.mktemp("gpu-daemon"))
    yield d
    d.kill()


@pytest.fixture
def dummy(daemon: Daemon) -> Iterator[Any]:
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert s.setup_dummy(256 * MiB, 64 * MiB, daemon.address) == 0
    yield s
    s.close()


class GpuPeer(PipedJsonChild):
    """An engine with CUDA buffers in a child process (see gpu_peer.py)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        super().__init__([sys.executable, str(HERE / "gpu_peer.py")], env)

    def call(self, **req: Any) -> Any:
        deadline = time.monotonic() + 60
        line = self._send(req)
        assert line and time.monotonic() < deadline, "the GPU peer died"
        reply = json.loads(line)
        assert "error" not in reply, reply["error"]
        return reply


@pytest.fixture
def gpu_peer() -> Iterator[Callable[..., GpuPeer]]:
    yield from started_by(lambda **kw: GpuPeer(**kw), GpuPeer.kill)
