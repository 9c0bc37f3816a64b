"""``batch_replica_clear(keys, segment_name="")``: the cases of upstream's
``mooncake-wheel/tests/test_batch_replica_clear.py`` against a real master
(lease 500 ms). As in upstream's master, a put grants no lease: a key is
leased by a read (``get``, ``is_exist``) until the lease runs out."""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import DEFAULT_LEASE_TTL_MS, Master, StoreFactory
from helpers.replicate import replicate_config

LEASE_S = DEFAULT_LEASE_TTL_MS / 1000 + 0.1


def _endpoints(store: Any, key: str) -> list[str]:
    return sorted(
        d.get_memory_descriptor().buffer_descriptor.transport_endpoint
        for d in store.get_replica_desc(key)
        if d.is_memory_replica()
    )


def test_expired_keys_are_cleared_and_gone(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    keys = [f"expired_{i}" for i in range(3)]
    for k in keys:
        assert s.put(k, b"test data for clear") == 0
        assert s.is_exist(k) == 1
    time.sleep(LEASE_S)
    cleared = s.batch_replica_clear(keys)
    assert isinstance(cleared, list)
    assert sorted(cleared) == sorted(keys)
    for k in keys:
        assert s.get(k) == b""
        assert s.is_exist(k) == 0


def test_leased_keys_are_skipped_and_kept(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    expired = ["mixed_expired_0", "mixed_expired_1"]
    active = ["mixed_active_0", "mixed_active_1"]
    for k in expired + active:
        assert s.put(k, b"mixed test data") == 0
    time.sleep(LEASE_S)
    for k in active:
        assert s.get(k) == b"mixed test data"  # a read leases the key
    cleared = s.batch_replica_clear(expired + active)
    assert sorted(cleared) == sorted(expired)
    for k in active:
        assert s.get(k) == b"mixed test data"


def test_empty_and_unknown_keys_clear_nothing(store: Any) -> None:
    assert store.batch_replica_clear([]) == []
    assert store.batch_replica_clear(["nonexistent_key_1", "nonexistent_key_2"]) == []
    assert store.batch_replica_clear([""]) == []


def test_own_segment_name_clears_and_another_name_does_not(
    store_factory: StoreFactory, master: Master
) -> None:
    s = store_factory(master)
    assert s.put("seg_self", b"segment name test data") == 0
    assert s.put("seg_other", b"invalid segment test") == 0
    time.sleep(LEASE_S)
    assert s.batch_replica_clear(["seg_other"], segment_name="nonexistent_host:99999") == []
    assert s.is_exist("seg_other") == 1
    time.sleep(LEASE_S)
    assert s.batch_replica_clear(["seg_self"], segment_name=s.get_hostname()) == ["seg_self"]
    assert s.is_exist("seg_self") == 0


def test_a_replicated_key_loses_only_the_named_segments_replica(
    store_factory: StoreFactory, master: Master
) -> None:
    main = store_factory(master)
    other = store_factory(master)
    data = b"specific segment clear test"
    assert main.put("rep", data, replicate_config(2)) == 0
    assert _endpoints(main, "rep") == sorted([main.get_hostname(), other.get_hostname()])
    time.sleep(LEASE_S)
    assert main.batch_replica_clear(["rep"], segment_name=main.get_hostname()) == ["rep"]
    assert _endpoints(other, "rep") == [other.get_hostname()]
    assert other.get("rep") == data
    # Clearing every segment removes the object.
    time.sleep(LEASE_S)
    assert main.batch_replica_clear(["rep"]) == ["rep"]
    assert other.is_exist("rep") == 0


def test_another_clients_keys_are_skipped(store_factory: StoreFactory, master: Master) -> None:
    writer = store_factory(master)
    stranger = store_factory(master)
    assert writer.put("mine", b"isolation test data") == 0
    assert writer.put("keep", b"isolation test data") == 0
    time.sleep(LEASE_S)
    assert stranger.batch_replica_clear(["mine"]) == []
    assert stranger.batch_replica_clear(["mine"], segment_name=writer.get_hostname()) == []
    assert writer.batch_replica_clear(["mine"]) == ["mine"]
    assert writer.is_exist("keep") == 1
    assert writer.get("keep") == b"isolation test data"


def test_a_store_not_set_up_clears_nothing_and_bad_types_raise() -> None:
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    assert s.batch_replica_clear(["k"]) == []
    with pytest.raises(TypeError):
        s.batch_replica_clear("k", segment_name=3)
