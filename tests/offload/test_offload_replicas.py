"""Replica descriptors of offloaded objects: a key whose memory copy was
evicted to its owner's disk tier is listed as a local-disk replica (the
tier vLLM's store connector logs as "disk"); a key still in memory as a
memory replica."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Master
from test_offload import LEASE_MS, MiB, fill, setup_owner


@pytest.fixture
def owner(master_factory: Callable[..., Master], tmp_path: Path) -> Iterator[Any]:
    m = master_factory(default_kv_lease_ttl=LEASE_MS, enable_offload=True, client_ttl=2)
    d = tmp_path / "tier"
    d.mkdir()
    s, rc = setup_owner(m, d)
    assert rc == 0
    yield s
    with contextlib.suppress(Exception):
        s.close()


def test_evicted_objects_are_local_disk_replicas(owner: Any) -> None:
    keys = fill(owner, "d")
    descs = owner.batch_get_replica_desc(keys)
    assert sorted(descs) == sorted(keys)
    kinds = {}
    for k, ds in descs.items():
        assert ds, k
        first = ds[0]
        if first.is_memory_replica():
            assert first.get_memory_descriptor().buffer_descriptor.size == MiB
            kinds[k] = "memory"
        else:
            assert first.is_local_disk_replica() and not first.is_disk_replica(), k
            with pytest.raises(RuntimeError, match="Expected MemoryDescriptor"):
                first.get_memory_descriptor()
            kinds[k] = "disk"
    # Three times the segment was written: some keys live only on disk now,
    # and the latest ones are still in memory.
    assert "disk" in kinds.values() and "memory" in kinds.values(), kinds
