"""Robustness across hosts: workload clients run random operations on a few
contended keys against three HA masters (m1..m3, etcd on ``ctl``) and four
holders (two on each of the hosts c1 and c2), while a network fault hits the
cluster; every recorded history is then checked by ``mooncake-lincheck``
(see helpers/lincheck.py).

The faults, each in its own run:
- ``leader-partition``: the leader's host is cut off from every other host
  for a few seconds, then healed. The clients follow the standby that takes
  over through etcd; the new leader learns the objects from their holders,
  so nothing acknowledged may be lost (checked without eviction).
- ``leader-etcd-cut``: the leader loses etcd only; clients still reach it.
  It must step down before another master serves, so no client sees two
  leaders' answers out of order (checked without eviction).
- ``holder-partition``: host c2, with its two holders and two of the
  workload clients, is cut off for longer than the client TTL, then healed.
  The master expires the holders and their objects, as an eviction would: a
  key may read as not found, but never as an older or a foreign value.
- ``holder-loss``: 10 % of the packets c2 sends are dropped (netem, or
  iptables where the kernel has no netem); nothing may be lost.
- ``leader-delay``: every packet the leader sends waits 20 ms (netem, or an
  NFQUEUE delayer); nothing may be lost.
- ``holder-reorder``: a quarter of the packets c2 sends, drawn at random,
  wait 10 ms while the rest pass at once, so they arrive out of order
  (netem's reorder, or the NFQUEUE delayer holding a share); nothing may
  be lost.

The holders keep disk tiers (SSD offload) in directories of their own on
one small tmpfs, and the masters write every committed object through to
its holder's tier (the objects stay in memory: the segments have room).

The long run keeps one cluster through a seeded sequence of every fault
kind above and seven more: the leader killed (SIGKILL, restarted as a
standby once another leads), a standby killed and restarted, the leader
paused (SIGSTOP, then SIGCONT), the leader's packets to one client host
dropped in one direction only (the holders there fall silent to the leader
past the client TTL: an eviction, like the holder partition), holder c2
(one of the two on host c2) paused past the client TTL (an eviction too),
a workload client killed (SIGKILL) in the middle of its calls and
replaced by another (a request it left open may take effect after it died;
nothing acknowledged may be lost), and the holders' disk filled (a filler
file takes every free page of the tmpfs while the fault lasts, so every
copy to disk fails with ENOSPC; the objects keep their memory copies and
nothing may be lost; the copies must fail meanwhile and succeed again
after the file is deleted). Each fault gets a segment of its own with
fresh keys, checked on its own. CI runs every kind once; a longer run
repeats the sequence until the time is up, and prints per kind the
segments, operations checked and longest unavailability:

    MC_ROBUSTNESS_MINUTES=30 MC_ROBUSTNESS_SEED=7 \
        pytest -s tests/cluster/test_robustness.py -k long_run
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import cluster_env, etcd_addr, trio_with_leader, wait_one_leader
from helpers.lincheck import (
    check_histories,
    lincheck_binary,
    longest_unavailability,
    pause,
    start_workload,
)
from helpers.tmpfs import disk_stats, full_for, tmpfs_or_skip
from helpers.waits import wait_until

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
# Every fault kind of the long run, and whether its history is checked with
# eviction (a holder the master expired took its keys with it).
LONG_KINDS = {
    "leader-partition": False,
    "leader-etcd-cut": False,
    "holder-partition": True,
    "holder-loss": False,
    "leader-delay": False,
    "holder-reorder": False,
    "leader-kill": False,
    "standby-kill": False,
    "leader-pause": False,
    # The leader's answers to c1 are lost: the holder there cannot open a
    # new connection to it (its SYN-ACKs are dropped), falls silent past the
    # TTL and is expired.
    "leader-one-way": True,
    "holder-pause": True,
    "client-kill": False,
    "disk-full": False,
}
# The tmpfs the holders' disk tiers share.
DISK_SIZE = 32 << 20
# Seals each disk tier's open bucket (and deletes buckets with nothing live
# left) every second instead of every 10 s.
OFFLOAD_ENV = {"MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": "1"}
LONG_MINUTES = float(os.environ.get("MC_ROBUSTNESS_MINUTES", "0"))
LONG_SEED = int(os.environ.get("MC_ROBUSTNESS_SEED", "7"))


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


@pytest.fixture
def holder_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of DISK_SIZE for the holders' disk tiers (every host sees
    it: the namespaces share the file systems), unmounted at the end."""
    with tmpfs_or_skip(tmp_path / "disk", DISK_SIZE, "robustness runs") as d:
        yield d


@pytest.fixture
def robust(
    holder_disk: Path,
    net: Any,
    etcd: Any,
    masters: Any,
    clients: Any,
    faults: Any,
    cluster_id: str,
    workloads: list[subprocess.Popen[bytes]],
    lincheck: str,
    tmp_path: Path,
) -> SimpleNamespace:
    """Three HA masters once one leads (writing through to disk tiers) and
    four holders, two on c1 and two on c2, set up on them, each with a disk
    tier on ``holder_disk``, with what a segment needs: the hosts, the
    faults, the workload list, the checker and a directory for the
    histories."""
    ms, _, _ = trio_with_leader(
        masters, etcd, cluster_id, client_ttl=CLIENT_TTL, enable_offload=True
    )
    env = cluster_env(cluster_id)
    addr = etcd_addr(etcd)
    names = ("c1", "c2", "c1b", "c2b")
    holders = {name: clients(name[:2], {**env, **OFFLOAD_ENV}) for name in names}
    for name, h in holders.items():
        tier = holder_disk / name
        tier.mkdir()
        assert h.setup(addr, ssd_offload_path=str(tier))["rc"] == 0
    return SimpleNamespace(
        ms=ms,
        holders=holders,
        disk=holder_disk,
        env=env,
        addr=addr,
        net=net,
        faults=faults,
        workloads=workloads,
        lincheck=lincheck,
        dir=tmp_path,
    )


def fill_disk(r: SimpleNamespace) -> None:
    """The disk-full fault: a filler file takes every free page of the
    holders' tmpfs for FAULT_FOR seconds (and those the tiers free
    meanwhile), then is deleted. Copies to disk must fail while it is there
    and succeed again once it is gone."""
    holders = r.holders.values()
    before = disk_stats(holders)
    during = full_for(r.disk, FAULT_FOR, lambda: disk_stats(holders))
    assert during["disk_failed_writes"] > before["disk_failed_writes"], (before, during)
    written = during["disk_bytes_written"]
    again = wait_until(lambda: disk_stats(holders)["disk_bytes_written"] > written, 20.0)
    assert again, "no copy reached the disk after the filler was deleted"


def inject(kind: str, r: SimpleNamespace, seed: int) -> None:
    """Apply fault ``kind`` to the cluster for ``FAULT_FOR`` seconds and
    undo it (a killed master is started again, as a standby); ``seed``
    draws the packets a reordering holds."""
    if kind == "disk-full":
        fill_disk(r)
        return
    faults, ms, holder = r.faults, r.ms, r.holders["c2"]
    leader = wait_one_leader(ms)
    others = [m for m in ms if m is not leader]
    if kind == "leader-partition":
        faults.partition(leader.host)
        wait_one_leader(others)
        time.sleep(FAULT_FOR)
        faults.heal(leader.host)
    elif kind == "leader-etcd-cut":
        faults.cut(leader.host, "ctl")
        wait_one_leader(others)
        time.sleep(FAULT_FOR)
        faults.clear(leader.host)
    elif kind == "holder-partition":
        faults.partition("c2")
        time.sleep(FAULT_FOR)
        faults.heal("c2")
    elif kind == "holder-loss":
        faults.loss("c2", 10.0)
        time.sleep(FAULT_FOR)
        faults.clear("c2")
    elif kind == "leader-delay":
        faults.delay(leader.host, 20)
        time.sleep(FAULT_FOR)
        faults.clear(leader.host)
    elif kind == "holder-reorder":
        # The hosts c2 talks to: they see the reordering as segments queued
        # out of order (a run that reordered nothing would prove nothing).
        peers = [h for h in faults.net.hosts if h != "c2"]
        before = sum(faults.net.tcp_ext(h, "TCPOFOQueue") for h in peers)
        faults.reorder("c2", 25, 10, seed)
        time.sleep(FAULT_FOR)
        faults.clear("c2")
        reordered = sum(faults.net.tcp_ext(h, "TCPOFOQueue") for h in peers) - before
        assert reordered > 0, "no segment from c2 arrived out of order"
        print(f"holder-reorder: {reordered} segments queued out of order")
    elif kind == "leader-kill":
        leader.kill()
        wait_one_leader(others)
        time.sleep(FAULT_FOR)
        leader.start()
    elif kind == "standby-kill":
        others[0].kill()
        time.sleep(FAULT_FOR)
        others[0].start()
    elif kind == "leader-pause":
        pause(leader.proc.pid, FAULT_FOR)
    elif kind == "leader-one-way":
        faults.one_way(leader.host, "c1")
        time.sleep(FAULT_FOR)
        faults.clear(leader.host)
    else:
        assert kind == "holder-pause", kind
        pause(holder.proc.pid, FAULT_FOR)


def run_segment(kind: str, seed: int, prefix: str, r: SimpleNamespace) -> tuple[int, float]:
    """One run of the workload on keys named ``prefix...`` for ``SECONDS``
    (client ``c``'s operations drawn with seed ``seed + c``),
    with fault ``kind`` injected ``FAULT_AT`` in; its history checked (with
    eviction where ``LONG_KINDS`` says so). Returns the operations checked
    and the longest unavailability (s)."""
    histories = []

    def start(client: int, host: str, seconds: float) -> subprocess.Popen[bytes]:
        path = r.dir / f"{prefix}h{client}.jsonl"
        histories.append(path)
        cfg = {
            "client": client,
            "master": r.addr,
            "metadata": "P2PHANDSHAKE",
            "keys": KEYS,
            "seconds": seconds,
            "seed": seed + client,
            "history": str(path),
            "segment": 0,
            "hostname": r.net.ip(host),
            "prefix": prefix,
            "tensors": client == 1,
        }
        p = start_workload(cfg, r.env, functools.partial(r.net.popen, host))
        r.workloads.append(p)
        return p

    procs = [start(i + 1, host, SECONDS) for i, host in enumerate(WORKLOAD_HOSTS)]
    started = time.monotonic()
    time.sleep(FAULT_AT)
    killed = None
    if kind == "client-kill":
        killed = procs[0]
        killed.kill()
        procs.append(start(len(WORKLOAD_HOSTS) + 1, WORKLOAD_HOSTS[0], SECONDS - FAULT_AT))
    else:
        inject(kind, r, seed)
    for p in procs:
        expected = -9 if p is killed else 0
        assert p.wait(timeout=SECONDS + 90) == expected, f"{prefix} ({kind})"
    assert time.monotonic() - started >= SECONDS
    merged = r.dir / f"{prefix}history.jsonl"
    # The byte keys, and the tensor keys of client 1.
    check_histories(r.lincheck, histories, merged, 2 * KEYS, LONG_KINDS[kind], STUCK_NS)
    return len(merged.read_text().splitlines()), longest_unavailability(merged)


@pytest.mark.parametrize(
    ("nemesis", "seed"),
    [
        ("leader-partition", 11),
        ("leader-etcd-cut", 12),
        ("holder-partition", 13),
        ("holder-loss", 14),
        ("leader-delay", 15),
        ("holder-reorder", 16),
    ],
)
def test_history_under_a_network_fault_is_linearizable(
    robust: SimpleNamespace, nemesis: str, seed: int
) -> None:
    ops, gap = run_segment(nemesis, seed * 100, "", robust)
    print(f"{nemesis} ({robust.faults.mechanism}): {ops} ops, longest unavailability {gap:.2f} s")


# The run ends with the cycle of faults under way at the deadline (about
# three minutes a cycle).
@pytest.mark.timeout(LONG_MINUTES * 60 + 900)
def test_long_run_through_every_fault_is_linearizable(robust: SimpleNamespace) -> None:
    rng = random.Random(LONG_SEED)
    deadline = time.monotonic() + LONG_MINUTES * 60
    stats: dict[str, dict[str, float]] = {}
    order: list[str] = []
    segment = 0
    while segment == 0 or segment % len(LONG_KINDS) or time.monotonic() < deadline:
        if segment % len(LONG_KINDS) == 0:
            order = list(LONG_KINDS)
            rng.shuffle(order)
        kind = order[segment % len(LONG_KINDS)]
        ops, gap = run_segment(kind, LONG_SEED * 10**6 + segment * 10, f"s{segment}-", robust)
        st = stats.setdefault(kind, {"segments": 0, "ops": 0, "gap": 0.0})
        st["segments"] += 1
        st["ops"] += ops
        st["gap"] = max(st["gap"], gap)
        segment += 1
    print(f"\nlong run: seed {LONG_SEED}, {segment} segments")
    print(f"{'fault':<18} {'segments':>8} {'ops':>8} {'anomalies':>9} {'longest gap s':>13}")
    for kind, st in sorted(stats.items()):
        print(f"{kind:<18} {st['segments']:>8.0f} {st['ops']:>8.0f} {0:>9} {st['gap']:>13.2f}")
    assert set(stats) == set(LONG_KINDS)
