"""HA masters on one machine (loopback), for what needs no network
namespaces: leader discovery through ``etcd://`` given to ``setup``, to the
dict ``setup``, and through ``MOONCAKE_MASTER`` + ``MooncakeConfig``;
following the leader on failover; ``/health`` and ``/metrics`` of leader and
standbys. Needs the ``etcd`` binary (Debian ``etcd-server``); skips without it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until
from helpers.etcd import running_etcd
from helpers.ha import HaMaster
from helpers.ha import leader as find_leader
from helpers.waits import assert_reads_converge

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def etcd() -> Iterator[str]:
    with running_etcd() as addr:
        yield addr


@pytest.fixture
def trio(etcd: str, tmp_path: Path) -> Iterator[tuple[str, list[HaMaster]]]:
    cluster = f"loop-{os.getpid()}-{time.monotonic_ns()}"
    ms = [HaMaster(etcd, cluster, tmp_path) for _ in range(3)]
    try:
        yield cluster, ms
    finally:
        for m in ms:
            m.kill()


def _store() -> Any:
    from mooncake.store import MooncakeDistributedStore

    return MooncakeDistributedStore()


def _etcd_store(etcd: str, global_segment_size: int = 32 << 20) -> Any:
    """A store set up (P2P handshake, TCP) through the masters that ``etcd``
    lists for this process's cluster."""
    s = _store()
    rc = s.setup(
        "127.0.0.1", "P2PHANDSHAKE", global_segment_size, 16 << 20, "tcp", "", f"etcd://{etcd}"
    )
    assert rc == 0
    return s


@pytest.fixture
def joined(trio: tuple[str, list[HaMaster]], monkeypatch: pytest.MonkeyPatch) -> list[HaMaster]:
    """The trio's masters, with this process's clients in the trio's cluster."""
    cluster, ms = trio
    monkeypatch.setenv("MC_STORE_CLUSTER_ID", cluster)
    return ms


def test_health_and_metrics_of_leader_and_standbys(trio: tuple[str, list[HaMaster]]) -> None:
    cluster, ms = trio
    leader = find_leader(ms)
    addr = f"127.0.0.1:{leader.rpc}"
    for m in ms:
        h = m.health()
        assert h["cluster_id"] == cluster
        assert h["leader_address"] == addr, h
        if m is leader:
            assert (h["role"], h["ha_state"], h["service_ready"]) == ("leader", "serving", True)
            assert h["view_version"] > 0
            assert m.metric("master_ha_is_leader") == 1
            assert m.metric("master_ha_leader_elections_total") == 1
        else:
            assert (h["role"], h["ha_state"], h["service_ready"]) == ("standby", "standby", False)
            assert m.metric("master_ha_is_leader") == 0
    # A standby refuses client RPCs: a client pointed at it directly cannot set up.
    standby = next(m for m in ms if m is not leader)
    s = _store()
    rc = s.setup(
        "127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", f"127.0.0.1:{standby.rpc}"
    )
    assert rc != 0
    s.close()


def test_etcd_address_in_setup_dict_and_mooncake_config(
    trio: tuple[str, list[HaMaster]], etcd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mooncake.mooncake_config import MooncakeConfig

    cluster, ms = trio
    find_leader(ms)
    monkeypatch.setenv("MC_STORE_CLUSTER_ID", cluster)
    monkeypatch.setenv("MOONCAKE_MASTER", f"etcd://{etcd}")
    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "32MB")
    monkeypatch.setenv("MOONCAKE_LOCAL_BUFFER_SIZE", "16MB")
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH", raising=False)
    cfg = MooncakeConfig.load_from_env()
    assert cfg.master_server_address == f"etcd://{etcd}"
    a = _store()
    assert a.setup(*cfg.setup_args()) == 0
    b = _store()
    rc = b.setup(
        {
            "local_hostname": "127.0.0.1",
            "metadata_server": "P2PHANDSHAKE",
            "global_segment_size": "32MB",
            "master_server_addr": f"etcd://{etcd}",
        }
    )
    assert rc == 0
    try:
        assert a.put("via-env", b"e") == 0
        assert b.get("via-env") == b"e"
    finally:
        a.close()
        b.close()


def test_clients_follow_the_leader_across_two_failovers(joined: list[HaMaster], etcd: str) -> None:
    ms = joined
    first = find_leader(ms)
    s = _etcd_store(etcd)
    try:
        expect = {}
        for round_ in range(2):
            for i in range(20):
                k = f"r{round_}-{i}"
                assert s.put(k, f"value-{k}".encode()) == 0
                expect[k] = f"value-{k}".encode()
            leader = find_leader(ms)
            leader.kill()
            t0 = time.monotonic()
            after = f"after{round_}"
            assert wait_until(lambda after=after: s.put(after, b"x") == 0, 15.0, 0.05)
            print(f"failover {round_ + 1}: writes again after {time.monotonic() - t0:.2f}s")
            # Nothing acknowledged is lost, and every value is the right one.
            assert wait_until(lambda: all(s.get(k) == v for k, v in expect.items()), 10.0, 0.1)
        assert first.proc.poll() is not None
        last = find_leader([m for m in ms if m.proc.poll() is None])
        assert (last.metric("master_recovered_objects_total") or 0) >= len(expect)
    finally:
        s.close()


def test_upserts_over_held_reads_survive_a_failover_as_the_new_version(
    joined: list[HaMaster], etcd: str
) -> None:
    ms = joined
    find_leader(ms)
    s, r = _etcd_store(etcd), _etcd_store(etcd, 0)
    try:
        keys = [f"v{i}" for i in range(10)]
        for k in keys:
            assert s.put(k, f"old-{k}".encode() * 100) == 0
        assert r.batch_get_session_start(keys) == [0] * len(keys)
        new = {k: f"new-{k}".encode() * 120 for k in keys}
        for k, v in new.items():
            assert s.upsert(k, v) == 0
        find_leader(ms).kill()
        assert wait_until(lambda: s.put("after", b"x") == 0, 15.0, 0.05)
        assert_reads_converge(s.get, new, "failover")
    finally:
        r.close()
        s.close()
