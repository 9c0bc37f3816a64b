"""EngramStore's ``replicate_config`` follows the store's write-config rules
(the same conversion and checks as the store's own write methods).

A non-empty ``preferred_segment`` replaces
``preferred_segments``; ``replica_num`` 0, a soft-pin TTL without
``SoftPinAction.ENABLE``, ``prefer_alloc_in_same_node`` on a byte write, and
``group_ids`` whose length is not the number of keys are rejected (-600),
so ``populate`` fails and writes nothing.
"""

from __future__ import annotations

import itertools
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conftest import Master, make_client
from mooncake.store import EngramStore, EngramStoreConfig, ReplicateConfig, SoftPinAction

VOCAB = [17, 19, 23, 29]
D = 8
_layers = itertools.count(500)


def tables() -> list[np.ndarray]:
    return [
        np.arange(n * D, dtype=np.float32).reshape(n, D) + 1000 * h for h, n in enumerate(VOCAB)
    ]


def layer(store: Any, rc: Any) -> Any:
    cfg = EngramStoreConfig(table_vocab_sizes=VOCAB, embedding_dim=D)
    return EngramStore(next(_layers), cfg, store, replicate_config=rc)


def endpoints(m: Master, key: str) -> set[str]:
    """Segments holding replicas of ``key``, from the master's admin server."""
    url = f"http://127.0.0.1:{m.metrics_port}/query_key?key={key}"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.loads(r.read())
    return {rep["transport_endpoint_"] for rep in body["data"]}


@pytest.fixture(scope="module")
def ratio_master() -> Iterator[Master]:
    """Second replicas go to the segment with the largest free ratio."""
    m = Master(lease_ms=500, extra=("--allocation_strategy=free_ratio_first",))
    yield m
    m.stop()


@pytest.mark.parametrize(
    "rc",
    [
        ReplicateConfig(soft_pin_ttl_ms=1000),
        ReplicateConfig(soft_pin_action=SoftPinAction.DISABLE, soft_pin_ttl_ms=5),
        ReplicateConfig(replica_num=0),
        ReplicateConfig(prefer_alloc_in_same_node=True),
        ReplicateConfig(group_ids=["g"]),
        ReplicateConfig(nof_replica_num=1),
    ],
    ids=["ttl-preserve", "ttl-disable", "replicas-0", "same-node", "group-ids-1", "nof"],
)
def test_invalid_config_fails_populate_and_writes_nothing(
    client: Any, rc: Any, caplog: pytest.LogCaptureFixture
) -> None:
    e = layer(client, rc)
    with (
        caplog.at_level("WARNING", logger="mooncake.store"),
        pytest.raises(RuntimeError, match="^populate failed$"),
    ):
        e.populate(tables())
    assert client.batch_is_exist(e.get_store_keys()) == [0] * len(VOCAB)
    reasons = [r.getMessage() for r in caplog.records if r.name == "mooncake.store"]
    assert any("EngramStore.populate" in m and "-600" in m for m in reasons), reasons


def test_valid_config_is_used(client: Any) -> None:
    rc = ReplicateConfig(
        soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=1000, group_ids=["g"] * len(VOCAB)
    )
    e = layer(client, rc)
    e.populate(tables())
    assert client.batch_is_exist(e.get_store_keys()) == [1] * len(VOCAB)
    e.remove_from_store(True)


def test_replicate_config_must_be_a_replicate_config(client: Any) -> None:
    with pytest.raises(TypeError):
        layer(client, {"replica_num": 2})
    assert layer(client, None).get_num_heads() == len(VOCAB)


def test_preferred_segment_replaces_preferred_segments(ratio_master: Master) -> None:
    a = make_client(ratio_master.addr, 64 << 20)
    b = make_client(ratio_master.addr, 64 << 20)
    c = make_client(ratio_master.addr, 64 << 20)
    try:
        # Half-fill b: among the segments a preference does not name, c (empty)
        # has the largest free ratio.
        fill = ReplicateConfig(preferred_segment=b.get_hostname())
        big = np.zeros(32 << 20, np.uint8)
        assert b.put_from("fill", big.ctypes.data, big.nbytes, fill) == 0
        assert endpoints(ratio_master, "fill") == {b.get_hostname()}
        rc = ReplicateConfig(replica_num=2)
        rc.preferred_segments = [b.get_hostname()]
        rc.preferred_segment = a.get_hostname()
        e = layer(a, rc)
        e.populate(tables())
        # The deprecated single preference wins: a, then the strategy's choice
        # (c), not the list's b.
        for key in e.get_store_keys():
            assert endpoints(ratio_master, key) == {a.get_hostname(), c.get_hostname()}, key
        # A store put with the same config places its replicas alike.
        assert a.put("same-rule", b"x", rc) == 0
        assert endpoints(ratio_master, "same-rule") == {a.get_hostname(), c.get_hostname()}
    finally:
        for s in (a, b, c):
            s.close()
