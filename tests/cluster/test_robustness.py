"""Robustness across hosts: workload clients run random operations on a few
contended keys against three HA masters (m1..m3, etcd on ``ctl``) and two
holders (c1, c2), while a network fault hits the cluster; every recorded
history is then checked by ``mooncake-lincheck`` (see helpers/lincheck.py).

The faults, each in its own run:
- ``leader-partition``: the leader's host is cut off from every other host
  for a few seconds, then healed. The clients follow the standby that takes
  over through etcd; the new leader learns the objects from their holders,
  so nothing acknowledged may be lost (checked without eviction).
- ``leader-etcd-cut``: the leader loses etcd only; clients still reach it.
  It must step down before another master serves, so no client sees two
  leaders' answers out of order (checked without eviction).
- ``holder-partition``: holder c2's host, with two of the workload clients,
  is cut off for longer than the client TTL, then healed. The master
  expires the holder and its objects, as an eviction would: a key may read
  as not found, but never as an older or a foreign value.
- ``holder-loss``: 10 % of the packets c2 sends are dropped (netem, or
  iptables where the kernel has no netem); nothing may be lost.
- ``leader-delay``: every packet the leader sends waits 20 ms (netem, or an
  NFQUEUE delayer); nothing may be lost.
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import cluster_env, etcd_addr, trio_with_leader, wait_one_leader
from helpers.lincheck import (
    check_histories,
    lincheck_binary,
    longest_unavailability,
    start_workload,
)

CLIENT_TTL = 2
SECONDS = 10.0
KEYS = 4
# Faults start this far into the run, and last this long.
FAULT_AT = SECONDS / 4
FAULT_FOR = CLIENT_TTL + 2.0
# An operation open longer than this is stuck (a call across a failover or
# a partition returns, success or error, well within it).
STUCK_NS = 15 * 10**9
WORKLOAD_HOSTS = ("c1", "c2", "c1", "c2")


@pytest.fixture(scope="module")
def lincheck() -> str:
    return lincheck_binary()


@pytest.fixture
def workloads() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


@pytest.mark.parametrize(
    ("nemesis", "seed"),
    [
        ("leader-partition", 11),
        ("leader-etcd-cut", 12),
        ("holder-partition", 13),
        ("holder-loss", 14),
        ("leader-delay", 15),
    ],
)
def test_history_under_a_network_fault_is_linearizable(
    net: Any,
    etcd: Any,
    masters: Any,
    clients: Any,
    faults: Any,
    cluster_id: str,
    workloads: list[subprocess.Popen[bytes]],
    lincheck: str,
    tmp_path: Path,
    nemesis: str,
    seed: int,
) -> None:
    _, leader, others = trio_with_leader(masters, etcd, cluster_id, client_ttl=CLIENT_TTL)
    env = cluster_env(cluster_id)
    addr = etcd_addr(etcd)
    for host in ("c1", "c2"):
        assert clients(host, env).setup(addr)["rc"] == 0
    histories = [tmp_path / f"h{i}.jsonl" for i in range(len(WORKLOAD_HOSTS))]
    for i, (host, path) in enumerate(zip(WORKLOAD_HOSTS, histories, strict=True)):
        cfg = {
            "client": i + 1,
            "master": addr,
            "metadata": "P2PHANDSHAKE",
            "keys": KEYS,
            "seconds": SECONDS,
            "seed": seed * 100 + i,
            "history": str(path),
            "segment": 0,
            "hostname": net.ip(host),
        }
        workloads.append(start_workload(cfg, env, functools.partial(net.popen, host)))
    started = time.monotonic()
    time.sleep(FAULT_AT)
    if nemesis == "leader-partition":
        faults.partition(leader.host)
        wait_one_leader(others)
        time.sleep(FAULT_FOR)
        faults.heal(leader.host)
    elif nemesis == "leader-etcd-cut":
        faults.cut(leader.host, "ctl")
        wait_one_leader(others)
        time.sleep(FAULT_FOR)
        faults.clear(leader.host)
    elif nemesis == "holder-partition":
        faults.partition("c2")
        time.sleep(FAULT_FOR)
        faults.heal("c2")
    elif nemesis == "holder-loss":
        faults.loss("c2", 10.0)
        time.sleep(FAULT_FOR)
        faults.clear("c2")
    else:
        faults.delay(leader.host, 20)
        time.sleep(FAULT_FOR)
        faults.clear(leader.host)
    for p in workloads:
        assert p.wait(timeout=SECONDS + 90) == 0
    assert time.monotonic() - started >= SECONDS
    report = check_histories(
        lincheck,
        histories,
        tmp_path / "history.jsonl",
        KEYS,
        eviction=nemesis == "holder-partition",
        stuck_ns=STUCK_NS,
    )
    gap = longest_unavailability(tmp_path / "history.jsonl")
    print(f"{nemesis} ({faults.mechanism}): longest unavailability {gap:.2f} s\n{report}")
