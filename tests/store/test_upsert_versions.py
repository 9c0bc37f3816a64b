"""Upserts of keys that are being read: the writer never starves and readers
never see a torn value.

An upsert of a committed key writes the new bytes into fresh replicas and
switches the key to them in one step; the replaced replicas stay allocated,
their bytes unchanged, until every read that started on them has finished or
its lease ran out. Checked here with readers and writers in separate
processes (``tests/helpers/upsert_race.py``), over the same-host path and
with TCP forced, for every upsert form; with a read held in flight on purpose
(a stopped owner, a get session); and for the bounds on replaced versions.

Values are self-describing: every byte of version ``v`` is ``v % 251``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import HELPERS, REPO, Child, Master, StoreFactory, pattern, wait_until
from mooncake.store import ReplicateConfig

MiB = 1 << 20
BUSY = -714
RETIRED = "master_retired_versions"

METHODS = [
    "upsert",
    "upsert_from",
    "batch_upsert_from",
    "upsert_tensor",
    "upsert_tensor_with_parallelism",
]
PATHS = {"same_host": {}, "tcp": {"MC_FORCE_TCP": "1"}}


def _cfg(preferred: str = "") -> Any:
    c = ReplicateConfig()
    if preferred:
        c.preferred_segment = preferred
    return c


class Race:
    """Reader and writer processes of ``upsert_race.py`` around one key."""

    def __init__(self, tmp: Path, master: Master, env: dict[str, str], **cfg: Any) -> None:
        # The processes lend no memory: every replica lives in the test's
        # holder store, so values outlive the processes that wrote them.
        cfg.setdefault("segment", 0)
        self.tmp = tmp
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", **env)
        self.base = dict(
            cfg,
            metadata_url=master.metadata_url,
            rpc_addr=master.rpc_addr,
            floor=str(tmp / "floor"),
            ready=str(tmp / "ready"),
            stop=str(tmp / "stop"),
        )
        (tmp / "floor").write_bytes(bytes(8))
        (tmp / "ready").mkdir()
        self.procs: list[tuple[str, subprocess.Popen[str]]] = []

    def start(self, role: str, **extra: Any) -> None:
        cfg = dict(self.base, role=role, **extra)
        p = subprocess.Popen(
            [sys.executable, str(HELPERS / "upsert_race.py"), json.dumps(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=str(REPO),
        )
        self.procs.append((role, p))

    def finish(self, timeout: float = 120) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Wait for the writers, stop the readers; (writer results, reader results)."""
        out: dict[str, list[dict[str, Any]]] = {"writer": [], "reader": []}
        try:
            for role, p in self.procs:
                if role == "writer":
                    o, e = p.communicate(timeout=timeout)
                    assert p.returncode == 0, e[-3000:]
                    out[role].append(json.loads(o.strip().splitlines()[-1]))
            Path(self.base["stop"]).touch()
            for role, p in self.procs:
                if role == "reader":
                    o, e = p.communicate(timeout=60)
                    assert p.returncode == 0, e[-3000:]
                    out[role].append(json.loads(o.strip().splitlines()[-1]))
        finally:
            for _, p in self.procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            self.procs = []
        return out["writer"], out["reader"]


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("method", METHODS)
def test_readers_never_starve_the_writer_nor_see_a_torn_value(
    master: Master, tmp_path: Path, store_factory: StoreFactory, method: str, path: str
) -> None:
    """The issue's scenario (lease 500 ms, readers looping): every upsert returns
    0; every read is one whole version, never older than the last acknowledged
    one, never going back; no read of the existing key fails."""
    if method in ("upsert_tensor", "upsert_tensor_with_parallelism"):
        pytest.importorskip("torch")
    versions = 120
    store_factory(master, global_segment_size=256 * MiB)
    race = Race(tmp_path, master, PATHS[path], method=method, key="hot", size=MiB, readers=3)
    # The key exists before the readers start.
    race.start("writer", versions=1, first=1, readers=0)
    first, _ = race.finish()
    assert first[0]["codes"] == {"0": 1 if method != "batch_upsert_from" else 2}
    Path(race.base["stop"]).unlink()
    for _ in range(3):
        race.start("reader")
    race.start("writer", versions=versions, first=2)
    writers, readers = race.finish()
    per_call = 2 if method == "batch_upsert_from" else 1
    assert writers[0]["codes"] == {"0": versions * per_call}, writers
    assert writers[0]["stale_readback"] == 0, writers
    for r in readers:
        assert r["torn"] == 0, readers
        assert r["older_than_floor"] == 0, readers
        assert r["went_back"] == 0, readers
        assert r["codes"] == {}, readers
        assert r["versions_seen"] >= 2, readers
        assert r["last"] == [(versions + 1) % 251] * per_call, readers
    # Every upsert of the existing key made a new version, beside the one
    # being read or, while nobody read it, in place.
    made = (master.metric("master_upsert_versions_total") or 0) + (
        master.metric("master_upsert_in_place_total") or 0
    )
    assert made >= versions * per_call
    # Nothing stays held once the readers are gone.
    assert wait_until(lambda: master.metric(RETIRED) == 0, 10), master.metric(RETIRED)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_two_writers_of_one_key_both_succeed_and_the_value_stays_whole(
    master: Master, tmp_path: Path, store_factory: StoreFactory, path: str
) -> None:
    s = store_factory(master, global_segment_size=256 * MiB)
    race = Race(tmp_path, master, PATHS[path], method="upsert_from", key="two", size=MiB, readers=2)
    race.start("writer", versions=1, first=1, readers=0)
    race.finish()
    Path(race.base["stop"]).unlink()
    for _ in range(2):
        race.start("reader")
    # Writer 0 writes odd versions, writer 1 even ones.
    for w in range(2):
        race.start("writer", versions=60, first=3 + w, step=2, writers=2)
    writers, readers = race.finish()
    for w in writers:
        assert w["codes"] == {"0": 60}, writers
    for r in readers:
        assert r["torn"] == 0 and r["codes"] == {}, readers
    got = np.frombuffer(s.get("two"), np.uint8)
    assert got.size == MiB
    # The last upsert to commit wins, whole: the final value of one writer.
    assert int(got[0]) in (121, 122) and bool(np.all(got == got[0])), got[:4]


def test_an_in_flight_read_finishes_on_the_old_version(
    master_factory: Callable[..., Master],
    store_factory: StoreFactory,
    child_factory: Callable[..., Child],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read held in flight (its owner stopped mid-read) while an upsert
    commits: the upsert returns 0 at once, a new read gets the new value, and
    the held read returns the old bytes, whole."""
    master = master_factory(default_kv_lease_ttl=20000)
    size = 4 * MiB
    owner = child_factory({"MC_STORE_SAME_HOST": "off"})
    assert owner.setup(master) == 0
    assert owner.call("put_pattern", key="busy", size=size, seed=3) == 0
    monkeypatch.setenv("MC_STORE_SAME_HOST", "off")
    reader = store_factory(master, global_segment_size=0)
    writer = store_factory(master)  # the new version goes to the writer's segment
    dst = np.zeros(size, np.uint8)
    result: dict[str, Any] = {}

    def read() -> None:
        result["rc"] = reader.get_into("busy", int(dst.ctypes.data), size)

    before = master.metric("master_get_replica_list_requests_total") or 0
    os.kill(owner.pid, signal.SIGSTOP)
    try:
        t = threading.Thread(target=read)
        t.start()
        assert wait_until(
            lambda: (master.metric("master_get_replica_list_requests_total") or 0) >= before + 1,
            30,
        )
        assert t.is_alive()
        mine = _cfg(writer.get_hostname())
        assert writer.upsert("busy", pattern(size, 4), mine) == 0
        assert writer.get("busy") == pattern(size, 4)
        arr = np.frombuffer(pattern(size + 100, 5), np.uint8).copy()
        assert writer.upsert_from("busy", int(arr.ctypes.data), size + 100, mine) == 0
        assert writer.get("busy") == pattern(size + 100, 5)
        # The first version is still held for the stopped read.
        assert master.metric(RETIRED) == 1
        # A plain put stays write-once.
        assert writer.put("busy", b"x") == 0
    finally:
        os.kill(owner.pid, signal.SIGCONT)
    t.join(60)
    assert not t.is_alive()
    assert result["rc"] == size
    assert dst.tobytes() == pattern(size, 3)
    assert wait_until(lambda: master.metric(RETIRED) == 0, 10)


def test_a_session_keeps_reading_its_version_while_new_reads_get_the_new_one(
    master: Master, store_factory: StoreFactory
) -> None:
    w = store_factory(master)
    r = store_factory(master)
    page = 64 << 10
    assert w.put("s", pattern(4 * page, 1)) == 0
    assert r.batch_get_session_start(["s"]) == [0]
    assert w.upsert("s", pattern(4 * page, 2)) == 0
    assert r.get("s") == pattern(4 * page, 2)
    dst = np.zeros(page, np.uint8)
    for layer in range(4):
        got = r.batch_get_into_multi_buffer_ranges(
            ["s"], [[int(dst.ctypes.data)]], [[page]], [[layer * page]]
        )
        assert got == [page], got
        assert dst.tobytes() == pattern(4 * page, 1)[layer * page : (layer + 1) * page]
    assert master.metric(RETIRED) == 1
    assert r.batch_get_session_end(["s"]) == 0
    assert wait_until(lambda: master.metric(RETIRED) == 0, 10)
    # The replaced version's space is back: one object's worth allocated.
    assert master.metric("master_allocated_bytes") == 4 * page


def test_replaced_versions_count_and_are_bounded_per_key(
    master_factory: Callable[..., Master], store_factory: StoreFactory
) -> None:
    master = master_factory(max_pending_versions_per_key=2, pending_version_wait_ms=300)
    w = store_factory(master)
    readers = [store_factory(master, global_segment_size=0) for _ in range(3)]
    size = MiB
    assert w.put("b", pattern(size, 0)) == 0
    # Each reader holds a different version in a session; each upsert retires one.
    for i, r in enumerate(readers[:2]):
        assert r.batch_get_session_start(["b"]) == [0]
        assert w.upsert("b", pattern(size, i + 1)) == 0
        # Replaced versions count against capacity until freed.
        assert master.metric("master_allocated_bytes") == (i + 2) * size
    assert master.metric(RETIRED) == 2
    assert readers[2].batch_get_session_start(["b"]) == [0]
    assert w.upsert("b", pattern(size, 9)) == BUSY
    assert w.get("b") == pattern(size, 2)
    # It waited for a version to be freed before giving up.
    assert (master.metric("master_upsert_version_waits_total") or 0) >= 1
    # Other keys are not limited by this one.
    assert w.upsert("other", pattern(size, 7)) == 0
    # An upsert waiting for a slot proceeds as soon as a read ends.
    result: dict[str, int] = {}
    t = threading.Thread(target=lambda: result.update(rc=w.upsert("b", pattern(size, 10))))
    master_waits = master.metric("master_upsert_version_waits_total") or 0
    t.start()
    assert wait_until(
        lambda: (master.metric("master_upsert_version_waits_total") or 0) > master_waits, 10
    )
    assert readers[0].batch_get_session_end(["b"]) == 0
    t.join(30)
    assert result == {"rc": 0}
    assert w.get("b") == pattern(size, 10)
    for r in readers[1:]:
        assert r.batch_get_session_end(["b"]) == 0
    assert wait_until(lambda: master.metric(RETIRED) == 0, 10)


def test_eviction_never_frees_a_version_a_read_still_holds(
    master_factory: Callable[..., Master], store_factory: StoreFactory
) -> None:
    master = master_factory(default_kv_lease_ttl=60000)
    w = store_factory(master, global_segment_size=16 * MiB)
    r = store_factory(master, global_segment_size=0)
    page = 256 << 10
    assert w.put("held", pattern(4 * page, 1)) == 0
    assert r.batch_get_session_start(["held"]) == [0]
    assert w.upsert("held", pattern(4 * page, 2)) == 0
    # Fill the segment past the watermark; only unleased objects can go.
    for i in range(40):
        w.put(f"fill{i}", pattern(MiB, 100 + i))
    assert (master.metric("master_evicted_key_count") or 0) > 0
    dst = np.zeros(page, np.uint8)
    for layer in range(4):
        got = r.batch_get_into_multi_buffer_ranges(
            ["held"], [[int(dst.ctypes.data)]], [[page]], [[layer * page]]
        )
        assert got == [page]
        assert dst.tobytes() == pattern(4 * page, 1)[layer * page : (layer + 1) * page]
    assert r.batch_get_session_end(["held"]) == 0


def test_upsert_right_after_a_read_succeeds(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    other = store_factory(master)
    assert s.put("k", b"v1") == 0
    for i in range(20):
        assert s.get("k") != b""
        assert s.upsert("k", f"v{i:02d}".encode()) == 0
    assert other.get("k") == b"v19"
    assert s.upsert("k", b"after") == 0
    assert s.get("k") == b"after"


def test_an_upsert_nobody_reads_writes_in_place_and_reads_back_whole(
    store_factory: StoreFactory, master: Master
) -> None:
    """Without readers, an upsert of the same size on the writer's host goes
    into the committed replica itself (no second allocation); the value read
    afterwards is the last one, whole, and the space used does not grow."""
    s = store_factory(master, global_segment_size=64 * MiB)
    size = 4 * MiB
    src = np.empty(size, np.uint8)
    dst = np.empty(size, np.uint8)
    for a in (src, dst):
        assert s.register_buffer(a.ctypes.data, size) == 0
    src[:] = 1
    assert s.put_from("k", src.ctypes.data, size) == 0
    in_place = master.metric("master_upsert_in_place_total") or 0
    versions = master.metric("master_upsert_versions_total") or 0
    used = master.metric("master_allocated_bytes")
    for v in range(2, 12):
        src[:] = v
        assert s.upsert_from("k", src.ctypes.data, size) == 0
    assert (master.metric("master_upsert_in_place_total") or 0) - in_place == 10
    assert (master.metric("master_upsert_versions_total") or 0) == versions
    assert master.metric("master_allocated_bytes") == used
    assert s.get_into("k", dst.ctypes.data, size) == size
    assert bool(np.all(dst == 11))
    # A different size cannot reuse the replica: a new version, read whole.
    assert s.upsert_from("k", src.ctypes.data, size // 2) == 0
    assert (master.metric("master_upsert_versions_total") or 0) == versions + 1
    assert s.get_into("k", dst.ctypes.data, size) == size // 2
    assert bool(np.all(dst[: size // 2] == 11))
