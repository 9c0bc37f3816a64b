"""Segments added after setup: ``mount_segment`` (a file or ``/dev/shm``
object), ``allocate_and_mount_segment`` (memory allocated by the client),
and their ``unmount_segment`` / ``unmount_and_free_segment``, with
upstream's result shapes; objects placed in an added segment are read by
other processes, survive a master restart, and go when it is unmounted."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Master, StoreFactory, wait_until

MiB = 1 << 20


def _preferred(segment: str) -> Any:
    from mooncake.store import ReplicateConfig

    cfg = ReplicateConfig()
    cfg.preferred_segment = segment
    return cfg


def _segment_of(s: Any, key: str) -> set[str]:
    return {
        r.get_memory_descriptor().buffer_descriptor.transport_endpoint
        for r in s.get_replica_desc(key)
    }


@pytest.fixture
def shm_file() -> Any:
    path = Path("/dev/shm") / f"mc-test-mount-{os.getpid()}-{time.monotonic_ns()}"
    with open(path, "wb") as f:
        f.truncate(8 * MiB)
    yield path
    path.unlink(missing_ok=True)


def test_allocate_and_mount_adds_a_segment_others_read(
    store_factory: StoreFactory, master: Master
) -> None:
    owner = store_factory(master, global_segment_size=0)
    reader = store_factory(master)
    r = owner.allocate_and_mount_segment(4 * MiB + 1)
    assert r["ret"] == 0, r
    assert r["allocated_size"] == 4 * MiB + 4096
    [seg] = r["segment_ids"]
    assert seg in master.segments()
    assert owner.put("k", b"v" * 1000, _preferred(seg)) == 0
    assert _segment_of(reader, "k") == {seg}
    assert reader.get("k") == b"v" * 1000
    assert reader.put("r", b"w" * 5000, _preferred(seg)) == 0
    assert owner.get("r") == b"w" * 5000
    # Taken out with its objects; the other kind of unmount refuses it.
    assert owner.unmount_segment([seg]) == -1
    assert owner.unmount_and_free_segment([seg]) == 0
    assert seg not in master.segments()
    assert reader.is_exist("k") == 0
    assert owner.unmount_and_free_segment([seg]) == -1


def test_mount_segment_maps_a_shm_file(
    store_factory: StoreFactory, master: Master, shm_file: Path
) -> None:
    owner = store_factory(master, global_segment_size=0)
    reader = store_factory(master)
    r = owner.mount_segment(str(shm_file), 8 * MiB, offset=0, protocol="tcp", location="")
    assert set(r) == {"ret", "segment_ids"} and r["ret"] == 0, r
    [seg] = r["segment_ids"]
    payload = bytes(range(256)) * 64
    assert owner.put("f", payload, _preferred(seg)) == 0
    assert _segment_of(reader, "f") == {seg}
    assert reader.get("f") == payload
    # The bytes are in the file.
    assert payload in shm_file.read_bytes()
    assert owner.unmount_segment([seg], 0) == 0
    assert reader.is_exist("f") == 0


def test_added_segments_survive_a_master_restart(
    store_factory: StoreFactory, master_factory: Any
) -> None:
    m = master_factory()
    owner = store_factory(m, global_segment_size=0)
    r = owner.allocate_and_mount_segment(4 * MiB)
    [seg] = r["segment_ids"]
    assert owner.put("durable", b"d" * 3000) == 0
    m.restart()
    assert wait_until(lambda: seg in m.segments(), 10.0)
    assert wait_until(lambda: owner.get("durable") == b"d" * 3000, 10.0)


@pytest.mark.parametrize(
    ("call", "args"),
    [
        ("mount_segment", ("/nonexistent/mc-file", MiB)),
        ("mount_segment", ("SHM", 16 * MiB)),  # larger than the file
        ("mount_segment", ("SHM", MiB, 4096)),  # an offset
        ("mount_segment", ("SHM", 0)),
        ("allocate_and_mount_segment", (0,)),
    ],
)
def test_bad_mounts_fail_and_add_nothing(
    store_factory: StoreFactory, master: Master, shm_file: Path, call: str, args: tuple[Any, ...]
) -> None:
    s = store_factory(master)
    before = master.segments()
    args = tuple(str(shm_file) if a == "SHM" else a for a in args)
    r = getattr(s, call)(*args)
    assert r["ret"] == -600 and r["segment_ids"] == [], r
    assert master.segments() == before
    assert s.put("still", b"works") == 0


def test_unmount_of_ids_not_mounted_here(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    other = store_factory(master)
    r = other.allocate_and_mount_segment(MiB)
    [seg] = r["segment_ids"]
    assert s.unmount_segment([]) == 0
    assert s.unmount_and_free_segment([seg]) == -1
    assert s.unmount_segment([s.get_hostname()]) == -1
    assert seg in master.segments()


def test_close_takes_added_segments_out(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    [seg] = s.allocate_and_mount_segment(MiB)["segment_ids"]
    assert seg in master.segments()
    s.close()
    assert wait_until(lambda: seg not in master.segments(), 5.0)
