"""Removal, and the read leases that hold it off unless ``force=True``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from conftest import Master, StoreFactory

K = Callable[[str], str]


def test_remove_leased_needs_force(store: Any, key: K) -> None:
    k1 = key("k1")
    assert store.put(k1, b"hello") == 0
    assert store.get(k1) == b"hello"
    assert store.remove(k1) == -706
    assert store.get(k1) == b"hello"
    assert store.remove(k1, True) == 0
    assert store.remove(k1) == -704
    assert store.get(k1) == b""


def test_put_grants_no_lease(store: Any, key: K) -> None:
    k = key("p")
    assert store.put(k, b"x") == 0
    assert store.remove(k) == 0
    assert store.is_exist(k) == 0


def test_is_exist_grants_lease(store: Any, key: K) -> None:
    k = key("e")
    assert store.put(k, b"x") == 0
    assert store.is_exist(k) == 1
    assert store.remove(k) == -706


def test_batch_is_exist_grants_lease(store: Any, key: K) -> None:
    k = key("be")
    assert store.put(k, b"x") == 0
    assert store.batch_is_exist([k]) == [1]
    assert store.remove(k) == -706


def test_lease_expires(store_factory: StoreFactory, master_factory: Callable[..., Master]) -> None:
    m = master_factory(default_kv_lease_ttl=1000)
    s = store_factory(m)
    assert s.put("k", b"v") == 0
    assert s.get("k") == b"v"
    assert s.remove("k") == -706
    time.sleep(1.2)
    assert s.remove("k") == 0


def test_batch_remove(store: Any, key: K) -> None:
    b1 = key("b1")
    assert store.put(b1, b"x") == 0
    assert store.get(b1) == b"x"
    assert store.batch_remove([b1, key("missing")], True) == [0, -704]
    assert store.batch_remove([]) == []


def test_batch_remove_lease(store: Any, key: K) -> None:
    a, b = key("a"), key("b")
    assert store.put(a, b"x") == 0
    assert store.put(b, b"y") == 0
    assert store.get(a) == b"x"
    assert store.batch_remove([a, b]) == [-706, 0]


def test_remove_by_regex(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    assert s.remove_by_regex("(?i)x") == -600
    for k in ("abc", "xbcx", "b", "zzz"):
        assert s.put(k, k.encode()) == 0
    assert s.remove_by_regex("b", True) == 3
    assert s.batch_is_exist(["abc", "xbcx", "b", "zzz"]) == [0, 0, 0, 1]
    assert s.get("zzz") == b"zzz"


def test_remove_by_regex_invalid_pattern(store: Any) -> None:
    assert store.remove_by_regex("(unclosed") == -600


def test_remove_by_regex_skips_leased(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    for k in ("ra", "rb"):
        assert s.put(k, b"v") == 0
    assert s.get("ra") == b"v"
    assert s.remove_by_regex("^r") == 1
    assert s.batch_is_exist(["rb"]) == [0]
    assert s.remove_by_regex("^r", True) == 1


def test_remove_all(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    keys = ["x1", "x2", "x3"]
    for k in keys:
        assert s.put(k, b"v") == 0
    for k in keys:
        assert s.get(k) == b"v"
    assert s.remove_all() == 0
    assert s.remove_all(True) == 3
    assert s.get_batch(keys) == [b"", b"", b""]
    assert s.remove_all(True) == 0


def test_remove_all_unleased(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    for k in ("y1", "y2"):
        assert s.put(k, b"v") == 0
    assert s.remove_all() == 2
    assert s.batch_is_exist(["y1", "y2"]) == [0, 0]


def test_space_reusable_after_remove(
    store_factory: StoreFactory, master_factory: Callable[..., Master]
) -> None:
    import numpy as np

    # A full segment must not trigger watermark eviction in this test.
    m = master_factory(eviction_high_watermark_ratio=1.0)
    seg = 16 << 20  # upstream's minimum segment size
    s = store_factory(m, global_segment_size=seg, local_buffer_size=0)
    a = np.full(seg, 7, np.uint8)
    p = int(a.ctypes.data)
    for i in range(4):
        assert s.put_from(f"q{i}", p, seg // 4) == 0
    assert s.remove_all(True) == 4
    # The full segment must be allocatable again in one piece.
    assert s.put_from("whole", p, seg) == 0
    out = np.zeros(seg, np.uint8)
    assert s.get_into("whole", int(out.ctypes.data), seg) == seg
    assert out.tobytes() == a.tobytes()
