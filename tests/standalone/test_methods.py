"""The store methods that used to answer -1012 NOT_SUPPORTED, each with its
upstream behaviour, on an in-process client and on a dummy client:

=============================  ===========================================
``setup_dummy``                 attaches to the host's daemon (0 / -1)
``alloc_from_mem_pool``         shared memory of a dummy's pool (addr / 0)
``put_from_with_metadata``      one object: metadata bytes, then data
``init_all``                    ``setup`` with upstream's fixed arguments
``allocate_and_mount_segment``  a segment more (in-process); -1 on a dummy
``unmount_segment``             [] -> 0; an id not mounted here -> -1
``unmount_and_free_segment``    as ``unmount_segment``
``unmount_local_disk_segment``  0 (no SSD tier to drain); -1 on a dummy
``get_offload_rpc_read_count``  0 (no SSD tier)
``get_tensor_into_cuda``        -600: needs CUDA, which this build lacks
``batch_get_tensor_into_cuda``  -600 per key, likewise
``get_replica_desc``            the key's replicas ([] when missing)
``batch_get_replica_desc``      {key: replicas} for the keys found
=============================  ===========================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import Daemon, Dummies

K = Callable[[str], str]


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="mooncake.store")
    return caplog


@pytest.fixture(params=["in_process", "dummy"])
def either(request: pytest.FixtureRequest, daemon: Daemon, dummies: Dummies) -> Any:
    if request.param == "dummy":
        return dummies(daemon)
    return request.getfixturevalue("store_factory")(daemon.master)


def test_put_from_with_metadata(either: Any, key: K) -> None:
    data = np.arange(1000, dtype=np.uint8)
    meta = np.array([42, 100], dtype=np.int32)
    k = key("m")
    # Upstream's doc example call, positionally and by keyword.
    rc = either.put_from_with_metadata(
        k, data.ctypes.data, meta.ctypes.data, data.nbytes, meta.nbytes
    )
    assert rc == 0
    assert either.get(k) == meta.tobytes() + data.tobytes()
    k2 = key("m2")
    rc = either.put_from_with_metadata(
        key=k2,
        buffer_ptr=data.ctypes.data,
        metadata_buffer_ptr=meta.ctypes.data,
        size=10,
        metadata_size=0,
        config=None,
    )
    assert rc == 0
    assert either.get(k2) == data[:10].tobytes()
    # size 0 stores nothing and returns 0 (upstream warns).
    assert either.put_from_with_metadata(key("m3"), data.ctypes.data, 0, 0, 0) == 0
    assert either.is_exist(key("m3")) == 0
    assert either.put_from_with_metadata("", data.ctypes.data, 0, 10, 0) == -600


def test_unmount_and_disk_tier_methods(either: Any, log: Any) -> None:
    dummy = either.get_hostname() == ""
    assert either.unmount_segment([]) == (-1 if dummy else 0)
    assert either.unmount_segment(["6f1c4e52-0000-0000-0000-000000000000"]) == -1
    assert either.unmount_and_free_segment(["x"], grace_period_seconds=3) == -1
    assert either.unmount_local_disk_segment() == (-1 if dummy else 0)
    assert either.unmount_local_disk_segment(grace_period_seconds=5) == (-1 if dummy else 0)
    assert either.get_offload_rpc_read_count() == 0
    # Adding a segment: an in-process client gets one; a dummy's daemon
    # owns the host's memory, so a dummy gets -1.
    r = either.allocate_and_mount_segment(1 << 20)
    if dummy:
        assert r == {"ret": -1, "segment_ids": [], "allocated_size": 0}
    else:
        assert r["ret"] == 0 and len(r["segment_ids"]) == 1, r
        assert either.unmount_and_free_segment(r["segment_ids"]) == 0
    lines = [r.getMessage() for r in log.records]
    if dummy:
        assert any("requires an in-process client" in m for m in lines)
    else:
        assert any("was not mounted by this client" in m for m in lines)
        assert any("no local disk segment to drain" in m for m in lines)


def test_cuda_ipc_reads_need_cuda(either: Any, log: Any, key: K) -> None:
    torch = pytest.importorskip("torch")
    t = torch.zeros(4)
    assert either.get_tensor_into_cuda(key("c"), t) == -600
    assert either.batch_get_tensor_into_cuda([key("a"), key("b")], [t, t]) == [-600, -600]
    assert either.batch_get_tensor_into_cuda([key("a")], [t, t]) == [-600]
    assert any("no CUDA support" in r.getMessage() for r in log.records)


def test_init_all(daemon: Daemon, store_factory: Any, log: Any) -> None:
    s = store_factory.raw()
    # Upstream's fixed metadata server is an etcd address where nothing
    # answers here, so setup fails as an upstream client's does.
    assert s.init_all("tcp", "", 16 * 1024 * 1024) == -1
    assert any("init_all" in r.getMessage() for r in log.records)
    ok = store_factory(daemon.master)
    assert ok.init_all("tcp", "", 16 * 1024 * 1024) == -600  # already set up
    assert ok.put("still-there", b"v") == 0


def test_alloc_from_mem_pool(daemon: Daemon, dummies: Dummies, key: K) -> None:
    s = dummies(daemon, mem_pool_size=1 << 20)
    p = s.alloc_from_mem_pool(65536)
    assert p != 0
    arr = np.frombuffer((np.ctypeslib.ctypes.c_uint8 * 65536).from_address(p), np.uint8)
    arr[:] = 9
    before = s.get_client_stats()["dummy_staged_bytes"]
    assert s.put_from(key("pool"), p, 65536) == 0
    assert s.get_client_stats()["dummy_staged_bytes"] == before
    assert s.get(key("pool")) == b"\x09" * 65536


def test_replica_descriptors(either: Any, daemon: Daemon, key: K, log: Any) -> None:
    from mooncake.store import MemoryDescriptor, ReplicaDescriptor, ReplicaStatus

    k, missing = key("r"), key("absent")
    value = b"x" * 4096
    assert either.put(k, value) == 0
    (desc,) = either.get_replica_desc(k)
    assert isinstance(desc, ReplicaDescriptor)
    assert desc.status == ReplicaStatus.COMPLETE
    assert desc.is_memory_replica()
    assert not desc.is_disk_replica() and not desc.is_local_disk_replica()
    mem = desc.get_memory_descriptor()
    assert isinstance(mem, MemoryDescriptor)
    assert mem.buffer_descriptor.size == len(value)
    assert mem.buffer_descriptor.buffer_address != 0
    # The daemon's segment holds it: its data endpoint is that segment's host.
    assert mem.buffer_descriptor.transport_endpoint.split(":")[0] == "127.0.0.1"
    with pytest.raises(RuntimeError, match="Expected DiskDescriptor"):
        desc.get_disk_descriptor()
    assert either.get_replica_desc(missing) == []
    assert any(
        "get_replica_desc" in r.getMessage() and missing in r.getMessage() for r in log.records
    )
    got = either.batch_get_replica_desc([k, missing])
    assert list(got) == [k]
    assert [d.get_memory_descriptor().buffer_descriptor.size for d in got[k]] == [len(value)]
    assert either.batch_get_replica_desc([]) == {}


def test_vllm_tier_log_classifies_replicas(either: Any, key: K) -> None:
    """vLLM's ``_classify_replica_tier`` over ``batch_get_replica_desc``."""
    keys = [key("t0"), key("t1")]
    for k in keys:
        assert either.put(k, b"kv") == 0
    descs_by_key = either.batch_get_replica_desc(keys + [key("gone")])
    tiers = {}
    for k in keys + [key("gone")]:
        descs = descs_by_key.get(k)
        if not descs:
            tiers[k] = "unknown"
        elif descs[0].is_memory_replica():
            tiers[k] = "memory"
        elif descs[0].is_disk_replica() or descs[0].is_local_disk_replica():
            tiers[k] = "disk"
        else:
            tiers[k] = "unknown"
    assert list(tiers.values()) == ["memory", "memory", "unknown"]
