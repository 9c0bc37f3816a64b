"""A small tmpfs for a test, and the disk-full nemesis on it.

:func:`mounted_tmpfs` mounts a tmpfs of a given size on a fresh directory
and unmounts it when the test ends (lazily, when a process still holds a
file in it); :func:`tmpfs_or_skip` does the same in a fixture, skipping
the test where no tmpfs can be mounted. :class:`Filler` fills it to its
last page with a file of its own (every later write that needs a page
fails with ``ENOSPC``), keeps it full while the processes writing there
free pages (:func:`full_for`), and deletes the file. :func:`disk_stats`
sums the disk-tier counters of store clients.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

MiB = 1 << 20
PAGE = 4096


def unavailable_reason() -> str | None:
    """Why a tmpfs cannot be mounted here (None when it can)."""
    if os.geteuid() != 0:
        return "needs root to mount a tmpfs (CI runs as root)"
    return None


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted on ``path`` (created), unmounted at
    the end even when the body fails."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    try:
        yield path
    finally:
        r = subprocess.run(["umount", str(path)], capture_output=True, timeout=30, check=False)
        if r.returncode != 0:
            # A process still holds a file there: detach it now, freed
            # once the last one closes.
            subprocess.run(["umount", "-l", str(path)], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def tmpfs_or_skip(path: Path, size: int, what: str) -> Iterator[Path]:
    """:func:`mounted_tmpfs`, or the test skipped (saying ``what`` is
    skipped and why) where no tmpfs can be mounted."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"{what} skipped: {reason}")
    with mounted_tmpfs(path, size) as d:
        yield d


class Filler:
    """A file that takes every free page of the file system of ``dir``."""

    def __init__(self, dir: Path, name: str = "filler") -> None:
        self.path = dir / name
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.top_up()

    def top_up(self) -> int:
        """Append to the file until a write fails with ``ENOSPC`` (pages the
        other writers freed meanwhile are taken); the bytes appended."""
        added = 0
        for size in (MiB, PAGE):
            chunk = bytes(size)
            while True:
                try:
                    n = os.write(self.fd, chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
                added += n
                if n < size:
                    break
        return added

    def remove(self) -> None:
        """Delete the file: its pages are free again."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.path.unlink(missing_ok=True)


def full_for(dir: Path, seconds: float, during: Callable[[], T]) -> T:
    """Keeps the file system of ``dir`` full for ``seconds`` (a
    :class:`Filler` topped up every 50 ms), returns what ``during()``
    answers at the end of that time, and deletes the filler."""
    filler = Filler(dir)
    try:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            time.sleep(0.05)
            filler.top_up()
        return during()
    finally:
        filler.remove()


DISK_COUNTERS = ("disk_bytes_written", "disk_failed_writes", "disk_bytes_read")


def disk_stats(holders: Iterable[Any]) -> dict[str, int]:
    """The disk-tier counters of ``get_client_stats`` (:data:`DISK_COUNTERS`),
    summed over store clients driven through ``call("stats")``."""
    out = dict.fromkeys(DISK_COUNTERS, 0)
    for h in holders:
        st = h.call("stats")
        for k in out:
            out[k] += int(st[k])
    return out
