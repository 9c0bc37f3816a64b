"""MC_STORE_PREFAULT: a segment committed at setup (ours, README env table).

The variable is read once per process, so each case runs in a child client;
its shared-memory residency is read from /proc/<pid>/status.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from conftest import Child, Master

MiB = 1 << 20
SEG = 96 * MiB


def _rss_shmem(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssShmem line")


def test_prefault_commits_segment_at_setup(
    master: Master, child_factory: Callable[..., Child]
) -> None:
    committed = child_factory({"MC_STORE_PREFAULT": "on"})
    assert committed.setup(master, global_segment_size=SEG) == 0
    assert _rss_shmem(committed.pid) >= SEG
    # The committed segment stores and serves objects as usual.
    assert committed.call("put_pattern", key="pf", size=24 * MiB, seed=5) == 0
    assert committed.call("check_pattern", key="pf", size=24 * MiB, seed=5) == {
        "n": 24 * MiB,
        "match": True,
    }


def test_default_segment_is_lazy(master: Master, child_factory: Callable[..., Child]) -> None:
    lazy = child_factory({"MC_STORE_PREFAULT": "off"})
    assert lazy.setup(master, global_segment_size=SEG) == 0
    assert _rss_shmem(lazy.pid) < SEG // 2
    assert lazy.call("put_pattern", key="lz", size=24 * MiB, seed=6) == 0
    assert lazy.call("check_pattern", key="lz", size=24 * MiB, seed=6) == {
        "n": 24 * MiB,
        "match": True,
    }
