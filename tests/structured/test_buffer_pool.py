"""``BufferPool`` with upstream's call forms (``mooncake.buffer_pool``,
``mooncake.BufferPool``, ``mooncake.store.BufferPool`` and the
``RegisteredBufferPool`` alias)."""

from __future__ import annotations

import gc
import threading
from typing import Any

import numpy as np
import pytest
from mooncake.buffer_pool import BufferPool, RegisteredBufferPool

MiB = 1 << 20


@pytest.fixture
def pstore(store_factory: Any) -> Any:
    return store_factory(global_segment_size=16 * MiB, local_buffer_size=4 * MiB)


def test_names_are_one_class() -> None:
    import mooncake
    import mooncake.store

    assert mooncake.BufferPool is BufferPool is RegisteredBufferPool is mooncake.store.BufferPool
    assert mooncake.RegisteredBufferPool is BufferPool
    assert mooncake.store.RegisteredBufferPool is BufferPool


def test_lease_reads_a_key_and_is_released(pstore: Any, key: Any) -> None:
    pstore.put(key("k"), b"hello pool")
    pool = BufferPool(pstore)
    with pool.buffer(1024 * 1024) as lease:
        n = pstore.get_into(key("k"), lease.ptr, lease.size)
        view = lease.buffer[:n]
        assert bytes(view) == b"hello pool"
        view.release()
    lease2 = pool.acquire(1234)
    lease2.buffer[:4] = b"abcd"
    assert bytes(lease2.buffer[:4]) == b"abcd"
    # Leases are registered: get_into_ranges accepts them.
    r = pstore.get_into_ranges([lease2.ptr], [[key("k")]], [[[0]]], [[[6]]], [[[4]]])
    assert r == [[[4]]] and bytes(lease2.buffer[:4]) == b"pool"
    lease2.release()
    lease2.release()
    with pytest.raises(RuntimeError, match="closed"):
        _ = lease2.ptr
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.acquire(1)


@pytest.mark.parametrize("size", [0, 1, 128 * 1024 + 1])
def test_arbitrary_sizes(pstore: Any, size: int) -> None:
    pool = BufferPool(pstore, 1024 * 1024, max_size_class=128 * 1024, alignment=4096)
    lease = pool.acquire(size)
    assert lease.size == size and len(lease.buffer) == size and lease.ptr % 4096 == 0
    lease.release()
    pool.close()


def test_overflow_when_the_local_buffer_is_full_and_limits(pstore: Any) -> None:
    pool = BufferPool(pstore)
    local = pool.acquire(4 * MiB)
    over = pool.acquire(1024, block=False)
    assert over.size == 1024
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.acquire(4 * MiB, block=False)
    with pytest.raises(RuntimeError, match="timed out"):
        pool.acquire(4 * MiB, timeout=0.05)
    with pytest.raises(RuntimeError, match="capacity"):
        pool.acquire((1 << 64) - 1)
    over.release()
    local.release()
    pool.close()


def test_max_regions_blocking_and_timeouts(pstore: Any) -> None:
    pool = BufferPool(
        pstore, min_size_class=4096, max_size_class=4096, alignment=4096, max_regions=1
    )
    lease = pool.acquire(1)
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(pool.acquire(1, timeout=10.0)))
    t.start()
    lease.release()
    t.join(timeout=10)
    assert not t.is_alive() and got[0].size == 1
    got[0].release()
    nb = BufferPool(pstore, max_regions=1, block_on_exhaustion=False)
    held = nb.acquire(1)
    with pytest.raises(RuntimeError, match="exhausted"):
        nb.acquire(1)
    with pytest.raises(RuntimeError, match="non-negative"):
        pool.acquire(1, timeout=-1.0)
    held.release()
    nb.close()
    pool.close()


def test_views_keep_the_lease_and_close_needs_no_active_leases(pstore: Any) -> None:
    pool = BufferPool(pstore, 4096, min_size_class=4096, alignment=4096)
    lease = pool.acquire(4)
    view = lease.buffer
    view[:] = b"test"
    assert bytes(view) == b"test"
    arr = np.frombuffer(view, dtype=np.uint8)
    with pytest.raises(RuntimeError, match="exported views"):
        lease.release()
    with pytest.raises(RuntimeError, match="active leases"):
        pool.close()
    del view, arr
    gc.collect()
    lease.release()
    dropped = pool.acquire(1)
    del dropped
    gc.collect()
    pool.close()


def test_bad_arguments(pstore: Any, store_factory: Any) -> None:
    with pytest.raises(RuntimeError, match="alignment"):
        BufferPool(pstore, 1024 * 1024, alignment=12345)
    no_local = store_factory(global_segment_size=16 * MiB, local_buffer_size=0)
    with pytest.raises(RuntimeError, match="local buffer"):
        BufferPool(no_local)
    from mooncake.store import MooncakeDistributedStore

    with pytest.raises(RuntimeError, match="not initialized"):
        BufferPool(MooncakeDistributedStore())
