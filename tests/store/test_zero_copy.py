"""Zero-copy API: register/unregister, put_from/get_into and batches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import Buffers, pattern, ptr

K = Callable[[str], str]
MiB = 1 << 20


def _fill(arr: np.ndarray, seed: int) -> bytes:
    data = pattern(arr.nbytes, seed)
    arr[:] = np.frombuffer(data, np.uint8)
    return data


def _rejected(call: Callable[[], Any]) -> bool:
    """A bad argument is rejected either by an exception or by a negative return."""
    try:
        rc = call()
    except (TypeError, OverflowError, ValueError):
        return True
    if isinstance(rc, list):
        return all(r < 0 for r in rc)
    return rc < 0


def test_register_overlap_and_unregister_twice(store: Any, buf: Buffers) -> None:
    a = buf(8192)
    p = ptr(a)
    assert store.register_buffer(p, 4096) == 0
    assert store.register_buffer(p + 1024, 4096) == -600
    assert store.unregister_buffer(p) == 0
    assert store.unregister_buffer(p) == -600


def test_unregister_not_region_start(store: Any, buf: Buffers) -> None:
    a = buf(8192)
    assert store.register_buffer(ptr(a), 8192) == 0
    assert store.unregister_buffer(ptr(a) + 64) == -600
    assert store.unregister_buffer(ptr(a)) == 0


def test_put_from_get_into_unregistered(store: Any, buf: Buffers, key: K) -> None:
    src, dst = buf(1 * MiB), buf(1 * MiB)
    data = _fill(src, 1)
    k = key("z")
    assert store.put_from(k, ptr(src), src.nbytes) == 0
    assert store.get_into(k, ptr(dst), dst.nbytes) == 1 * MiB
    assert dst.tobytes() == data
    assert store.get(k) == data


def test_put_from_get_into_registered(store: Any, buf: Buffers, key: K) -> None:
    src, dst = buf(64 * 1024), buf(64 * 1024)
    data = _fill(src, 2)
    assert store.register_buffer(ptr(src), src.nbytes) == 0
    assert store.register_buffer(ptr(dst), dst.nbytes) == 0
    k = key("r")
    assert store.put_from(k, ptr(src), src.nbytes) == 0
    assert store.get_into(k, ptr(dst), dst.nbytes) == src.nbytes
    assert dst.tobytes() == data
    assert store.unregister_buffer(ptr(src)) == 0
    assert store.unregister_buffer(ptr(dst)) == 0


def test_put_from_size_zero_stores_nothing(store: Any, buf: Buffers, key: K) -> None:
    a = buf(64)
    assert store.put_from(key("z0"), ptr(a), 0) == 0
    assert store.is_exist(key("z0")) == 0


def test_get_into_small_buffer(store: Any, buf: Buffers, key: K) -> None:
    k = key("s")
    data = pattern(1000, 4)
    assert store.put(k, data) == 0
    small = buf(999, fill=0xAB)
    assert store.get_into(k, ptr(small), small.nbytes) == -600
    assert bytes(small) == b"\xab" * 999  # untouched
    big = buf(4096, fill=0xCD)
    assert store.get_into(k, ptr(big), big.nbytes) == 1000
    assert big[:1000].tobytes() == data
    assert big[1000:].tobytes() == b"\xcd" * 3096


def test_get_into_missing(store: Any, buf: Buffers, key: K) -> None:
    a = buf(64)
    assert store.get_into(key("missing"), ptr(a), 64) == -704


@pytest.mark.parametrize("size", [-1, -4096], ids=["minus1", "minus4096"])
def test_negative_sizes_rejected(store: Any, buf: Buffers, key: K, size: int) -> None:
    a = buf(4096)
    k = key("neg")
    assert _rejected(lambda: store.put_from(k, ptr(a), size))
    assert _rejected(lambda: store.get_into(k, ptr(a), size))
    assert _rejected(lambda: store.batch_put_from([k], [ptr(a)], [size]))
    assert _rejected(lambda: store.register_buffer(ptr(a), size))
    assert store.is_exist(k) == 0


def test_oversize_put_from_rejected(store: Any, buf: Buffers, key: K) -> None:
    a = buf(4096)
    k = key("huge")
    # 1 TiB cannot be allocated in a 64 MiB segment: fails before touching memory.
    rc = store.put_from(k, ptr(a), 1 << 40)
    assert rc in (-200, -600)
    assert store.is_exist(k) == 0
    assert _rejected(lambda: store.put_from(k, ptr(a), 1 << 64))


def test_get_into_larger_declared_size(store: Any, buf: Buffers, key: K) -> None:
    k = key("small-obj")
    assert store.put(k, b"0123456789") == 0
    a = buf(4096)
    assert store.get_into(k, ptr(a), 4096) == 10
    assert a[:10].tobytes() == b"0123456789"


def test_batch_put_from_mismatch(store: Any, buf: Buffers, key: K) -> None:
    a = buf(256)
    a3, a4 = key("a3"), key("a4")
    assert store.batch_put_from([a3, a4], [ptr(a)], [100, 200]) == [-600, -600]
    assert store.batch_put_from([a3, a4], [ptr(a), ptr(a)], [100]) == [-600, -600]
    assert store.batch_is_exist([a3, a4]) == [0, 0]
    assert store.batch_put_from([], [], []) == []


def test_batch_put_from_zero_size_item(store: Any, buf: Buffers, key: K) -> None:
    a = buf(256)
    _fill(a, 5)
    k0, k1 = key("z0"), key("z1")
    rc = store.batch_put_from([k0, k1], [ptr(a), ptr(a)], [0, 128])
    assert rc[0] == -600
    assert rc[1] == 0
    assert store.get(k1) == a[:128].tobytes()


def test_batch_put_get_into(store: Any, buf: Buffers, key: K) -> None:
    n, size = 8, 32 * 1024
    src = buf(n * size)
    data = _fill(src, 6)
    keys = [key(f"b{i}") for i in range(n)]
    ptrs = [ptr(src) + i * size for i in range(n)]
    assert store.batch_put_from(keys, ptrs, [size] * n) == [0] * n
    dst = buf(n * size)
    dptrs = [ptr(dst) + i * size for i in range(n)]
    assert store.batch_get_into(keys, dptrs, [size] * n) == [size] * n
    assert dst.tobytes() == data


def test_batch_get_into_errors(store: Any, buf: Buffers, key: K) -> None:
    a, b = key("a"), key("b")
    assert store.put(a, b"A" * 100) == 0
    assert store.put(b, b"B" * 100) == 0
    d = buf(400, fill=0)
    p = ptr(d)
    assert store.batch_get_into([a, b], [p], [100, 100]) == [-600, -600]
    rc = store.batch_get_into([a, b, key("missing")], [p, p + 100, p + 200], [100, 50, 100])
    assert rc[0] == 100
    assert rc[1] == -600
    assert rc[2] < 0
    assert d[:100].tobytes() == b"A" * 100
    assert d[100:150].tobytes() == b"\x00" * 50


def test_upsert_from(store: Any, buf: Buffers, key: K) -> None:
    a = buf(4096)
    k = key("uf")
    d1 = _fill(a, 7)
    assert store.upsert_from(k, ptr(a), 4096) == 0
    assert store.get(k) == d1
    d2 = _fill(a, 8)
    assert store.upsert_from(k, ptr(a), 2048) == 0
    assert store.get(k) == d2[:2048]
    keys = [key("bu0"), key("bu1")]
    assert store.batch_upsert_from(keys, [ptr(a), ptr(a) + 1024], [1024, 1024]) == [0, 0]
    assert store.batch_upsert_from(keys, [ptr(a) + 2048, ptr(a)], [512, 512]) == [0, 0]
    assert store.get_batch(keys) == [d2[2048:2560], d2[:512]]
