"""Transfer paths and get_client_stats() (ours)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import Child, Master, StoreFactory, pattern
from helpers.ss import ss_sockets
from mooncake.store import ReplicateConfig

MiB = 1 << 20
SIZE = 32 * MiB
COUNTERS = {
    "bytes_read_local",
    "bytes_read_same_host",
    "bytes_read_tcp",
    "bytes_written_local",
    "bytes_written_same_host",
    "bytes_written_tcp",
    "master_rpcs",
    "same_host_mappings",
}


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in COUNTERS}


def _pair(
    m: Master, child_factory: Callable[..., Child], reader_env: dict[str, str]
) -> tuple[Child, Child]:
    owner = child_factory()
    reader = child_factory(reader_env)
    assert owner.setup(m) == 0
    assert reader.setup(m, global_segment_size=0) == 0
    return owner, reader


def _read_across(owner: Child, reader: Child, key: str, seed: int) -> dict[str, int]:
    """``owner`` writes ``pattern(SIZE, seed)`` at ``key`` and ``reader``
    reads every byte of it back; the changes of the reader's counters."""
    assert owner.call("put_pattern", key=key, size=SIZE, seed=seed) == 0
    before = reader.call("stats")
    assert reader.call("check_pattern", key=key, size=SIZE, seed=seed) == {
        "n": SIZE,
        "match": True,
    }
    return _delta(reader.call("stats"), before)


def _read_with_same_host(
    m: Master, child_factory: Callable[..., Child], mode: str, key: str, seed: int
) -> tuple[dict[str, int], Child]:
    """``_read_across`` a fresh pair whose reader runs with ``MC_STORE_SAME_HOST=mode``:
    the changes of the reader's counters, and the reader."""
    owner, reader = _pair(m, child_factory, {"MC_STORE_SAME_HOST": mode})
    return _read_across(owner, reader, key, seed), reader


@pytest.mark.ours
def test_stats_shape(store: Any) -> None:
    st = store.get_client_stats()
    assert isinstance(st, dict)
    assert set(st) >= COUNTERS
    assert all(isinstance(v, int) and v >= 0 for v in st.values())


@pytest.mark.ours
def test_same_host_read_is_mapped(master: Master, child_factory: Callable[..., Child]) -> None:
    d, reader = _read_with_same_host(master, child_factory, "auto", "sh", 3)
    assert d["bytes_read_same_host"] == SIZE
    assert d["bytes_read_tcp"] == 0
    assert d["bytes_read_local"] == 0
    assert d["master_rpcs"] >= 1
    assert reader.call("stats")["same_host_mappings"] >= 1


@pytest.mark.ours
def test_same_host_off_uses_tcp(master: Master, child_factory: Callable[..., Child]) -> None:
    d, reader = _read_with_same_host(master, child_factory, "off", "tcp", 4)
    assert d["bytes_read_tcp"] == SIZE
    assert d["bytes_read_same_host"] == 0
    assert reader.call("stats")["same_host_mappings"] == 0


@pytest.mark.ours
@pytest.mark.parametrize("mode,path", [("auto", "same_host"), ("off", "tcp")])
def test_cross_process_write_path(
    master: Master, child_factory: Callable[..., Child], mode: str, path: str
) -> None:
    owner, writer = _pair(master, child_factory, {"MC_STORE_SAME_HOST": mode})
    before = writer.call("stats")
    assert writer.call("put_pattern", key="w", size=4 * MiB, seed=5) == 0
    d = _delta(writer.call("stats"), before)
    assert d[f"bytes_written_{path}"] == 4 * MiB
    other = "tcp" if path == "same_host" else "same_host"
    assert d[f"bytes_written_{other}"] == 0
    assert owner.call("check_pattern", key="w", size=4 * MiB, seed=5)["match"]


@pytest.mark.ours
def test_in_process_own_segment_is_local(store: Any) -> None:
    data = pattern(3 * MiB, 6)
    cfg = ReplicateConfig()
    cfg.preferred_segment = store.get_hostname()
    before = store.get_client_stats()
    assert store.put("local-own", data, cfg) == 0
    mid = store.get_client_stats()
    dw = _delta(mid, before)
    assert dw["bytes_written_local"] == len(data)
    assert dw["bytes_written_tcp"] == 0 and dw["bytes_written_same_host"] == 0
    out = np.zeros(len(data), np.uint8)
    assert store.get_into("local-own", int(out.ctypes.data), len(data)) == len(data)
    assert out.tobytes() == data
    dr = _delta(store.get_client_stats(), mid)
    assert dr["bytes_read_local"] == len(data)
    assert dr["bytes_read_tcp"] == 0 and dr["bytes_read_same_host"] == 0


@pytest.mark.ours
def test_in_process_other_instance_is_local(store_factory: StoreFactory, master: Master) -> None:
    owner = store_factory(master)
    reader = store_factory(master, global_segment_size=0)
    data = pattern(2 * MiB, 7)
    assert owner.put("inproc", data) == 0
    before = reader.get_client_stats()
    assert reader.get("inproc") == data
    d = _delta(reader.get_client_stats(), before)
    assert d["bytes_read_local"] == len(data)
    assert d["bytes_read_tcp"] == 0 and d["bytes_read_same_host"] == 0


def test_mapping_dropped_after_owner_closes(
    master: Master, child_factory: Callable[..., Child]
) -> None:
    owner, reader = _pair(master, child_factory, {"MC_STORE_SAME_HOST": "auto"})
    assert owner.call("put_pattern", key="gone", size=MiB, seed=8) == 0
    assert reader.call("check_pattern", key="gone", size=MiB, seed=8)["match"]
    assert owner.call("close") == 0
    assert reader.call("check_pattern", key="gone", size=MiB, seed=8)["n"] < 0
    owner2 = child_factory()
    assert owner2.setup(master) == 0
    assert owner2.call("put_pattern", key="new", size=MiB, seed=9) == 0
    assert reader.call("check_pattern", key="new", size=MiB, seed=9)["match"]


def test_force_tcp_cross_process(master: Master, child_factory: Callable[..., Child]) -> None:
    owner, reader = _pair(master, child_factory, {"MC_FORCE_TCP": "1"})
    assert owner.call("put_pattern", key="ft", size=2 * MiB, seed=10) == 0
    assert reader.call("check_pattern", key="ft", size=2 * MiB, seed=10)["match"]


def _ss_sockets(pid: int, state: str) -> list[tuple[str, str, str]]:
    """(local, peer, congestion algorithm) of ``pid``'s TCP sockets in ``state``."""
    out = subprocess.run(
        ["ss", "-tinpH", "state", state], capture_output=True, text=True, check=True
    ).stdout
    return ss_sockets(out, pid)


def _data_sockets(owner: Child, reader: Child) -> tuple[list[str], list[str]]:
    """Congestion algorithms of the reader's connections to the owner's data
    server, and of the owner's ends of them."""
    ports = {loc.rsplit(":", 1)[1] for loc, _, _ in _ss_sockets(owner.pid, "listening")}
    assert ports, "the owner listens for data connections"
    client = [
        cc
        for _, peer, cc in _ss_sockets(reader.pid, "established")
        if peer.rsplit(":", 1)[1] in ports
    ]
    server = [
        cc for loc, _, cc in _ss_sockets(owner.pid, "established") if loc.rsplit(":", 1)[1] in ports
    ]
    return client, server


@pytest.mark.ours
@pytest.mark.parametrize("setting", ["auto", "system"])
def test_same_host_data_connections_use_reno(
    master: Master, child_factory: Callable[..., Child], setting: str
) -> None:
    # A loopback data connection has no link to pace for: with the default
    # MC_TCP_CONGESTION=auto both of its ends run reno, not the system's
    # (often pacing) algorithm; `system` leaves them as the kernel made them.
    env = {"MC_TCP_CONGESTION": setting}
    owner = child_factory(env)
    reader = child_factory({"MC_FORCE_TCP": "1", **env})
    assert owner.setup(master) == 0
    assert reader.setup(master, global_segment_size=0) == 0
    assert owner.call("put_pattern", key="cc", size=2 * MiB, seed=12) == 0
    assert reader.call("check_pattern", key="cc", size=2 * MiB, seed=12)["match"]
    client, server = _data_sockets(owner, reader)
    assert client and server, (client, server)
    want = "reno"
    if setting == "system":
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            want = f.read().strip()
    assert set(client) == {want}, client
    assert set(server) == {want}, server
