"""Object groups (``ReplicateConfig.group_ids``): a read of one member
leases every member, membership is fixed while the key exists, and bad
group lists are refused with nothing stored."""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import DEFAULT_LEASE_TTL_MS, Master, StoreFactory

LEASE_S = DEFAULT_LEASE_TTL_MS / 1000 + 0.1


def _grouped(ids: list[str]) -> Any:
    from mooncake.store import ReplicateConfig

    cfg = ReplicateConfig()
    cfg.group_ids = ids
    return cfg


def test_reading_one_member_leases_the_group(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    keys = ["req1-layer0", "req1-layer1", "req1-layer2"]
    assert s.put_batch(keys, [b"a" * 100, b"b" * 100, b"c" * 100], _grouped(["req1"] * 3)) == 0
    assert s.put("alone", b"x") == 0
    time.sleep(LEASE_S)
    assert s.get("req1-layer0") == b"a" * 100
    # The other members are leased by that read; a key outside is not.
    assert s.remove("req1-layer2") == -706
    assert s.remove("alone") == 0
    time.sleep(LEASE_S)
    assert s.batch_remove(keys) == [0, 0, 0]


def test_a_key_keeps_its_group_while_it_exists(store: Any) -> None:
    assert store.put("gk", b"v1", _grouped(["g1"])) == 0
    assert store.upsert("gk", b"v2", _grouped(["g2"])) == -600
    assert store.get("gk") == b"v1"
    assert store.upsert("gk", b"v3", _grouped(["g1"])) == 0
    assert store.upsert("gk", b"v4") == 0
    assert store.get("gk") == b"v4"


def test_bad_group_lists_are_refused_and_store_nothing(store: Any) -> None:
    assert store.put_batch(["x1", "x2"], [b"1", b"2"], _grouped(["g"])) == -600
    assert store.batch_is_exist(["x1", "x2"]) == [0, 0]
    from mooncake.store import ReplicateConfig

    cfg = ReplicateConfig()
    with pytest.raises(TypeError):
        cfg.group_ids = "g"  # type: ignore[assignment]
    with pytest.raises(TypeError):
        cfg.group_ids = [1, 2]  # type: ignore[list-item]
