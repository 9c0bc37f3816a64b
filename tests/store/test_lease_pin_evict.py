"""Full store, eviction, hard and soft pins."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import Master, StoreFactory, wait_until
from mooncake.store import ReplicateConfig, SoftPinAction

MiB = 1 << 20
SEG = 16 * MiB


@pytest.fixture
def src() -> np.ndarray:
    arr = np.arange(MiB, dtype=np.uint32).astype(np.uint8)
    return arr


def _put(s: Any, key: str, arr: np.ndarray, cfg: Any = None) -> int:
    if cfg is None:
        return s.put_from(key, int(arr.ctypes.data), arr.nbytes)
    return s.put_from(key, int(arr.ctypes.data), arr.nbytes, cfg)


def _assert_holds(s: Any, key: str, want: np.ndarray) -> None:
    """``key`` reads back (``get_into``) as the MiB ``want``."""
    out = np.zeros(MiB, np.uint8)
    assert s.get_into(key, int(out.ctypes.data), MiB) == MiB
    assert out.tobytes() == want.tobytes()


def _random_mib(seed: int) -> np.ndarray:
    """A MiB of random bytes from ``seed`` (a writable array)."""
    return np.frombuffer(np.random.default_rng(seed).bytes(MiB), np.uint8).copy()


def _put_retry(s: Any, key: str, arr: np.ndarray, timeout: float = 2.0) -> int:
    """put_from, retrying -200 while the eviction thread frees space (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        rc = _put(s, key, arr)
        if rc != -200 or time.monotonic() >= deadline:
            return rc
        time.sleep(0.01)


def _fill_until_full(s: Any, arr: np.ndarray, prefix: str, limit: int = 40) -> list[str]:
    keys: list[str] = []
    for i in range(limit):
        k = f"{prefix}{i}"
        rc = _put(s, k, arr)
        if rc == -200:
            return keys
        assert rc == 0, (k, rc)
        keys.append(k)
    raise AssertionError(f"store never filled after {limit} puts")


def _full_store(
    store_factory: StoreFactory,
    master_factory: Callable[..., Master],
    src: np.ndarray,
    prefix: str,
    **master_flags: Any,
) -> tuple[Master, Any, list[str]]:
    """A master with ``master_flags`` and one client of a ``SEG`` segment,
    filled with MiB objects ``<prefix><i>`` until a put fails with -200."""
    m = master_factory(eviction_high_watermark_ratio=1.0, **master_flags)
    s = store_factory(m, global_segment_size=SEG)
    keys = _fill_until_full(s, src, prefix)
    assert len(keys) == SEG // MiB
    return m, s, keys


def test_full_store_without_eviction(
    store_factory: StoreFactory, master_factory: Callable[..., Master], src: np.ndarray
) -> None:
    _, s, keys = _full_store(store_factory, master_factory, src, "f", eviction_ratio=0.0)
    time.sleep(0.2)
    assert _put(s, "extra", src) == -200
    assert s.batch_is_exist(keys) == [1] * len(keys)
    assert s.remove(keys[0], True) == 0
    assert _put(s, "extra", src) == 0


def test_object_larger_than_store(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master, global_segment_size=SEG)
    big = np.zeros(2 * SEG, np.uint8)
    assert s.put_from("toobig", int(big.ctypes.data), big.nbytes) == -200
    assert s.is_exist("toobig") == 0


def test_eviction_frees_space(
    store_factory: StoreFactory, master_factory: Callable[..., Master], src: np.ndarray
) -> None:
    # Puts that find no room fail at once (no wait for the space eviction
    # frees): the -200 itself sets the eviction going.
    m, s, keys = _full_store(store_factory, master_factory, src, "e", put_space_wait_ms=0)
    full_at = time.monotonic()
    # The -200 sets the need-eviction flag; the eviction thread runs every
    # 10 ms, so unleased objects are gone within 100 ms. The
    # master's own counter is polled: is_exist would lease the objects.
    evicted_in_time = wait_until(
        lambda: (m.metric("master_evicted_key_count") or 0) >= 1, 0.1, interval=0.005
    )
    waited = time.monotonic() - full_at
    assert evicted_in_time, f"no eviction {waited * 1000:.0f} ms after the store filled"
    # The evicted replicas' space returns when the owner acknowledged the
    # forgets (a moment after the eviction): retry -200 until then (bounded).
    assert _put_retry(s, "later", src) == 0
    exist = s.batch_is_exist(keys)
    assert 0 < exist.count(0) < len(keys)
    evicted = m.metric("master_evicted_key_count")
    assert evicted is not None and evicted >= 1
    # survivors still hold their bytes
    survivor = keys[exist.index(1)]
    _assert_holds(s, survivor, src)


def test_a_put_into_a_full_store_waits_for_eviction_and_succeeds(
    store_factory: StoreFactory, master_factory: Callable[..., Master], src: np.ndarray
) -> None:
    # No watermark eviction: only puts that find no room evict, and each
    # waits (on the master) for the space it evicted instead of failing.
    m = master_factory(eviction_high_watermark_ratio=1.0)
    s = store_factory(m, global_segment_size=SEG)
    n = 3 * SEG // MiB
    for i in range(n):
        assert _put(s, f"p{i}", src) == 0, i
    exist = s.batch_is_exist([f"p{i}" for i in range(n)])
    assert 0 < exist.count(1) <= SEG // MiB
    assert exist[-1] == 1
    _assert_holds(s, f"p{n - 1}", src)


def test_high_watermark_eviction(
    store_factory: StoreFactory, master_factory: Callable[..., Master], src: np.ndarray
) -> None:
    m = master_factory(eviction_high_watermark_ratio=0.5, eviction_ratio=0.1)
    s = store_factory(m, global_segment_size=SEG)
    for i in range(12):  # 75 % of the segment
        assert _put_retry(s, f"w{i}", src) == 0
    assert wait_until(lambda: (m.metric("master_evicted_key_count") or 0) >= 1, 2.0)

    # An evicted replica's space returns once its owner acknowledged the
    # forget (its ledger no longer lists it), a moment after the eviction.
    def used() -> float:
        v = m.metric("master_allocated_bytes")
        return float(12 * MiB) if v is None else v

    assert wait_until(lambda: used() < 12 * MiB, 5.0), used()


def _churn(s: Any, src: np.ndarray, n: int) -> None:
    for i in range(n):
        rc = _put_retry(s, f"churn{i}", src)
        assert rc == 0, (i, rc)


def test_hard_pinned_never_evicted(
    store_factory: StoreFactory, master: Master, src: np.ndarray
) -> None:
    s = store_factory(master, global_segment_size=SEG)
    cfg = ReplicateConfig()
    cfg.with_hard_pin = True
    pinned = _random_mib(1)
    assert _put(s, "hard", pinned, cfg) == 0
    _churn(s, src, 3 * SEG // MiB)
    assert (master.metric("master_evicted_key_count") or 0) >= 1
    _assert_holds(s, "hard", pinned)


def test_soft_pinned_survives_while_unpinned_exist(
    store_factory: StoreFactory, master: Master, src: np.ndarray
) -> None:
    s = store_factory(master, global_segment_size=SEG)
    cfg = ReplicateConfig()
    cfg.soft_pin_action = SoftPinAction.ENABLE
    pinned = _random_mib(2)
    assert _put(s, "soft", pinned, cfg) == 0
    assert master.metric("master_soft_pin_key_count") == 1
    _churn(s, src, 2 * SEG // MiB)
    assert (master.metric("master_evicted_key_count") or 0) >= 1
    _assert_holds(s, "soft", pinned)


def test_leased_object_not_evicted(
    store_factory: StoreFactory, master_factory: Callable[..., Master], src: np.ndarray
) -> None:
    m = master_factory(eviction_high_watermark_ratio=1.0, default_kv_lease_ttl=60000)
    s = store_factory(m, global_segment_size=SEG)
    # Fill exactly (no -200 yet: a failed put flags eviction at once, which
    # could evict before the leases below are taken).
    keys = [f"l{i}" for i in range(SEG // MiB)]
    for k in keys:
        assert _put(s, k, src) == 0, k
    # Lease every object except the last one: it is the only eviction candidate.
    assert s.batch_is_exist(keys[:-1]) == [1] * (len(keys) - 1)
    assert wait_until(lambda: _put(s, "after", src) == 0, 0.5, interval=0.01)
    assert s.is_exist(keys[-1]) == 0
    assert s.batch_is_exist(keys[:-1]) == [1] * (len(keys) - 1)
