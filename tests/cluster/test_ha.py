"""HA masters on etcd across hosts: one leader among three
masters, clients that follow it through ``etcd://`` addresses, failover
without losing objects, no split brain when the leader loses etcd, and the
bad inputs (unreachable etcd, no master registered, duplicate addresses).

Each master runs on its own host (m1..m3), etcd on ``ctl``, clients on c1/c2.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest
from conftest import (
    ETCD_PORT,
    RPC_PORT,
    cluster_env,
    etcd_addr,
    ha_flags,
    leaders,
    master_bin,
    trio_with_leader,
    wait_one_leader,
    wait_until,
)

MiB = 1 << 20


@pytest.mark.slow
def test_three_masters_one_leader_and_failover_loses_nothing(
    net: Any, etcd: Any, masters: Any, clients: Any, cluster_id: str
) -> None:
    _, leader, others = trio_with_leader(masters, etcd, cluster_id)
    for m in others:
        h = m.health()
        assert h["role"] == "standby" and h["leader_address"] == leader.rpc_addr, h
    assert leader.health()["leader_address"] == leader.rpc_addr

    a, b = clients("c1", cluster_env(cluster_id)), clients("c2", cluster_env(cluster_id))
    assert a.setup(etcd_addr(etcd))["rc"] == 0
    assert b.setup(etcd_addr(etcd))["rc"] == 0
    seg_a, seg_b = a.call("hostname"), b.call("hostname")
    acked = {}
    for i in range(40):
        key = f"k{i}"
        r = a.call("put", key=key, size=65536, seed=i, preferred=[seg_a, seg_b][i % 2])
        assert r["rc"] == 0
        acked[key] = i

    a.call("workload_start", prefix="wa", size=4096)
    b.call("workload_start", prefix="wb", size=4096)
    time.sleep(1.0)
    killed_at = time.time()
    leader.kill()
    new = wait_one_leader(others, 15.0)
    assert new.health()["view_version"] > 0
    # Clients follow without help: their writes succeed on the new leader.
    assert wait_until(lambda: a.call("put", key="after-a", size=100, seed=1)["rc"] == 0, 10.0, 0.1)
    assert wait_until(lambda: b.call("put", key="after-b", size=100, seed=2)["rc"] == 0, 10.0, 0.1)
    recovered_in = time.time() - killed_at
    time.sleep(1.0)
    wa = a.call("workload_stop")
    wb = b.call("workload_stop")
    print(f"failover: writes succeed {recovered_in:.2f}s after the leader was killed")
    for w in (wa, wb):
        assert w["wrong"] == 0, w["by_rc"]
        assert w["max_call_s"] < 12.0, w["max_call_s"]
    # Nothing acknowledged is lost.
    assert a.call("check_many", size=65536, keys=acked) == {}
    assert b.call("check_many", size=4096, keys=wa["acked"]) == {}
    assert a.call("check_many", size=4096, keys=wb["acked"]) == {}
    assert (new.metric("master_recovered_objects_total") or 0) >= len(acked)
    assert (new.metric("master_ha_leader_elections_total") or 0) >= 1
    assert (new.metric("master_ha_is_leader") or 0) == 1


@pytest.mark.slow
def test_leader_cut_off_from_etcd_steps_down_before_a_new_leader_serves(
    net: Any, etcd: Any, masters: Any, clients: Any, faults: Any, cluster_id: str
) -> None:
    _, old, others = trio_with_leader(masters, etcd, cluster_id)
    # c1 talks to the old leader directly; c2 follows etcd.
    direct = clients("c1", cluster_env(cluster_id))
    follower = clients("c2", cluster_env(cluster_id))
    assert direct.setup(old.rpc_addr)["rc"] == 0
    assert follower.setup(etcd_addr(etcd))["rc"] == 0
    direct.call("workload_start", prefix="direct", size=1024)
    time.sleep(0.5)
    faults.cut(old.host, "ctl")  # the old leader loses etcd, nothing else
    new = wait_one_leader(others, 20.0)
    assert wait_until(lambda: follower.call("put", key="x", size=100, seed=1)["rc"] == 0, 15.0, 0.1)
    time.sleep(1.0)
    w = direct.call("workload_stop", with_calls=True)
    faults.clear(old.host)
    new_since = new.health()["serving_since_ms"] / 1000.0
    # Back in touch with etcd, the old leader sees the new one and is a standby.
    assert wait_until(lambda: old.health().get("role") == "standby", 15.0, 0.1), old.health()
    old_h = old.health()
    # No split brain: the old leader accepted its last write before the new
    # leader started serving, by its own records and by the client's.
    assert old_h["last_write_ms"] / 1000.0 < new_since, (old_h, new_since)
    ok_puts = [t0 + d for (t0, d, op, rc) in w["calls_list"] if op == "put" and rc == 0]
    assert ok_puts, w["by_rc"]
    assert max(ok_puts) < new_since + 0.05, (max(ok_puts), new_since)
    # After stepping down it refuses writes (UNAVAILABLE_IN_CURRENT_STATUS).
    assert direct.call("put", key="late", size=100, seed=1)["rc"] in (-1010, -900)
    assert w["wrong"] == 0


@pytest.mark.slow
def test_leader_host_cut_off_clients_fail_over_and_never_hang(
    net: Any, etcd: Any, masters: Any, clients: Any, faults: Any, cluster_id: str
) -> None:
    ms, old, others = trio_with_leader(masters, etcd, cluster_id)
    a, b = clients("c1", cluster_env(cluster_id)), clients("c2", cluster_env(cluster_id))
    assert a.setup(etcd_addr(etcd))["rc"] == 0
    assert b.setup(etcd_addr(etcd))["rc"] == 0
    a.call("workload_start", prefix="ca", size=4096)
    b.call("workload_start", prefix="cb", size=4096)
    time.sleep(0.5)
    faults.partition(old.host)
    wait_one_leader(others, 20.0)
    assert wait_until(lambda: a.call("put", key="p1", size=100, seed=1)["rc"] == 0, 15.0, 0.1)
    time.sleep(1.0)
    faults.heal(old.host)
    # The healed old leader rejoins as a standby; there is one leader.
    time.sleep(1.0)
    assert len(leaders(ms)) == 1
    wa, wb = a.call("workload_stop"), b.call("workload_stop")
    for w in (wa, wb):
        assert w["wrong"] == 0
        assert not w["alive"]
        assert w["max_call_s"] < 12.0, w["max_call_s"]
    assert b.call("check_many", size=4096, keys=wa["acked"]) == {}
    assert a.call("check_many", size=4096, keys=wb["acked"]) == {}


# ---------------------------------------------------------------- bad input


def test_master_with_unreachable_etcd_fails_within_5s(net: Any, cluster_id: str) -> None:
    t0 = time.monotonic()
    r = subprocess.run(
        net.wrap(
            "m1",
            [
                master_bin(),
                "--enable_ha=true",
                f"--ha_backend_connstring={net.ip('c2')}:{ETCD_PORT}",
                f"--rpc_address={net.ip('m1')}",
                f"--rpc_port={RPC_PORT + 7}",
                f"--metrics_port={RPC_PORT + 8}",
                f"--cluster_id={cluster_id}",
            ],
        ),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    assert "cannot reach etcd" in r.stderr, r.stderr
    assert took < 6.0, took


def _setup_fails_fast(c: Any, addr: str, why: str) -> None:
    """Client ``c``'s setup on ``addr`` fails (-1) within the connect timeout
    and logs ``why``."""
    r = c.setup(addr)
    assert r["rc"] == -1
    assert r["s"] < 7.0, r
    assert why in c.log_tail(1 << 20)


def test_client_with_unreachable_etcd_fails_within_the_connect_timeout(
    net: Any, clients: Any
) -> None:
    _setup_fails_fast(clients("c1"), f"etcd://{net.ip('c2')}:{ETCD_PORT}", "cannot reach etcd")


def test_client_with_no_master_registered(
    net: Any, etcd: Any, clients: Any, cluster_id: str
) -> None:
    _setup_fails_fast(
        clients("c1", cluster_env(cluster_id)), etcd_addr(etcd), "no master is registered"
    )


def test_two_masters_with_the_same_rpc_address(
    net: Any, etcd: Any, masters: Any, cluster_id: str
) -> None:
    first = masters("m1", **ha_flags(etcd, cluster_id))
    wait_one_leader([first])
    r = subprocess.run(
        net.wrap(
            "m1",
            [
                master_bin(),
                "--enable_ha=true",
                f"--ha_backend_connstring={etcd.endpoint}",
                f"--cluster_id={cluster_id}",
                f"--rpc_address={net.ip('m1')}",
                f"--rpc_port={RPC_PORT}",
                "--metrics_port=9100",
            ],
        ),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 1
    assert "another master is registered with rpc address" in r.stderr, r.stderr
    assert first.health()["role"] == "leader"
