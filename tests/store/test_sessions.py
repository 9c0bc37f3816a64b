"""Put/get sessions and ranged multi-buffer transfers (layer-wise KV pools).

The flow real engines drive: ``batch_put_session_start(keys, sizes)`` → one
``batch_put_from_multi_buffer_ranges`` per layer at that layer's offset →
``batch_put_session_end`` (or ``batch_put_session_revoke``); and
``batch_get_session_start(keys)`` → one ``batch_get_into_multi_buffer_ranges``
per layer → ``batch_get_session_end``. Round trips are byte-exact with the
owner in this process, in a peer process over the same-host path, and over
TCP; codes for bad input are upstream 0.3.13's (probed with its wheel), each
with one log line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import Child, Master, StoreFactory, check_codes, ptr
from helpers.common import pattern_array
from mooncake.store import ReplicateConfig

K = Callable[[str], str]
KiB = 1 << 10
MiB = 1 << 20
LAYERS = 61
PAGE = 16 * KiB
LONG_LEASE_MS = 600_000


@pytest.fixture
def long_master(master_factory: Callable[..., Master]) -> Master:
    """A master whose leases outlive any test (get sessions never expire here)."""
    return master_factory(default_kv_lease_ttl=LONG_LEASE_MS)


@pytest.fixture
def long_store(long_master: Master, store_factory: StoreFactory) -> Any:
    """A store (64 MiB segment) on ``long_master``."""
    return store_factory(long_master)


# Each code test runs plainly, and (ours) checking one log line per failing call.
LOGGED = pytest.mark.parametrize("logged", [False, pytest.param(True, marks=pytest.mark.ours)])


class Pool:
    """A layer-first KV pool: ``layers`` x ``slots`` pages of ``page`` bytes."""

    def __init__(self, slots: int, layers: int = LAYERS, page: int = PAGE) -> None:
        self.layers, self.slots, self.page = layers, slots, page
        self.arr = np.zeros((layers, slots, page), np.uint8)
        self.base = ptr(self.arr)

    def addr(self, layer: int, slot: int) -> int:
        return self.base + (layer * self.slots + slot) * self.page

    def load(self, slot: int, value: np.ndarray) -> None:
        self.arr[:, slot, :] = value.reshape(self.layers, self.page)

    def value(self, slot: int) -> np.ndarray:
        return self.arr[:, slot, :].reshape(-1)

    def layer_args(self, layer: int, slots: list[int]) -> tuple[Any, Any, Any]:
        """(ptrs, sizes, offsets) of one layer for keys stored at ``slots``."""
        ptrs = [[self.addr(layer, s)] for s in slots]
        sizes = [[self.page] for _ in slots]
        offs = [[layer * self.page] for _ in slots]
        return ptrs, sizes, offs


def value_of(i: int, seed: int = 0, layers: int = LAYERS, page: int = PAGE) -> np.ndarray:
    return pattern_array(layers * page, seed + i)


def each_layer(call: Callable[..., Any], keys: list[str], pool: Pool, slots: list[int]) -> None:
    """One ranged ``call`` per layer of ``pool`` for ``keys`` stored at
    ``slots``; each moves one page per key."""
    for layer in range(pool.layers):
        rcs = call(keys, *pool.layer_args(layer, slots))
        assert rcs == [pool.page] * len(keys), (layer, rcs)


def session_write(store: Any, keys: list[str], pool: Pool, slots: list[int]) -> None:
    """Put session + one ranged write per layer + end, checking every code."""
    size = pool.layers * pool.page
    assert store.batch_put_session_start(keys, [size] * len(keys)) == [0] * len(keys)
    each_layer(store.batch_put_from_multi_buffer_ranges, keys, pool, slots)
    assert store.batch_put_session_end(keys) == [0] * len(keys)


def session_read(store: Any, keys: list[str], pool: Pool, slots: list[int]) -> None:
    """Get session + one ranged read per layer + end, checking every code."""
    assert store.batch_get_session_start(keys) == [0] * len(keys)
    each_layer(store.batch_get_into_multi_buffer_ranges, keys, pool, slots)
    assert store.batch_get_session_end(keys) == 0


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("owner", ["self", "peer-same-host", "peer-tcp"])
def test_layerwise_round_trip_is_byte_exact(
    long_master: Master,
    store_factory: StoreFactory,
    child_factory: Callable[..., Child],
    monkeypatch: pytest.MonkeyPatch,
    owner: str,
) -> None:
    """61 layers x 16 KiB per key, written and read one layer per call."""
    if owner != "self":
        peer = child_factory()
        assert peer.setup(long_master) == 0
        monkeypatch.setenv("MC_STORE_SAME_HOST", "auto" if owner == "peer-same-host" else "off")
    store = store_factory(long_master, global_segment_size=0 if owner != "self" else 64 * MiB)
    keys = [f"layered-{owner}-{i}" for i in range(4)]
    src_slots, dst_slots = [5, 0, 9, 2], [1, 7, 3, 8]
    src = Pool(slots=10)
    for i, s in enumerate(src_slots):
        src.load(s, value_of(i))
    size = LAYERS * PAGE
    session_write(store, keys, src, src_slots)
    for i, k in enumerate(keys):
        assert store.get(k) == value_of(i).tobytes()
    # Whole, as multi-buffer reads of 61 scattered pages each.
    out = Pool(slots=10)
    rcs = store.batch_get_into_multi_buffers(
        keys,
        [[out.addr(layer, s) for layer in range(LAYERS)] for s in dst_slots],
        [[PAGE] * LAYERS for _ in keys],
    )
    assert rcs == [size] * 4
    for i, s in enumerate(dst_slots):
        assert np.array_equal(out.value(s), value_of(i))
    # Per layer through a get session.
    out = Pool(slots=10)
    session_read(store, keys, out, dst_slots)
    for i, s in enumerate(dst_slots):
        assert np.array_equal(out.value(s), value_of(i))
    untouched = [s for s in range(10) if s not in dst_slots]
    assert not out.arr[:, untouched, :].any(), "no byte landed outside the read slots"


@pytest.mark.ours
def test_one_master_rpc_per_session_and_none_per_layer(
    long_master: Master, store_factory: StoreFactory
) -> None:
    """Start and end cost one RPC each; ranged calls go straight to the replicas."""
    store = store_factory(long_master)
    keys = [f"rpc-{i}" for i in range(3)]
    pool = Pool(slots=3)

    def rpcs() -> int:
        return int(store.get_client_stats()["master_rpcs"])

    r0 = rpcs()
    assert store.batch_put_session_start(keys, [LAYERS * PAGE] * 3) == [0] * 3
    r1 = rpcs()
    each_layer(store.batch_put_from_multi_buffer_ranges, keys, pool, [0, 1, 2])
    assert rpcs() == r1 == r0 + 1
    assert store.batch_put_session_end(keys) == [0] * 3
    r2 = rpcs()
    assert r2 == r1 + 1
    assert store.batch_get_session_start(keys) == [0] * 3
    r3 = rpcs()
    each_layer(store.batch_get_into_multi_buffer_ranges, keys, pool, [2, 1, 0])
    assert rpcs() == r3 == r2 + 1


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_peer_reads_layers_through_its_own_session(
    long_master: Master,
    store_factory: StoreFactory,
    child_factory: Callable[..., Child],
    mode: str,
) -> None:
    """Written layer-wise here, read layer-wise by another process."""
    store = store_factory(long_master)
    peer = child_factory({"MC_STORE_SAME_HOST": mode})
    assert peer.setup(long_master, global_segment_size=0) == 0
    keys = [f"peer-{mode}-{i}" for i in range(3)]
    src = Pool(slots=6)
    for i, s in enumerate([4, 1, 5]):
        src.load(s, value_of(i, seed=40))
    session_write(store, keys, src, [4, 1, 5])
    r = peer.call(
        "session_read_layers", keys=keys, layers=LAYERS, page=PAGE, seed=40, slots=[2, 0, 3]
    )
    assert r["start"] == [0, 0, 0]
    assert r["codes"] == [[PAGE] * 3] * LAYERS
    assert r["end"] == 0
    assert r["match"]


@pytest.mark.ours
def test_layers_into_a_tcp_owner_with_a_cluster_token(
    token_owner: Callable[..., tuple[Master, Child]], store_factory: StoreFactory
) -> None:
    """With a cluster token every TCP write needs the master's ticket for its
    replica's range: ranged writes inside the reserved objects carry it, and
    the owner reads every byte back."""
    m, owner = token_owner(
        "session token\n",
        default_kv_lease_ttl=LONG_LEASE_MS,
    )
    store = store_factory(m, global_segment_size=0)
    keys = [f"tok-{i}" for i in range(3)]
    src = Pool(slots=4)
    for i, slot in enumerate([3, 0, 2]):
        src.load(slot, value_of(i, seed=70))
    session_write(store, keys, src, [3, 0, 2])
    for i, k in enumerate(keys):
        r = owner.call("check_pattern", key=k, size=LAYERS * PAGE, seed=70 + i)
        assert r == {"n": LAYERS * PAGE, "match": True}
    out = Pool(slots=4)
    session_read(store, keys, out, [1, 2, 3])
    for i, slot in enumerate([1, 2, 3]):
        assert np.array_equal(out.value(slot), value_of(i, seed=70))
    assert store.get_client_stats()["bytes_written_tcp"] >= 3 * LAYERS * PAGE


def test_ranges_in_any_order_and_split(long_master: Master, store_factory: StoreFactory) -> None:
    """A key's ranges may come in any order, several per call, of any size."""
    store = store_factory(long_master)
    k = "split"
    data = pattern_array(10_000, 3)
    assert store.batch_put_session_start([k], [10_000]) == [0]
    # Three uneven pieces, last first, in one call; then the gap in a second call.
    p = ptr(data)
    assert store.batch_put_from_multi_buffer_ranges(
        [k], [[p + 9_000, p, p + 1]], [[1_000, 1, 4_999]], [[9_000, 0, 1]]
    ) == [6_000]
    assert store.batch_put_from_multi_buffer_ranges([k], [[p + 5_000]], [[4_000]], [[5_000]]) == [
        4_000
    ]
    assert store.batch_put_session_end([k]) == [0]
    assert store.get(k) == data.tobytes()
    out = np.zeros(10_000, np.uint8)
    o = ptr(out)
    assert store.batch_get_session_start([k]) == [0]
    assert store.batch_get_into_multi_buffer_ranges(
        [k, k], [[o + 7_000, o], [o + 100]], [[3_000, 100], [6_900]], [[7_000, 0], [100]]
    ) == [3_100, 6_900]
    assert store.batch_get_session_end([k]) == 0
    assert np.array_equal(out, data)


def test_reading_before_end_is_not_found(
    long_master: Master, store_factory: StoreFactory, key: K
) -> None:
    """A put session is invisible to readers (this and other clients) until it ends."""
    writer = store_factory(long_master)
    reader = store_factory(long_master)
    k = key("pending")
    data = pattern_array(4096, 1)
    out = np.zeros(4096, np.uint8)
    assert writer.batch_put_session_start([k], [4096]) == [0]
    assert writer.batch_put_from_multi_buffer_ranges([k], [[ptr(data)]], [[4096]], [[0]]) == [4096]
    for s in (writer, reader):
        assert s.is_exist(k) == 0
        assert s.batch_is_exist([k]) == [0]
        assert s.get(k) == b""
        assert s.get_into(k, ptr(out), 4096) == -703
        assert s.batch_get_session_start([k]) == [-703]
    # Another client cannot start a session of (or overwrite) the key meanwhile.
    assert reader.batch_put_session_start([k], [4096]) == [-705]
    assert writer.batch_put_session_end([k]) == [0]
    assert reader.get(k) == data.tobytes()


def test_revoke_frees_the_space(master: Master, store_factory: StoreFactory, key: K) -> None:
    store = store_factory(master, global_segment_size=32 * MiB)
    big = 20 * MiB
    data = pattern_array(big, 2)
    a, b = key("a"), key("b")
    assert store.batch_put_session_start([a], [big]) == [0]
    assert store.batch_put_from_multi_buffer_ranges([a], [[ptr(data)]], [[big]], [[0]]) == [big]
    # The reservation holds the space: a second value of the same size does not fit.
    assert store.put_from(b, ptr(data), big) == -200
    assert store.batch_put_session_revoke([a]) == [0]
    assert store.is_exist(a) == 0
    assert store.get(a) == b""
    # Hard-pinned: the eviction the failed put above asked for may run now.
    pinned = ReplicateConfig()
    pinned.with_hard_pin = True
    assert store.put_from(b, ptr(data), big, pinned) == 0
    out = np.zeros(big, np.uint8)
    assert store.get_into(b, ptr(out), big) == big
    assert np.array_equal(out, data)
    # A revoked key can be started again (here: no room until b goes).
    assert store.batch_put_session_start([a], [big]) == [-200]
    assert store.remove(b, True) == 0
    assert store.batch_put_session_start([a], [big]) == [0]
    assert store.batch_put_session_end([a]) == [0]
    assert store.get_size(a) == big


def test_end_without_writing_keeps_the_size(
    long_master: Master, store_factory: StoreFactory
) -> None:
    """Upstream does not check which bytes were written: end always commits."""
    store = store_factory(long_master)
    assert store.batch_put_session_start(["unwritten"], [4096]) == [0]
    assert store.batch_put_session_end(["unwritten"]) == [0]
    assert store.get_size("unwritten") == 4096
    assert len(store.get("unwritten")) == 4096


@pytest.mark.ours
def test_close_revokes_open_put_sessions(long_master: Master, store_factory: StoreFactory) -> None:
    a = store_factory(long_master)
    b = store_factory(long_master)
    assert a.batch_put_session_start(["left-open"], [4096]) == [0]
    assert b.batch_put_session_start(["left-open"], [4096]) == [-705]
    assert a.close() == 0
    assert b.batch_put_session_start(["left-open"], [4096]) == [0]
    assert b.batch_put_session_end(["left-open"]) == [0]
    assert b.get_size("left-open") == 4096


# ---------------------------------------------------------------- bad input


def range_misuses(
    call: Callable[..., Any], kind: str, absent: str, keys: list[str], p: int, two_ptr_size: int
) -> list[tuple[Callable[[], Any], Any, str | None]]:
    """The misuses a ranged ``call`` refuses alike for puts and gets, as
    ``(call, codes, reason)``: a key without a ``kind`` session, a range past
    the object, more pointers than sizes, lists of other lengths than ``keys``
    and a null pointer. ``keys[0]`` has a session of at least 4096 bytes."""
    k = keys[0]
    return [
        (lambda: call([absent], [[p]], [[16]], [[0]]), [-600], f"no {kind} session"),
        (lambda: call([k], [[p]], [[4096]], [[6000]]), [-600], "ends past the object"),
        (
            lambda: call([k], [[p, p]], [[two_ptr_size]], [[0]]),
            [-600],
            "2 buffer pointers, 1 sizes",
        ),
        (lambda: call(keys, [[p]], [[16]], [[0]]), [-600, -600], "differ in length"),
        (lambda: call([k], [[0]], [[16]], [[0]]), [-600], "null buffer pointer"),
    ]


@LOGGED
def test_put_session_codes(long_store: Any, log: pytest.LogCaptureFixture, logged: bool) -> None:
    """Upstream's codes; with ``logged``, one log line per failing call naming why."""
    store = long_store
    src = np.arange(8192, dtype=np.uint8)
    p = ptr(src)
    assert store.put("exists", b"x" * 100) == 0
    assert store.batch_put_session_start(["k1", "k2"], [4096, 8192]) == [0, 0]
    calls: list[tuple[Callable[[], Any], Any, str | None]] = [
        (lambda: store.batch_put_session_start(["exists"], [100]), [-705], "OBJECT_ALREADY_EXISTS"),
        (lambda: store.batch_put_session_start(["k1"], [4096]), [-600], "already exists"),
        (lambda: store.batch_put_session_start(["d", "d"], [10, 10]), [0, -705], "given twice"),
        (lambda: store.batch_put_session_start(["m1", "m2"], [10]), [-600, -600], "differ"),
        (lambda: store.batch_put_session_start(["z"], [0]), [-600], "size 0"),
        (lambda: store.batch_put_session_start([""], [10]), [-600], "empty key"),
        (lambda: store.batch_put_session_start([], []), [], None),
        *range_misuses(
            store.batch_put_from_multi_buffer_ranges, "put", "none", ["k2", "k1"], p, 4096
        ),
        (
            lambda: store.batch_put_from_multi_buffer_ranges(["k2"], [[]], [[]], [[]]),
            [-702],
            "no ranges",
        ),
        (lambda: store.batch_put_from_multi_buffer_ranges(["k2"], [[p]], [[0]], [[0]]), [0], None),
        (lambda: store.batch_put_from_multi_buffer_ranges([], [], [], []), [], None),
        (lambda: store.batch_put_session_end(["nosess"]), [-600], "no put session"),
        (lambda: store.batch_put_session_revoke(["nosess"]), [-600], "no put session"),
    ]
    check_codes(log, calls, logged)
    assert store.batch_put_from_multi_buffer_ranges(
        ["k1", "k2"], [[p], [p]], [[4096], [8192]], [[0], [0]]
    ) == [4096, 8192]
    # A repeated key gets its first answer; a second end has no session.
    assert store.batch_put_session_end(["k1", "k1", "k2"]) == [0, 0, 0]
    assert store.batch_put_session_end(["k1"]) == [-600]
    assert store.batch_put_session_revoke(["k2"]) == [-600]
    assert store.batch_put_from_multi_buffer_ranges(["k1"], [[p]], [[16]], [[0]]) == [-600]
    assert store.get("k1") == src[:4096].tobytes()
    assert store.get("k2") == src.tobytes()
    assert store.get("exists") == b"x" * 100
    assert store.batch_put_session_revoke(["d"]) == [0]
    # Last: a failed allocation may start an eviction (upstream's evicts "exists").
    assert store.batch_put_session_start(["huge"], [1 << 40]) == [-200]


@LOGGED
def test_get_session_codes(long_store: Any, log: pytest.LogCaptureFixture, logged: bool) -> None:
    """Upstream's codes; with ``logged``, one log line per failing call naming why."""
    store = long_store
    data = pattern_array(8192, 9)
    assert store.put_from("g", ptr(data), 8192) == 0
    assert store.batch_put_session_start(["pending"], [64]) == [0]
    out = np.full(8192, 0xA5, np.uint8)
    o = ptr(out)
    assert store.batch_get_session_start(["g", "missing", "pending", ""]) == [0, -704, -703, -704]
    calls: list[tuple[Callable[[], Any], Any, str | None]] = [
        (lambda: store.batch_get_session_start(["missing"]), [-704], "OBJECT_NOT_FOUND"),
        *range_misuses(
            store.batch_get_into_multi_buffer_ranges, "get", "missing", ["g", "g"], o, 16
        ),
        (lambda: store.batch_get_into_multi_buffer_ranges(["g"], [[o]], [[0]], [[0]]), [0], None),
        (lambda: store.batch_get_into_multi_buffer_ranges(["g"], [[]], [[]], [[]]), [0], None),
        (lambda: store.batch_get_into_multi_buffer_ranges([], [], [], []), [], None),
        (lambda: store.batch_get_session_end(["never", "started"]), 0, None),
        (lambda: store.batch_get_session_end([]), 0, None),
    ]
    check_codes(log, calls, logged)
    assert (out == 0xA5).all(), "no failed read wrote into the buffer"
    # While the session holds the key, a plain remove is refused.
    assert store.remove("g") == -706
    assert store.batch_get_into_multi_buffer_ranges(["g"], [[o]], [[8192]], [[0]]) == [8192]
    assert np.array_equal(out, data)
    assert store.batch_get_session_end(["g"]) == 0
    assert store.batch_get_into_multi_buffer_ranges(["g"], [[o]], [[16]], [[0]]) == [-600]
    assert store.batch_get_session_end(["g"]) == 0
    assert store.batch_put_session_revoke(["pending"]) == [0]


@pytest.mark.slow
def test_lease_expiry_ends_the_get_session(
    master_factory: Callable[..., Master], store_factory: StoreFactory
) -> None:
    m = master_factory(default_kv_lease_ttl=300)
    store = store_factory(m)
    data = pattern_array(4096, 4)
    out = np.zeros(4096, np.uint8)
    assert store.put_from("leased", ptr(data), 4096) == 0
    assert store.batch_get_session_start(["leased"]) == [0]
    time.sleep(0.6)
    assert store.batch_get_into_multi_buffer_ranges(["leased"], [[ptr(out)]], [[4096]], [[0]]) == [
        -707
    ]
    assert not out.any()
    # The expired session ended: the next ranged read has none.
    assert store.batch_get_into_multi_buffer_ranges(["leased"], [[ptr(out)]], [[4096]], [[0]]) == [
        -600
    ]
    assert store.remove("leased") == 0
    assert store.batch_get_session_start(["leased"]) == [-704]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["off", "auto"])
def test_owner_death_after_session_start_fails_with_a_code(
    master_factory: Callable[..., Master],
    store_factory: StoreFactory,
    child_factory: Callable[..., Child],
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    """The owner dies between get-session start and the ranged read: a code, no hang."""
    m = master_factory(client_ttl=60, default_kv_lease_ttl=LONG_LEASE_MS)
    owner = child_factory({"MC_STORE_SAME_HOST": mode})
    assert owner.setup(m) == 0
    assert owner.call("put_pattern", key="doomed", size=PAGE, seed=6, from_buffer=True) == 0
    monkeypatch.setenv("MC_STORE_SAME_HOST", mode)
    reader = store_factory(m, global_segment_size=0)
    out = np.zeros(PAGE, np.uint8)
    assert reader.batch_get_session_start(["doomed"]) == [0]
    owner.kill()
    rc = reader.batch_get_into_multi_buffer_ranges(["doomed"], [[ptr(out)]], [[PAGE]], [[0]])
    # Nothing was mapped from the owner before it died: the read needs the
    # dead process (its data server or mapping socket) and fails.
    assert rc == [-800]
    assert not out.any()


# ---------------------------------------------------------------- call forms


def test_upstream_call_forms(long_master: Master, store_factory: StoreFactory) -> None:
    """Each method positionally and with upstream's keywords."""
    store = store_factory(long_master)
    data = pattern_array(256, 8)
    out = np.zeros(256, np.uint8)
    p, o = ptr(data), ptr(out)
    assert store.batch_put_session_start(["f1"], [256]) == [0]
    assert store.batch_put_session_start(["f2"], [256], ReplicateConfig()) == [0]
    assert store.batch_put_session_start(keys=["f3"], sizes=[256], config=ReplicateConfig()) == [0]
    assert store.batch_put_session_start(keys=["f4"], sizes=[256]) == [0]
    assert store.batch_put_from_multi_buffer_ranges(["f1"], [[p]], [[256]], [[0]]) == [256]
    assert store.batch_put_from_multi_buffer_ranges(
        keys=["f2"], all_buffer_ptrs=[[p]], all_sizes=[[256]], all_dst_offsets=[[0]]
    ) == [256]
    assert store.batch_put_session_end(["f1"]) == [0]
    assert store.batch_put_session_end(keys=["f2"]) == [0]
    assert store.batch_put_session_revoke(["f3"]) == [0]
    assert store.batch_put_session_revoke(keys=["f4"]) == [0]
    assert store.batch_get_session_start(["f1"]) == [0]
    assert store.batch_get_session_start(keys=["f2"]) == [0]
    assert store.batch_get_into_multi_buffer_ranges(["f1"], [[o]], [[128]], [[0]]) == [128]
    assert store.batch_get_into_multi_buffer_ranges(
        keys=["f2"], all_buffer_ptrs=[[o + 128]], all_sizes=[[128]], all_src_offsets=[[128]]
    ) == [128]
    assert store.batch_get_session_end(["f1"]) == 0
    assert store.batch_get_session_end(keys=["f2"]) == 0
    assert np.array_equal(out, data)
    with pytest.raises(TypeError):
        store.batch_put_session_start(["x"], [1], ReplicateConfig(), "extra")
    with pytest.raises(TypeError):
        store.batch_get_into_multi_buffer_ranges(["x"], [[1]], [[1]])
