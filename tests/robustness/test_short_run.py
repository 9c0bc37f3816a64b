"""A short robustness run: client processes run random operations on a few
contended keys (one of them the tensor calls too) against a real master
while one fault is injected: a holder of the data is killed (SIGKILL) and
replaced, a holder is paused (SIGSTOP) for longer than the client TTL and
resumed, the master is paused for longer than the client TTL and resumed,
a workload client is killed (SIGKILL) in the middle of its calls and
another takes its place, the standalone ``mooncake_client`` daemon that
some of the clients reach the store through (as dummy clients) is killed
(SIGKILL) and another is started at its address, or the disk the holders
offload to (a small tmpfs) is filled for a few seconds. The whole recorded
history is then checked by ``mooncake-lincheck`` for linearizability (a
lost holder's keys may read as not found, as after an eviction, but never
as an older or a foreign value, and so may keys whose memory copy eviction
dropped while their disk copy failed on the full disk; through a master
pause, a client kill, the kill of a daemon without a segment or a full disk
while memory has room nothing may be lost), torn reads and operations stuck
past the bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import Child, Master
from helpers.daemon import Daemon
from helpers.etcd import running_etcd
from helpers.ha import HaMaster, leader
from helpers.lincheck import (
    check_histories,
    lincheck_binary,
    longest_unavailability,
    pause,
    start_workload,
)
from helpers.tmpfs import disk_stats, full_for, tmpfs_or_skip
from helpers.waits import wait_until

CLIENTS = 3
KEYS = 4
SECONDS = 8.0
CLIENT_TTL = 2
# A pause outlasts the client TTL: the master expires the paused party's
# leases (or, paused itself, finds every client's heartbeat stale).
PAUSE = CLIENT_TTL + 1.0
STUCK_NS = 15 * 10**9
# The daemon-kill runs: clients 1 and 2 are the master's, 3 and 4 the
# daemon's dummies; 1 and 3 run the tensor calls too.
DUMMIES = (3, 4)
RPC_FAIL = -900
# What the workload records as the code of a read whose call reports none
# (`get` answering empty bytes, `get_tensor` None).
NO_CODE = -1
# How long the daemon stays dead before a new one is started.
DAEMON_DOWN = 1.0
# The disk-full runs: the tmpfs the holders' disk tiers share, and how long
# the filler keeps it full.
DISK_SIZE = 16 << 20
DISK_FULL_FOR = 3.0
# Seals each disk tier's open bucket (and deletes buckets with nothing live
# left) every second instead of every 10 s.
OFFLOAD_ENV = {"MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS": "1"}
# The holders' segments in the tight-memory disk-full run: less than the
# workload's live values (eight keys of up to 600 bytes, and the new
# versions being written), so eviction runs all the time.
TIGHT_SEGMENT = 2 << 10
# A fresh object written after the filler went, which must reach a disk
# tier (it fits a tight segment).
PROBE_SIZE = 1 << 10


@pytest.fixture(scope="module")
def lincheck() -> str:
    return lincheck_binary()


@pytest.fixture
def offload_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of DISK_SIZE for the holders' disk tiers, unmounted at the
    end (requested before the processes that write there, so they are gone
    by then)."""
    with tmpfs_or_skip(tmp_path / "disk", DISK_SIZE, "disk-full run") as d:
        yield d


@pytest.fixture
def workloads(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def workload(
    m: Master | str,
    client: int,
    history: Path,
    seed: int,
    env: dict[str, str] | None = None,
    seconds: float = SECONDS,
    dummy: str | None = None,
    tensors: bool | None = None,
) -> subprocess.Popen[bytes]:
    """A workload client of master ``m``, or (a string) of the HA masters
    that ``etcd://`` address lists, running for ``seconds``; with ``dummy``,
    a dummy client of the daemon at that address instead. It runs the
    tensor calls too when ``tensors`` says so (by default client 1 does)."""
    master, metadata = (m, "P2PHANDSHAKE") if isinstance(m, str) else (m.rpc_addr, m.metadata_url)
    cfg: dict[str, object] = {
        "client": client,
        "master": master,
        "metadata": metadata,
        "keys": KEYS,
        "seconds": seconds,
        "seed": seed,
        "history": str(history),
        "segment": 0,
        "tensors": client == 1 if tensors is None else tensors,
    }
    if dummy is not None:
        cfg["dummy"] = dummy
    return start_workload(cfg, env)


@pytest.mark.parametrize(
    ("nemesis", "seed"),
    [
        ("holder-kill", 1),
        ("holder-kill", 2),
        ("holder-pause", 3),
        ("master-pause", 4),
        ("client-kill", 5),
    ],
)
def test_history_under_a_fault_is_linearizable(
    master_factory: Callable[..., Master],
    child_factory: Callable[..., Child],
    workloads: list[subprocess.Popen[bytes]],
    lincheck: str,
    tmp_path: Path,
    nemesis: str,
    seed: int,
) -> None:
    m = master_factory(default_kv_lease_ttl=200, client_ttl=CLIENT_TTL)
    holders = [child_factory() for _ in range(2)]
    for h in holders:
        assert h.setup(m) == 0
    histories = [tmp_path / f"h{c}.jsonl" for c in range(CLIENTS)]
    for c, path in enumerate(histories):
        workloads.append(workload(m, c + 1, path, seed * 100 + c))
    started = time.monotonic()
    time.sleep(SECONDS / 3)
    killed = set()
    if nemesis == "client-kill":
        # In the middle of a call, as often as not: its pending line is then
        # the only record of a request that may still take effect.
        workloads[0].kill()
        killed.add(workloads[0].pid)
        replacement = tmp_path / "h10.jsonl"
        histories.append(replacement)
        workloads.append(workload(m, 11, replacement, seed * 100 + 10, seconds=SECONDS / 2))
    elif nemesis == "holder-kill":
        holders[0].kill()  # SIGKILL: its replicas are gone with it
        time.sleep(1.0)
        replacement = child_factory()
        assert replacement.setup(m) == 0
    elif nemesis == "holder-pause":
        pause(holders[0].pid, PAUSE)
    else:
        assert m.proc is not None
        pause(m.proc.pid, PAUSE)
    # A lost or expired holder takes its keys with it, as an eviction would;
    # a paused master loses nothing (its clients' TTLs restart when it
    # resumes), nor does a killed client (it holds no data), so those
    # histories are checked without eviction.
    eviction = nemesis in ("holder-kill", "holder-pause")
    check_run(workloads, histories, started, lincheck, tmp_path, eviction, killed)


@pytest.mark.parametrize(
    ("segment", "seed"),
    [("64MB", 6), ("0", 7)],
    ids=["daemon-kill", "segmentless-daemon-kill"],
)
def test_history_across_a_daemon_kill_is_linearizable(
    master_factory: Callable[..., Master],
    child_factory: Callable[..., Child],
    workloads: list[subprocess.Popen[bytes]],
    lincheck: str,
    tmp_path: Path,
    segment: str,
    seed: int,
) -> None:
    """Clients 1 and 2 are clients of the master; clients 3 and 4 are dummy
    clients (``setup_dummy``) of a ``mooncake_client`` daemon mounted on it,
    on the same keys. The daemon is killed (SIGKILL) in the middle of the
    run and, a second later, a new one is started at the same address.

    What a dummy sees: every call it makes while no daemon runs fails at
    once with RPC_FAIL (-900; ``get_tensor`` answers None), and so do its
    calls to the new daemon, which does not know it, until it calls
    ``setup_dummy`` again (the workload does once a daemon serves its
    address again); then its calls work again. A call the dummy had in
    flight at the kill fails with RPC_FAIL too, indeterminate: the daemon
    may have done it before it died; the calls after it are recorded as
    definite failures (they reached no daemon that knows the dummy, so
    none of them may take effect). No call waits for a dead daemon, so
    none comes near the stuck bound.

    A daemon with a segment takes the objects placed in it with it, as a
    killed holder does: that history is checked with eviction. A daemon
    without a segment holds no data: nothing acknowledged may be lost, and
    that history is checked without eviction.
    """
    m = master_factory(default_kv_lease_ttl=200, client_ttl=CLIENT_TTL)
    holders = [child_factory() for _ in range(2)]
    for h in holders:
        assert h.setup(m) == 0
    daemon = Daemon(m, tmp_path, segment=segment)
    try:
        histories = [tmp_path / f"h{c}.jsonl" for c in range(1, 5)]
        for c, path in enumerate(histories, 1):
            dummy = daemon.address if c in DUMMIES else None
            workloads.append(
                workload(m, c, path, seed * 100 + c, dummy=dummy, tensors=c in (1, DUMMIES[0]))
            )
        started = time.monotonic()
        time.sleep(SECONDS / 3)
        daemon.kill()  # SIGKILL, and reaped: from here on no daemon runs
        dead = time.monotonic_ns()
        time.sleep(DAEMON_DOWN)
        restarting = time.monotonic_ns()
        daemon.restart()  # same port; returns once it serves dummy clients
        serving = time.monotonic_ns()
        check_run(workloads, histories, started, lincheck, tmp_path, eviction=segment != "0")
    finally:
        daemon.kill()
    ops = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    for c in DUMMIES:
        mine = [op for op in ops if op["client"] == c]
        down = [op for op in mine if op["invoke"] > dead and op["complete"] < restarting]
        assert down, f"dummy {c} made no call while its daemon was dead"
        # Answered before the kill, or RPC_FAIL; a get or get_tensor that
        # found nothing is recorded as a failed read with no code.
        at_kill = [op for op in mine if op["invoke"] < dead < op["complete"]]
        wrong = [
            op
            for op in down + at_kill
            if op.get("code") != RPC_FAIL
            and not (op in at_kill and isinstance(op["outcome"], dict))
            and not (op["call"] == "get" and op.get("code") == NO_CODE)
        ]
        assert not wrong, f"dummy {c}, daemon dead: {wrong[:5]}"
        slow = [op for op in down if op["complete"] - op["invoke"] > 10**9]
        assert not slow, f"dummy {c}, daemon dead, calls did not fail at once: {slow[:5]}"
        again = [op for op in mine if op["invoke"] > serving and isinstance(op["outcome"], dict)]
        assert again, f"dummy {c} did not work again through the new daemon"


@pytest.mark.parametrize(
    ("segment", "seed"),
    [(64 << 20, 8), (TIGHT_SEGMENT, 9)],
    ids=["disk-full", "disk-full-tight-memory"],
)
def test_history_with_the_offload_disk_full_is_linearizable(
    offload_disk: Path,
    master_factory: Callable[..., Master],
    child_factory: Callable[..., Child],
    workloads: list[subprocess.Popen[bytes]],
    lincheck: str,
    tmp_path: Path,
    segment: int,
    seed: int,
) -> None:
    """The holders keep disk tiers (SSD offload) on one small tmpfs, and the
    master writes every committed object through to its holder's tier. A
    third into the run a filler file takes every free page of the tmpfs
    and keeps taking those the tiers free, for DISK_FULL_FOR seconds; then
    it is deleted. While the disk is full every copy to it fails with
    ENOSPC, and the holder reports the copy lost.

    ``disk-full``: memory has room for every object, so every object keeps
    its memory copy and nothing may be lost: the history is checked without
    eviction (no acknowledged write lost, no key read as not found while it
    holds a value).

    ``disk-full-tight-memory``: the holders' segments (TIGHT_SEGMENT each)
    hold less than the workload's values, so eviction keeps dropping the
    memory copies of objects whose disk copy is queued, and reads of those
    go to the disk tier. A copy that fails on the full disk after eviction
    dropped the memory copy leaves the object nowhere: it is gone, as
    eviction without offload would drop it. The history is checked with
    eviction: a key may read as not found, never as an older, a foreign or
    a torn value.

    So that the run cannot pass without the disk mattering, the tiers must
    have written (and, with tight memory, served reads) before the fill,
    failed writes during it, and written again after it; and once the run
    is over a fresh object's copy reaches disk with no write failing."""
    tight = segment == TIGHT_SEGMENT
    m = master_factory(default_kv_lease_ttl=200, client_ttl=CLIENT_TTL, enable_offload=True)
    holders = [child_factory(env=OFFLOAD_ENV) for _ in range(2)]
    for i, h in enumerate(holders):
        tier = offload_disk / f"holder{i}"
        tier.mkdir()
        args = {"global_segment_size": segment, "ssd_offload_path": str(tier)}
        assert h.setup(m, enable_ssd_offload=True, **args) == 0
    histories = [tmp_path / f"h{c}.jsonl" for c in range(CLIENTS)]
    for c, path in enumerate(histories):
        workloads.append(workload(m, c + 1, path, seed * 100 + c))
    started = time.monotonic()
    time.sleep(SECONDS / 3)
    before = disk_stats(holders)
    assert before["disk_bytes_written"] > 0, before
    assert list(offload_disk.glob("holder*/*.bucket")), "no bucket file on the tmpfs"
    if tight:
        assert before["disk_bytes_read"] > 0, before
    during = full_for(offload_disk, DISK_FULL_FOR, lambda: disk_stats(holders))
    emptied = disk_stats(holders)
    report = check_run(workloads, histories, started, lincheck, tmp_path, eviction=tight)
    after = disk_stats(holders)
    gap = longest_unavailability(tmp_path / "history.jsonl")
    print(f"\n{report.strip()}\nlongest unavailability {gap:.2f} s")
    print(f"disk tiers: before the fill {before}, full {during}, at the end {after}")
    assert during["disk_failed_writes"] > before["disk_failed_writes"], (before, during)
    assert after["disk_bytes_written"] > emptied["disk_bytes_written"], (emptied, after)
    # A fresh object is written through once the filler is gone, and no
    # copy fails any more.
    put = holders[0].call("put_pattern_retry", key="disk-probe", size=PROBE_SIZE, seed=3)
    assert put == 0
    want = after["disk_bytes_written"] + PROBE_SIZE
    assert wait_until(lambda: disk_stats(holders)["disk_bytes_written"] >= want, 30.0), disk_stats(
        holders
    )
    assert disk_stats(holders)["disk_failed_writes"] == after["disk_failed_writes"]


def check_run(
    workloads: list[subprocess.Popen[bytes]],
    histories: list[Path],
    started: float,
    lincheck: str,
    tmp_path: Path,
    eviction: bool,
    killed: frozenset[int] | set[int] = frozenset(),
) -> str:
    """Wait for the workloads (those whose pid is in ``killed`` died of
    SIGKILL), merge their histories and check them: zero anomalies (with
    ``eviction``, a key may also read as not found). Returns the checker's
    report."""
    for p in workloads:
        assert p.wait(timeout=SECONDS + 60) == (-9 if p.pid in killed else 0)
    assert time.monotonic() - started >= SECONDS
    # The byte keys, and the tensor keys of client 1.
    keys = 2 * KEYS
    return check_histories(
        lincheck, histories, tmp_path / "history.jsonl", keys, eviction, STUCK_NS
    )


def test_history_across_a_leader_kill_is_linearizable(
    child_factory: Callable[..., Child],
    workloads: list[subprocess.Popen[bytes]],
    lincheck: str,
    tmp_path: Path,
) -> None:
    """Three masters in HA on a real etcd; the leader is killed (SIGKILL)
    while the clients run, and the clients and holders follow the standby
    that takes over. The new leader learns the objects from their holders,
    so the history is checked without eviction: nothing acknowledged may be
    lost. A new leader that answered before the owners remounted read keys
    as not found and then their old values again (this run with
    ``MC_HA_TAKEOVER_HOLD_MS=0`` shows it); it now holds requests about
    unknown keys until they did."""
    with running_etcd() as etcd:
        cluster = f"robust-{os.getpid()}-{time.monotonic_ns()}"
        env = {"MC_STORE_CLUSTER_ID": cluster}
        ms = [HaMaster(etcd, cluster, tmp_path, [f"--client_ttl={CLIENT_TTL}"]) for _ in range(3)]
        try:
            first = leader(ms)
            addr = f"etcd://{etcd}"
            holders = [child_factory(env=env) for _ in range(2)]
            for h in holders:
                ha = SimpleNamespace(rpc_addr=addr, metadata_url="P2PHANDSHAKE")
                assert h.setup(ha) == 0
            histories = [tmp_path / f"h{c}.jsonl" for c in range(CLIENTS)]
            for c, path in enumerate(histories):
                workloads.append(workload(addr, c + 1, path, 500 + c, env))
            started = time.monotonic()
            time.sleep(SECONDS / 3)
            first.kill()
            second = leader(ms)
            assert second is not first
            check_run(workloads, histories, started, lincheck, tmp_path, False)
        finally:
            for m in ms:
                m.kill()
