"""Metadata survives the master: after a master restart, every
object whose write returned 0 and that was not removed is readable again once
the clients holding its replicas have remounted; removed objects stay removed,
upserted objects show the new value, and an object whose only replicas lived
in a client that died while the master was down is gone.

Mechanism under test: each client keeps a ledger of the committed replicas in
its segment (the master pushes commits and forgets to the owner before it
acknowledges a write or a removal) and reports it when it remounts.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Child, Master, StoreFactory, master_bin, pattern, wait_until
from helpers.replicate import replicate_config as _cfg
from helpers.waits import assert_reads_converge

MiB = 1 << 20
SIZES = [17, 4096, 65536, MiB]


Owners = tuple[Any, Child, str, str]


@pytest.fixture
def owners(
    master: Master, store_factory: StoreFactory, child_factory: Callable[..., Child]
) -> Owners:
    """A store in this process and one in a child process, both lending a
    segment on ``master``: ``(store, child, store's segment, child's segment)``."""
    a = store_factory(master)
    b = child_factory()
    assert b.setup(master) == 0
    return a, b, a.get_hostname(), b.call("hostname")


def _read_all(store: Any, expect: dict[str, bytes]) -> dict[str, bytes]:
    """Keys whose current value differs from ``expect`` (b"" = unreadable)."""
    out = {}
    for k, v in expect.items():
        got = store.get(k)
        if got != v:
            out[k] = got
    return out


@pytest.mark.slow
def test_objects_survive_a_master_restart(master: Master, owners: Owners) -> None:
    a, b, seg_a, seg_b = owners
    expect: dict[str, bytes] = {}
    for i in range(48):
        key = f"obj{i}"
        value = pattern(SIZES[i % 4], i)
        cfg = _cfg(2 if i % 6 == 0 else 1, [seg_a, seg_b][i % 2])
        assert a.put(key, value, cfg) == 0
        expect[key] = value
    # In-place upserts (same size) and moving upserts (new size).
    for i in range(8):
        key = f"obj{i}"
        value = pattern(len(expect[key]) if i % 2 else len(expect[key]) + 100, 1000 + i)
        assert a.upsert(key, value) == 0
        expect[key] = value
    removed = [f"obj{i}" for i in range(40, 48)]
    for k in removed:
        assert a.remove(k, True) == 0
        del expect[k]
    assert _read_all(a, expect) == {}

    master.restart()
    # Once both clients have remounted, everything is back, with the latest values.
    assert wait_until(lambda: not _read_all(a, expect), 10.0, 0.1), _read_all(a, expect)
    for k in removed:
        assert a.get(k) == b"", k
        assert a.is_exist(k) == 0
    for k, v in list(expect.items())[:6]:
        r = b.call("check_pattern", key=k, size=len(v), seed=int(k[3:]))
        assert r["n"] == len(v)
    assert (master.metric("master_recovered_objects_total") or 0) >= len(expect)
    assert (master.metric("master_recovered_segments_total") or 0) >= 2
    # The recovered objects behave as before: write-once, removable, readable by key listing.
    assert a.put("obj10", b"other") == 0
    assert a.get("obj10") == expect["obj10"]
    assert a.remove("obj11", True) == 0
    assert a.get("obj11") == b""
    # The allocator knows the recovered ranges: new writes never overwrite them.
    for i in range(32):
        assert a.put(f"new{i}", pattern(65536, 5000 + i), _cfg(1, seg_b if i % 2 else seg_a)) == 0
    del expect["obj11"]
    assert _read_all(a, expect) == {}


@pytest.mark.slow
def test_reads_during_the_gap_are_never_wrong(master: Master, owners: Owners) -> None:
    a, _child, _, seg_b = owners
    expect = {f"g{i}": pattern(4096, i) for i in range(16)}
    for k, v in expect.items():
        assert a.put(k, v, _cfg(1, seg_b)) == 0
    master.kill()
    seen: set[bytes] = set()
    master.start()
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        for k, v in expect.items():
            got = a.get(k)
            assert got in (b"", v), f"{k}: wrong value during the recovery gap"
            seen.add(got)
        if b"" not in {a.get(k) for k in expect}:
            break
        time.sleep(0.05)
    assert _read_all(a, expect) == {}


@pytest.mark.slow
def test_a_client_that_died_while_the_master_was_down_loses_only_its_objects(
    master: Master, owners: Owners
) -> None:
    survivor, doomed, seg_s, seg_d = owners
    only_doomed = {f"d{i}": pattern(4096, i) for i in range(8)}
    only_survivor = {f"s{i}": pattern(4096, 100 + i) for i in range(8)}
    both = {f"b{i}": pattern(4096, 200 + i) for i in range(8)}
    for k, v in only_doomed.items():
        assert survivor.put(k, v, _cfg(1, seg_d)) == 0
    for k, v in only_survivor.items():
        assert survivor.put(k, v, _cfg(1, seg_s)) == 0
    for k, v in both.items():
        assert survivor.put(k, v, _cfg(2, seg_d)) == 0
        assert len(master.query_key(k)[1]["data"]) == 2
    master.kill()
    doomed.kill()
    master.start()
    keep = {**only_survivor, **both}
    assert wait_until(lambda: not _read_all(survivor, keep), 10.0, 0.1), _read_all(survivor, keep)
    for k in only_doomed:
        assert survivor.get(k) == b""
        assert survivor.is_exist(k) == 0
    for k in both:
        status, body = master.query_key(k)
        assert status == 200 and len(body["data"]) == 1, body
    assert seg_d not in master.segments()


@pytest.mark.slow
def test_a_moving_upsert_leaves_no_old_version_behind(master: Master, owners: Owners) -> None:
    a, b, seg_a, seg_b = owners
    assert a.put("u", pattern(4096, 1), _cfg(1, seg_b)) == 0
    assert b.call("stats")["ledger_entries"] == 1
    # A different size moves the object (to a's segment): b forgets v1 first.
    assert a.upsert("u", pattern(8192, 2), _cfg(1, seg_a)) == 0
    assert b.call("stats")["ledger_entries"] == 0
    assert a.get_client_stats()["ledger_entries"] == 1
    master.restart()
    assert wait_until(lambda: a.get("u") == pattern(8192, 2), 10.0, 0.1)
    for _ in range(20):
        assert a.get("u") == pattern(8192, 2)


@pytest.mark.slow
@pytest.mark.parametrize("move", [False, True], ids=["same_segment", "moved"])
def test_an_upsert_over_a_held_read_comes_back_as_the_new_version(
    master: Master,
    store_factory: StoreFactory,
    owners: Owners,
    move: bool,
) -> None:
    """An upsert returned 0 while reads still held the old version: after a
    master restart only the new version is ever read, even during the gap."""
    a, b, seg_a, seg_b = owners
    reader = store_factory(master, global_segment_size=0)
    keys = [f"h{i}" for i in range(8)]
    for i, k in enumerate(keys):
        assert a.put(k, pattern(4096, i), _cfg(1, seg_b)) == 0
    # Reads in flight on the first version (get sessions hold them).
    assert reader.batch_get_session_start(keys) == [0] * len(keys)
    new = {k: pattern(4096, 100 + i) for i, k in enumerate(keys)}
    for k, v in new.items():
        assert a.upsert(k, v, _cfg(1, seg_a if move else seg_b)) == 0
    assert master.metric("master_retired_versions") == len(keys)
    # The owners forgot every replaced version although reads still hold it.
    assert b.call("stats")["ledger_entries"] == (0 if move else len(keys))
    master.kill()
    master.start()
    assert_reads_converge(a.get, new, "restart")


@pytest.mark.slow
def test_two_restarts_in_a_row(master: Master, store_factory: StoreFactory) -> None:
    a = store_factory(master)
    expect = {f"r{i}": pattern(1000 + i, i) for i in range(10)}
    for k, v in expect.items():
        assert a.put(k, v) == 0
    for _ in range(2):
        master.restart()
        assert wait_until(lambda: not _read_all(a, expect), 10.0, 0.1), _read_all(a, expect)


@pytest.mark.parametrize(
    ("flag", "needle"),
    [
        ("--enable_oplog=true", "enable_oplog"),
        ("--enable_snapshot=true", "enable_snapshot"),
        ("--enable_snapshot_restore=true", "enable_snapshot_restore"),
    ],
)
def test_oplog_and_snapshot_flags_are_refused_with_the_mechanism_named(
    flag: str, needle: str
) -> None:
    r = subprocess.run(
        [master_bin(), flag], capture_output=True, text=True, timeout=30, check=False
    )
    assert r.returncode == 1
    assert needle in r.stderr
    assert "re-report" in r.stderr, r.stderr
