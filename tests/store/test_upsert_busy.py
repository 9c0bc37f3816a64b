"""Upsert of an object whose replica is being read returns -714 (spec §3.3).

A read is held in flight deterministically by stopping (SIGSTOP) the process
that owns the replica while a TCP reader copies from it: the reader's lookup
has been answered (the master counts it), its data request waits on the
stopped owner. Upserts from another client in that window must return
OBJECT_REPLICA_BUSY; once the read finishes they succeed again.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import Child, Master, StoreFactory, pattern, wait_until

MiB = 1 << 20
BUSY = -714
LOOKUPS = "master_get_replica_list_requests_total"


@pytest.mark.ours
def test_upsert_during_read_in_flight_is_busy(
    master: Master,
    store_factory: StoreFactory,
    child_factory: Callable[..., Child],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    size = 4 * MiB
    owner = child_factory({"MC_STORE_SAME_HOST": "off"})
    assert owner.setup(master) == 0
    assert owner.call("put_pattern", key="busy", size=size, seed=3) == 0

    # Pure clients in this process, reading over TCP from the owner.
    monkeypatch.setenv("MC_STORE_SAME_HOST", "off")
    reader = store_factory(master, global_segment_size=0)
    writer = store_factory(master, global_segment_size=0)
    dst = np.zeros(size, np.uint8)
    result: dict[str, Any] = {}

    def read() -> None:
        result["rc"] = reader.get_into("busy", int(dst.ctypes.data), size)

    before = master.metric(LOOKUPS) or 0
    os.kill(owner.pid, signal.SIGSTOP)
    try:
        t = threading.Thread(target=read)
        t.start()
        # The master records the reader in the same locked step that counts
        # the lookup, so once the counter moved the read is marked.
        assert wait_until(lambda: (master.metric(LOOKUPS) or 0) >= before + 1, 30)
        assert t.is_alive()
        assert writer.upsert("busy", pattern(size, 4)) == BUSY  # same size: in place
        assert writer.upsert("busy", b"other size") == BUSY  # would free the replica
        arr = np.frombuffer(pattern(size, 5), np.uint8)
        assert writer.upsert_from("busy", int(arr.ctypes.data), size) == BUSY
        # Upsert ignores leases, not reads: a plain put is still write-once.
        assert writer.put("busy", b"x") == 0
    finally:
        os.kill(owner.pid, signal.SIGCONT)
    t.join(60)
    assert not t.is_alive()
    assert result["rc"] == size
    assert dst.tobytes() == pattern(size, 3)

    # The reader reports its finished read; then upserts go through.
    assert wait_until(lambda: writer.upsert("busy", pattern(size, 6)) == 0, 10)
    assert writer.get("busy") == pattern(size, 6)


def test_upsert_after_own_read_is_not_busy(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    other = store_factory(master)
    assert s.put("k", b"v1") == 0
    for i in range(20):
        assert s.get("k") != b""
        # The same client's next RPC carries its finished reads first.
        assert s.upsert("k", f"v{i:02d}".encode()) == 0
    assert other.get("k") == b"v19"
    # Another client's finished read is reported promptly too.
    assert wait_until(lambda: s.upsert("k", b"after") == 0, 10)
    assert s.get("k") == b"after"
