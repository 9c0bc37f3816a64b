"""The master's offload flags, each at its default and at another value,
against real masters and real owners:

- ``--offload_on_evict`` (default false): every completed put is copied to
  its owner's disk tier (write-through) with no memory pressure at all;
  true: nothing reaches disk until eviction selects an object.
- ``--offload_force_evict`` with ``--offload_cap_ratio``: objects an eviction
  pass may not queue for disk stay in memory (puts then fail with -200 and
  nothing is lost), or with force-evict are dropped.
- ``--enable_disk_eviction`` (default true): a disk tier under
  ``--root_fs_dir`` evicts its oldest copies to make room; false: a full
  tier refuses new copies and keeps every one it holds.
- ``--quota_bytes`` (default 0: 90% of the file system): the most bytes each
  disk tier under ``--root_fs_dir`` holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Master, wait_until
from helpers.common import pattern
from helpers.fixtures import closed_at_teardown
from test_offload import LEASE_MS, SEG, MiB, N, allocated, buckets, fill, put_retry, setup_owner

NO_AVAILABLE_HANDLE = -200


@pytest.fixture
def made() -> Iterator[list[Any]]:
    yield from closed_at_teardown()


@pytest.fixture
def owner_on(
    master_factory: Callable[..., Master], made: list[Any], tmp_path: Path
) -> Callable[..., tuple[Any, Path]]:
    """``owner_on(**master_flags)``: a master with ``--enable_offload`` and
    those flags, and an owner (16 MiB segment) with its disk tier in a fresh
    directory; returns (store, tier directory)."""

    def make(**flags: Any) -> tuple[Any, Path]:
        m = master_factory(default_kv_lease_ttl=LEASE_MS, enable_offload=True, **flags)
        d = tmp_path / f"tier{len(made)}"
        d.mkdir()
        s, rc = setup_owner(m, d)
        assert rc == 0
        made.append(s)
        return s, d

    return make


def disk_objects(s: Any) -> int:
    return int(s.get_client_stats()["disk_objects"])


def read_back(s: Any, keys: list[str]) -> None:
    for i, k in enumerate(keys):
        assert s.get(k) == pattern(MiB, i), k


def kinds(s: Any, keys: list[str]) -> dict[str, str]:
    out = {}
    for k, ds in s.batch_get_replica_desc(keys).items():
        out[k] = "memory" if ds and ds[0].is_memory_replica() else "disk"
    return out


def test_by_default_a_put_reaches_the_owners_disk_without_memory_pressure(
    owner_on: Callable[..., tuple[Any, Path]],
) -> None:
    s, d = owner_on()
    keys = fill(s, "p", 4)  # a quarter of the segment: no eviction
    assert wait_until(lambda: disk_objects(s) == 4, 10.0), s.get_client_stats()
    assert buckets(d)
    # Still served from memory.
    assert set(kinds(s, keys).values()) == {"memory"}
    read_back(s, keys)


def test_by_default_evicted_memory_copies_read_back_from_the_written_through_copy(
    owner_on: Callable[..., tuple[Any, Path]],
) -> None:
    s, _ = owner_on()
    keys = fill(s, "e")  # three times the segment
    # Every object was written through, evicted or not.
    assert wait_until(lambda: disk_objects(s) == N, 10.0), s.get_client_stats()
    found = kinds(s, keys)
    assert found[keys[0]] == "disk" and found[keys[-1]] == "memory", found
    read_back(s, keys)
    assert s.get_client_stats()["disk_bytes_read"] > 0


def test_with_offload_on_evict_nothing_reaches_disk_until_eviction(
    owner_on: Callable[..., tuple[Any, Path]],
) -> None:
    s, d = owner_on(offload_on_evict=True)
    few = fill(s, "q", 4)
    # Long enough for a write-through copy to have been made.
    assert not wait_until(lambda: disk_objects(s) > 0, 1.5)
    assert not buckets(d)
    keys = fill(s, "r")
    assert wait_until(lambda: disk_objects(s) > 0, 10.0)
    # Only what eviction selected went to disk: the latest objects did not.
    assert disk_objects(s) < N + len(few), s.get_client_stats()
    assert kinds(s, keys)[keys[-1]] == "memory"
    read_back(s, keys)
    read_back(s, few)


def test_with_a_cap_ratio_of_zero_eviction_keeps_objects_in_memory_and_puts_fail(
    owner_on: Callable[..., tuple[Any, Path]],
) -> None:
    s, _ = owner_on(offload_on_evict=True, offload_cap_ratio=0.0, put_space_wait_ms=200)
    kept = []
    rc = 0
    for i in range(N):
        rc = s.put(f"z{i}", pattern(MiB, i))
        if rc != 0:
            break
        kept.append(f"z{i}")
    # Memory filled up and nothing could be queued for disk or dropped.
    assert rc == NO_AVAILABLE_HANDLE, rc
    assert 0 < len(kept) <= SEG // MiB
    assert disk_objects(s) == 0
    read_back(s, kept)


def test_with_force_evict_objects_past_the_cap_are_dropped_not_copied(
    owner_on: Callable[..., tuple[Any, Path]],
) -> None:
    s, d = owner_on(offload_on_evict=True, offload_force_evict=True, offload_cap_ratio=0.0)
    for i in range(N):
        assert put_retry(s, f"x{i}", pattern(MiB, i)) == 0, i
    assert disk_objects(s) == 0 and not buckets(d)
    exist = [s.is_exist(f"x{i}") for i in range(N)]
    assert exist[0] == 0 and exist[-1] == 1, exist
    for i, e in enumerate(exist):
        if e == 1:
            # Eviction may still be dropping the oldest meanwhile.
            v = s.get(f"x{i}")
            assert v == pattern(MiB, i) or (v == b"" and s.is_exist(f"x{i}") == 0), i


@pytest.mark.parametrize("disk_eviction", [True, False])
def test_enable_disk_eviction_decides_whether_a_full_tier_evicts_or_refuses(
    master_factory: Callable[..., Master],
    store_factory: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    disk_eviction: bool,
) -> None:
    cap = 12 * MiB
    monkeypatch.setenv("MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES", str(cap))
    monkeypatch.setenv("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "2")
    monkeypatch.setenv("MOONCAKE_OFFLOAD_BUCKET_DISK_SCAN_CACHE_MS", "0")
    root = tmp_path / "root"
    flags: dict[str, Any] = {"default_kv_lease_ttl": LEASE_MS, "root_fs_dir": str(root)}
    if not disk_eviction:
        flags["enable_disk_eviction"] = False
    m = master_factory(**flags)
    s = store_factory(m, global_segment_size=SEG)
    keys = fill(s, "t")
    d = root / "mooncake_cluster" / "owner-0"
    assert allocated(d) <= cap
    stats = s.get_client_stats()
    if disk_eviction:
        # The oldest copies made room for newer ones.
        assert stats["disk_evicted_buckets"] > 0, stats
        assert s.is_exist(keys[0]) == 0
    else:
        # The first copies are kept; later ones were refused.
        assert stats["disk_evicted_buckets"] == 0, stats
        assert stats["disk_failed_writes"] > 0, stats
        assert s.get(keys[0]) == pattern(MiB, 0)
    # Whatever is left reads back whole.
    for i, k in enumerate(keys):
        if s.is_exist(k) == 1:
            v = s.get(k)
            assert v == pattern(MiB, i) or (v == b"" and s.is_exist(k) == 0), k


@pytest.mark.parametrize("quota", [0, 12 * MiB])
def test_quota_bytes_caps_each_tier_under_root_fs_dir(
    master_factory: Callable[..., Master],
    store_factory: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    quota: int,
) -> None:
    monkeypatch.setenv("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "2")
    monkeypatch.setenv("MOONCAKE_OFFLOAD_BUCKET_DISK_SCAN_CACHE_MS", "0")
    root = tmp_path / "root"
    flags: dict[str, Any] = {"default_kv_lease_ttl": LEASE_MS, "root_fs_dir": str(root)}
    if quota:
        flags["quota_bytes"] = quota
    m = master_factory(**flags)
    s = store_factory(m, global_segment_size=SEG)
    keys = fill(s, "q")
    d = root / "mooncake_cluster" / "owner-0"
    stats = s.get_client_stats()
    if quota:
        # The oldest copies made room: the tier never holds more than the quota.
        assert allocated(d) <= quota
        assert stats["disk_evicted_buckets"] > 0, stats
        assert s.is_exist(keys[0]) == 0
    else:
        # 90% of the file system: every copy fits, the first reads back.
        assert stats["disk_evicted_buckets"] == 0, stats
        assert allocated(d) > 12 * MiB
        assert s.get(keys[0]) == pattern(MiB, 0)
    for i, k in enumerate(keys):
        if s.is_exist(k) == 1:
            v = s.get(k)
            assert v == pattern(MiB, i) or (v == b"" and s.is_exist(k) == 0), k


def test_by_default_reads_of_a_disk_copy_leave_it_on_disk(
    owner_on: Callable[..., tuple[Any, Path]],
) -> None:
    s, _ = owner_on()
    keys = fill(s, "n")
    assert kinds(s, keys[:1]) == {keys[0]: "disk"}
    for _ in range(4):
        assert s.get(keys[0]) == pattern(MiB, 0)
    assert not wait_until(lambda: kinds(s, keys[:1])[keys[0]] == "memory", 1.0)


def test_with_promotion_on_hit_a_disk_copy_read_twice_comes_back_to_memory(
    owner_on: Callable[..., tuple[Any, Path]],
) -> None:
    s, _ = owner_on(promotion_on_hit=True)
    keys = fill(s, "h")
    # Room for the promoted copy below the watermark.
    for k in keys[-8:]:
        assert s.remove(k, True) == 0
    first = keys[0]
    assert kinds(s, [first]) == {first: "disk"}
    assert s.get(first) == pattern(MiB, 0)
    assert s.get(first) == pattern(MiB, 0)  # the second read admits it
    assert wait_until(lambda: kinds(s, [first])[first] == "memory", 10.0)
    assert s.get(first) == pattern(MiB, 0)
    # Read once only: stays on disk.
    assert s.get(keys[1]) == pattern(MiB, 1)
    assert kinds(s, [keys[1]]) == {keys[1]: "disk"}


def test_unmount_local_disk_segment_drains_the_tier(
    owner_on: Callable[..., tuple[Any, Path]],
) -> None:
    """Upstream's ``unmount_local_disk_segment(grace_period_seconds)``: the
    owner's disk copies are forgotten (objects that lived only on its disk
    are gone, those still in memory stay readable), nothing more is written
    to its tier, and the call returns 0 after the grace period."""
    s, d = owner_on()
    keys = fill(s, "k")  # three segments' worth: most live on disk only
    # The last puts leave the segment above the high watermark (0.9 by
    # default): wait, through a count that grants no lease, for that
    # eviction pass to finish, so that the objects found in memory below
    # (whose lookups lease them) stay there while the tier is drained.
    below = int(0.9 * SEG) // MiB
    assert wait_until(lambda: s.get_client_stats()["ledger_entries"] <= below, 10.0)
    descs = s.batch_get_replica_desc(keys)
    mem_keys = [k for k in keys if any(r.is_memory_replica() for r in descs[k])]
    disk_only = [k for k in keys if k not in mem_keys]
    assert mem_keys and disk_only
    files = buckets(d)
    assert s.unmount_local_disk_segment(grace_period_seconds=1) == 0
    assert [s.is_exist(k) for k in disk_only] == [0] * len(disk_only)
    for k in mem_keys:
        assert s.get(k) == pattern(MiB, keys.index(k)), k
        assert not any(r.is_disk_replica() for r in s.get_replica_desc(k))
    # New puts are not written through; the files already there stay.
    before = disk_objects(s)
    assert put_retry(s, "after", pattern(MiB, 7)) == 0
    assert disk_objects(s) == before
    assert set(files) <= set(buckets(d))
    # Draining again is harmless, in each of upstream's call forms.
    assert s.unmount_local_disk_segment() == 0
    assert s.unmount_local_disk_segment(0) == 0


def test_unmount_local_disk_segment_without_a_tier_warns_and_returns_at_once(
    master_factory: Callable[..., Master], store_factory: Any, log: pytest.LogCaptureFixture
) -> None:
    m = master_factory()
    s = store_factory(m)
    assert s.unmount_local_disk_segment(grace_period_seconds=30) == 0
    assert any("no local disk segment to drain" in r.getMessage() for r in log.records)
