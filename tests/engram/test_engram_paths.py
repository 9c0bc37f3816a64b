"""EngramStore data paths and caching: tables owned by another process
(same-host mapping and forced TCP), row dedup on TCP, the location cache
(no master RPC per lookup), refresh after another client's changes, and
the GIL being released during a long lookup."""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import numpy as np
import pytest
from conftest import Master, make_client, owner_process
from helpers.engram_tables import IDS, VOCAB, D, expected, make_tables
from mooncake.store import EngramStore, EngramStoreConfig

_layers = itertools.count(500)


def cfg() -> Any:
    return EngramStoreConfig(table_vocab_sizes=VOCAB, embedding_dim=D)


OWNER_SCRIPT = """
import numpy as np
from mooncake.store import EngramStore, EngramStoreConfig
V = {vocab!r}
t = [np.arange(n * 8, dtype=np.float32).reshape(n, 8) + 1000 * h for h, n in enumerate(V)]
EngramStore({layer}, EngramStoreConfig(table_vocab_sizes=V, embedding_dim=8), client).populate(t)
"""


@pytest.fixture()
def owned_layer(master: Master) -> Iterator[int]:
    layer = next(_layers)
    p = owner_process(master.addr, OWNER_SCRIPT.format(vocab=VOCAB, layer=layer))
    yield layer
    assert p.stdin is not None
    p.stdin.close()
    p.wait(timeout=10)


def reader(master: Master, env: dict[str, str]) -> Any:
    """A client set up with ``env`` added to the environment (restored after)."""
    with mock.patch.dict(os.environ, env):
        return make_client(master.addr, segment=0)


def delta(client: Any, before: dict[str, int], name: str) -> int:
    return int(client.get_client_stats()[name]) - int(before[name])


OWNER_SCRIPT_OFFSET = OWNER_SCRIPT.replace("+ 1000 * h for", "+ 1000 * h + {offset} for")


@pytest.mark.parametrize("env", [{}, {"MC_STORE_SAME_HOST": "off"}], ids=["same-host", "tcp"])
def test_owner_death(env: dict[str, str]) -> None:
    """The process owning the tables dies: lookups fail at once with the
    plain error (no hang, no stale rows, ``out`` zeroed); once the master
    has expired the dead client (``--client_ttl=1``) its tables are gone,
    and after another process populates the layer again the reader's
    locations are refreshed to the new owner."""
    m = Master(lease_ms=500, extra=("--client_ttl=1",))
    layer = next(_layers)
    p = owner_process(m.addr, OWNER_SCRIPT_OFFSET.format(vocab=VOCAB, layer=layer, offset=0))
    c = reader(m, env)
    try:
        e = EngramStore(layer, cfg(), c)
        assert np.array_equal(e.lookup(IDS), expected(make_tables(), IDS))
        p.kill()
        p.wait(timeout=10)
        out = np.full((2, 2, 4, 8), 9.0, np.float32)
        for _ in range(2):
            with pytest.raises(RuntimeError) as ei:
                e.lookup_into(IDS, out)
            assert str(ei.value) == "EngramStore lookup failed"
            assert (out == 0).all()
        keys = e.get_store_keys()
        deadline = time.monotonic() + 60
        while list(c.batch_is_exist(keys)) != [0, 0, 0, 0]:
            assert time.monotonic() < deadline, "master never expired the dead owner"
            time.sleep(0.2)
        with pytest.raises(RuntimeError, match="^EngramStore lookup failed$"):
            e.lookup(IDS)
        p2 = owner_process(m.addr, OWNER_SCRIPT_OFFSET.format(vocab=VOCAB, layer=layer, offset=0.5))
        try:
            assert np.array_equal(e.lookup(IDS), expected(make_tables(0.5), IDS))
        finally:
            assert p2.stdin is not None
            p2.stdin.close()
            p2.wait(timeout=10)
    finally:
        c.close()
        if p.poll() is None:
            p.kill()
        m.stop()


@pytest.mark.parametrize("env", [{}, {"MC_STORE_SAME_HOST": "off"}], ids=["same-host", "tcp"])
def test_lookup_outlasting_lease_other_owner(
    master_tiny_lease: Master, env: dict[str, str]
) -> None:
    """1 ms lease, tables in another process: every lookup outlives its
    lease; none fails and the values stay exact."""
    layer = next(_layers)
    p = owner_process(master_tiny_lease.addr, OWNER_SCRIPT.format(vocab=VOCAB, layer=layer))
    c = reader(master_tiny_lease, env)
    try:
        e = EngramStore(layer, cfg(), c)
        rng = np.random.default_rng(5)
        ids = np.stack([rng.integers(0, n, (256, 8)) for n in VOCAB], axis=-1)
        for _ in range(20):
            assert np.array_equal(e.lookup(ids), expected(make_tables(), ids))
            assert np.array_equal(e.lookup(IDS), expected(make_tables(), IDS))
    finally:
        c.close()
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=10)


def test_same_host_path(master: Master, owned_layer: int) -> None:
    c = reader(master, {})
    try:
        e = EngramStore(owned_layer, cfg(), c)
        before = dict(c.get_client_stats())
        out = e.lookup(IDS)
        assert np.array_equal(out, expected(make_tables(), IDS))
        assert delta(c, before, "bytes_read_same_host") > 0
        assert delta(c, before, "bytes_read_tcp") == 0
    finally:
        c.close()


def test_tcp_path_dedup(master: Master, owned_layer: int) -> None:
    c = reader(master, {"MC_STORE_SAME_HOST": "off"})
    try:
        e = EngramStore(owned_layer, cfg(), c)
        e.lookup(IDS)
        before = dict(c.get_client_stats())
        out = e.lookup(np.zeros((256, 1, 4), np.int64))
        assert np.array_equal(out, expected(make_tables(), np.zeros((256, 1, 4), np.int64)))
        assert 0 < delta(c, before, "bytes_read_tcp") <= 4 * 8 * 4
        rng = np.random.default_rng(1)
        ids = np.stack([rng.integers(0, n, (32, 2)) for n in VOCAB], axis=-1)
        assert np.array_equal(e.lookup(ids), expected(make_tables(), ids))
    finally:
        c.close()


def test_cache_no_rpc_per_lookup(master_default_lease: Master) -> None:
    c = make_client(master_default_lease.addr)
    try:
        e = EngramStore(next(_layers), cfg(), c)
        e.populate(make_tables())
        e.lookup(IDS)
        before = dict(c.get_client_stats())
        ids = np.array(IDS)
        for _ in range(100):
            e.lookup(ids)
        assert delta(c, before, "master_rpcs") <= 1
    finally:
        c.close()


def test_refresh_sees_other_clients_changes(client_factory: Callable[..., Any]) -> None:
    a, b = client_factory(), client_factory()
    layer = next(_layers)
    ea, eb = EngramStore(layer, cfg(), a), EngramStore(layer, cfg(), b)
    ea.populate(make_tables())
    assert np.array_equal(eb.lookup(IDS), expected(make_tables(), IDS))
    assert ea.remove_from_store(True) == 4
    t2 = make_tables(0.5)
    ea.populate(t2)
    time.sleep(0.3)  # past lease_ttl/2 of the 500 ms lease
    assert np.array_equal(eb.lookup(IDS), expected(t2, IDS))


def test_gil_released_during_long_lookup(client_factory: Callable[..., Any]) -> None:
    """27b-scaled row width (16 heads, D=160), B=256, L=64 (longer if the
    lookup is too quick): a Python thread keeps running during the lookup.

    The interpreter's switch interval is raised to 100 s, so a thread
    holding the GIL is never asked to drop it, and the ticker yields the GIL
    at every ``time.sleep(0)``: the ticker can take a stamp while the lookup
    runs only if the lookup released the GIL (a held GIL gives none). Up to
    five attempts, since a busy 2-core machine may keep the ticker off the
    CPU for a whole lookup."""
    heads, rows, dim = 16, 16384, 160
    c = client_factory(segment=(heads * rows * dim * 4) + (64 << 20))
    e = EngramStore(
        next(_layers),
        EngramStoreConfig(table_vocab_sizes=[rows] * heads, embedding_dim=dim),
        c,
    )
    rng = np.random.default_rng(0)
    tables = [rng.standard_normal((rows, dim), dtype=np.float32) for _ in range(heads)]
    e.populate(tables)
    length = 64
    ids = rng.integers(0, rows, (256, length, heads))
    out = np.empty((256, length, heads, dim), np.float32)
    e.lookup_into(ids, out)
    t0 = time.perf_counter()
    e.lookup_into(ids, out)
    while time.perf_counter() - t0 < 0.1 and length < 1024:  # fast machine: more rows
        length *= 2
        ids = rng.integers(0, rows, (256, length, heads))
        out = np.empty((256, length, heads, dim), np.float32)
        e.lookup_into(ids, out)
        t0 = time.perf_counter()
        e.lookup_into(ids, out)
    stop = threading.Event()
    stamps: list[float] = []

    def ticker() -> None:
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0)  # yields the GIL

    counts: list[int] = []  # ticker stamps taken while the lookup ran
    old = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        for _ in range(5):
            stop.clear()
            stamps.clear()
            th = threading.Thread(target=ticker)
            th.start()
            time.sleep(0.02)
            t0 = time.perf_counter()
            r = e.lookup_into(ids, out)
            t1 = time.perf_counter()
            stop.set()
            th.join()
            assert r is out
            counts.append(sum(1 for x in stamps if t0 < x < t1))
            if counts[-1] > 0:
                break
    finally:
        sys.setswitchinterval(old)
    for h in (0, 7, 15):
        assert np.array_equal(out[:, :, h], tables[h][ids[..., h]])
    assert max(counts) >= 1, f"ticker stamps during each lookup: {counts}"
