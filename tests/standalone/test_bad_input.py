"""Bad input to the standalone service: each case gets a clear log line and
an upstream code, and loses nothing (the daemon keeps serving, its objects
stay readable). The daemon-side cases (two daemons on one port, a dead
master) are in test_daemon_cli.py; a dummy calling its restarted daemon is
in test_faults.py."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, Dummies, MiB, free_port
from mooncake.store import MooncakeDistributedStore, MooncakeHostMemAllocator

K = Callable[[str], str]


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="mooncake.store")
    return caplog


def messages(log: pytest.LogCaptureFixture, method: str) -> list[str]:
    return [r.getMessage() for r in log.records if r.getMessage().startswith(method)]


@pytest.fixture
def witness(daemon: Daemon, dummies: Dummies, key: K) -> Callable[[], None]:
    """A key written before the bad input; ``check()`` proves it survived."""
    s = dummies(daemon)
    k = key("witness")
    assert s.put(k, b"w" * 5000) == 0

    def check() -> None:
        assert daemon.alive()
        assert s.get(k) == b"w" * 5000

    return check


def test_a_port_nobody_serves(log: Any, witness: Callable[[], None]) -> None:
    s = MooncakeDistributedStore()
    port = free_port()
    assert s.setup_dummy(16 * MiB, 4 * MiB, f"127.0.0.1:{port}") == -1
    (line,) = messages(log, "setup_dummy")
    assert f"no mooncake_client daemon answers for 127.0.0.1:{port}" in line
    # Not set up: calls fail with the not-set-up code, nothing crashes.
    assert s.put("k", b"v") == -600
    assert s.health_check() == 1
    witness()


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:http", ""])
def test_an_address_without_a_port(log: Any, address: str) -> None:
    s = MooncakeDistributedStore()
    assert s.setup_dummy(16 * MiB, 4 * MiB, address) == -1
    (line,) = messages(log, "setup_dummy")
    assert "port" in line


def test_a_daemon_of_another_cluster(
    shared_master: Any,
    daemon_factory: Callable[..., Daemon],
    log: Any,
    witness: Callable[[], None],
) -> None:
    other = daemon_factory(shared_master, env={"MC_STORE_CLUSTER_ID": "elsewhere"})
    s = MooncakeDistributedStore()
    assert s.setup_dummy(16 * MiB, 4 * MiB, other.address) == -1
    (line,) = messages(log, "setup_dummy")
    assert 'serves cluster "elsewhere"' in line and "MC_STORE_CLUSTER_ID" in line
    assert "refused a dummy client" in other.log_text()
    # With the matching cluster id it attaches.
    os.environ["MC_STORE_CLUSTER_ID"] = "elsewhere"
    try:
        assert s.setup_dummy(16 * MiB, 4 * MiB, other.address) == 0
    finally:
        del os.environ["MC_STORE_CLUSTER_ID"]
    s.close()
    witness()


def test_a_daemon_with_another_cluster_token(
    master_factory: Any,
    daemon_factory: Callable[..., Daemon],
    tmp_path: Path,
    log: Any,
) -> None:
    token = tmp_path / "token"
    token.write_text("a-cluster-secret-of-some-length\n")
    m = master_factory(auth_token_file=str(token))
    d = daemon_factory(m, env={"MC_AUTH_TOKEN_FILE": str(token)})
    s = MooncakeDistributedStore()
    assert s.setup_dummy(16 * MiB, 4 * MiB, d.address) == -1
    (line,) = messages(log, "setup_dummy")
    assert "requires the cluster token" in line
    assert d.alive()


def test_a_pool_larger_than_the_daemon_grants(
    daemon: Daemon, log: Any, witness: Callable[[], None]
) -> None:
    s = MooncakeDistributedStore()
    # More than this host's memory: the daemon's default grant.
    assert s.setup_dummy(1 << 50, 16 * MiB, daemon.address) == -1
    (line,) = messages(log, "setup_dummy")
    assert "this daemon grants at most" in line and "mem_pool_size" in line
    assert "refused a dummy client" in daemon.log_text()
    witness()


def test_the_grant_can_be_set(
    shared_master: Any, daemon_factory: Callable[..., Daemon], log: Any
) -> None:
    d = daemon_factory(shared_master, env={"MC_STANDALONE_MAX_DUMMY_MEMORY": "64MB"})
    s = MooncakeDistributedStore()
    assert s.setup_dummy(60 * MiB, 8 * MiB, d.address) == -1
    assert "grants at most 67108864 bytes" in messages(log, "setup_dummy")[0]
    assert s.setup_dummy(48 * MiB, 8 * MiB, d.address) == 0
    s.close()


def test_garbage_on_the_daemon_socket(daemon: Daemon, witness: Callable[[], None]) -> None:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(f"\0mooncake-rs-client-{daemon.port}")
    c.sendall(b"\xff" * 64)
    c.close()
    witness()


def test_registering_memory_a_daemon_cannot_map(
    daemon: Daemon, dummies: Dummies, log: Any, witness: Callable[[], None]
) -> None:
    import numpy as np

    s = dummies(daemon)
    arr = np.zeros(4096, np.uint8)
    assert s.register_buffer(arr.ctypes.data, arr.nbytes) == -1
    (line,) = messages(log, "register_buffer")
    assert "MooncakeHostMemAllocator" in line
    witness()


def test_mem_pool_and_allocator_misuse(daemon: Daemon, dummies: Dummies, log: Any) -> None:
    plain = MooncakeDistributedStore()
    assert plain.alloc_from_mem_pool(4096) == 0  # not a dummy client
    assert "setup_dummy" in messages(log, "alloc_from_mem_pool")[0]
    s = dummies(daemon, mem_pool_size=MiB)
    a = s.alloc_from_mem_pool(4096)
    b = s.alloc_from_mem_pool(4096)
    assert a != 0 and b != 0 and a != b
    assert s.register_buffer(a, 4096) == 0
    # Larger than the pool: a region of its own, still shared memory.
    c = s.alloc_from_mem_pool(2 * MiB)
    assert c != 0 and s.register_buffer(c, 2 * MiB) == 0
    alloc = MooncakeHostMemAllocator()
    assert alloc.alloc(0) == 0
    assert alloc.free(12345) == -1
