"""MC_STORE_PREFAULT: when a segment's pages are committed (ours, README env
table): in the background after setup by default, all at setup with ``on``,
on first write with ``off``.

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


def test_off_segment_is_lazy(master: Master, child_factory: Callable[..., Child]) -> None:
    lazy = child_factory({"MC_STORE_PREFAULT": "off"})
    assert lazy.setup(master, global_segment_size=SEG) == 0
    assert _rss_shmem(lazy.pid) < SEG // 2
    assert lazy.call("put_pattern", key="lz", size=24 * MiB, seed=6) == 0
    assert lazy.call("check_pattern", key="lz", size=24 * MiB, seed=6) == {
        "n": 24 * MiB,
        "match": True,
    }


def test_default_commits_segment_in_background(
    master: Master, child_factory: Callable[..., Child]
) -> None:
    import time

    for i, env in enumerate(({}, {"MC_STORE_PREFAULT": "background"})):
        child = child_factory(env)
        assert child.setup(master, global_segment_size=SEG) == 0
        # A write right after setup races the committer and is kept.
        assert child.call("put_pattern", key=f"bg{i}", size=24 * MiB, seed=7) == 0
        deadline = time.monotonic() + 60
        while _rss_shmem(child.pid) < SEG:
            assert time.monotonic() < deadline, "segment not committed in the background"
            time.sleep(0.05)
        assert child.call("check_pattern", key=f"bg{i}", size=24 * MiB, seed=7) == {
            "n": 24 * MiB,
            "match": True,
        }
