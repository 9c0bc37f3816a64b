"""SSD offload when writers outrun eviction: a put that finds memory full
while objects are being moved to disk waits (on the master, at most
``--put_space_wait_ms``) for their space instead of failing; with the disk
full too it fails with -200 NO_AVAILABLE_HANDLE and nothing acknowledged is
lost.

Upstream's ``test_ssd_offload_in_evict.py`` shape at a smaller scale: a
master with ``--root_fs_dir``, one plain client, four writer threads, 1 MiB
values, twice the segment's capacity in keys, every put returning 0 with no
retry, every value read back byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import Master
from helpers.common import pattern

MiB = 1 << 20
SEG = 32 * MiB
N = 2 * SEG // MiB  # twice the segment
WRITERS = 4
NO_AVAILABLE_HANDLE = -200


def run_writers(s: Any, plan: list[list[int]], values: list[bytes]) -> list[tuple[int, int]]:
    """Each thread puts its list of object indices (key ``w<i>``, value
    ``values[i]``) once; returns every ``(index, rc)``."""

    def writer(ids: list[int]) -> list[tuple[int, int]]:
        return [(i, s.put(f"w{i}", values[i])) for i in ids]

    with ThreadPoolExecutor(len(plan)) as pool:
        done = [pool.submit(writer, ids) for ids in plan]
        # A writer's exception is raised here.
        return [r for f in done for r in f.result()]


@pytest.mark.parametrize("keys", ["distinct", "shared"])
def test_writers_faster_than_eviction_all_succeed_and_read_back(
    master_factory: Callable[..., Master], store_factory: Any, tmp_path: Path, keys: str
) -> None:
    """``distinct``: each writer has its own quarter of the keys;
    ``shared``: every writer puts all the keys in the same order (upstream's
    test), so they race on each key."""
    root = tmp_path / "root"
    m = master_factory(root_fs_dir=str(root))
    s = store_factory(m, global_segment_size=SEG)
    if keys == "distinct":
        plan = [list(range(w, N, WRITERS)) for w in range(WRITERS)]
    else:
        plan = [list(range(N)) for _ in range(WRITERS)]
    # Made beforehand, so the writers only write (as fast as they can).
    values = [pattern(MiB, i) for i in range(N)]
    results = run_writers(s, plan, values)
    failed = [(i, rc) for i, rc in results if rc != 0]
    assert not failed, failed
    assert len(results) == sum(len(p) for p in plan)
    # Every value back, byte for byte; most of them from the disk tier.
    bad = [i for i in range(N) if s.get(f"w{i}") != values[i]]
    assert not bad, bad
    assert list((root / "mooncake_cluster" / "owner-0").glob("*.bucket"))


def test_with_the_disk_full_too_a_put_fails_with_no_available_handle_and_nothing_is_lost(
    master_factory: Callable[..., Master], store_factory: Any, tmp_path: Path
) -> None:
    """Memory holds 16 objects and the disk copies may hold 8: puts
    succeed until both are full, then fail with -200 (without waiting for
    space that is not coming back), and every acknowledged value reads back."""
    root = tmp_path / "root"
    m = master_factory(root_fs_dir=str(root), global_file_segment_size=8 * MiB)
    s = store_factory(m, global_segment_size=16 * MiB)
    acked: list[int] = []
    refused = 0
    for i in range(48):
        rc = s.put(f"d{i}", pattern(MiB, i))
        if rc == 0:
            acked.append(i)
        else:
            assert rc == NO_AVAILABLE_HANDLE, (i, rc)
            refused += 1
    assert refused > 0, "the puts never ran out of room"
    assert len(acked) >= 16, acked
    # Nothing acknowledged was dropped to make room.
    lost = [i for i in acked if s.get(f"d{i}") != pattern(MiB, i)]
    assert not lost, lost
    assert all(s.is_exist(f"d{i}") == 1 for i in acked)
    # Removing objects makes room again.
    for i in acked[-4:]:
        assert s.remove(f"d{i}", True) == 0
    assert s.put("after", pattern(MiB, 99)) == 0
    assert s.get("after") == pattern(MiB, 99)
