"""Multi-buffer batches: batch_put_from_multi_buffers / batch_get_into_multi_buffers.

A key's value is the concatenation of its buffers. Round trips are byte-exact
for 1, 2 and 61 buffers per key of mixed sizes, and agree with the
single-buffer reads and writes of the same keys; bad input answers upstream's
codes per key (or for the whole call) with one log line per failing call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import Child, Master, StoreFactory, check_codes, pattern, ptr
from mooncake.store import ReplicateConfig

K = Callable[[str], str]
MiB = 1 << 20
GAP = 64
FILL = 0xA5

# Sizes cycled through to cut a value into buffers: odd sizes, page-sized,
# and a few large ones.
SIZE_CYCLE = [1, 4095, 4096, 65536 + 7, 17, 300_001, 64, 1 << 20, 3, 12_289]


def cut(total_buffers: int, start: int = 0) -> list[int]:
    return [SIZE_CYCLE[(start + i) % len(SIZE_CYCLE)] for i in range(total_buffers)]


class Scattered:
    """Buffers of given sizes inside one array, separated by guard gaps."""

    def __init__(self, sizes: list[int], fill: int = FILL) -> None:
        self.sizes = sizes
        self.arr = np.full(sum(sizes) + GAP * (len(sizes) + 1), fill, np.uint8)
        self.offs: list[int] = []
        at = GAP
        for n in sizes:
            self.offs.append(at)
            at += n + GAP

    @property
    def ptrs(self) -> list[int]:
        base = ptr(self.arr)
        return [base + o for o in self.offs]

    def load(self, data: bytes) -> None:
        assert len(data) == sum(self.sizes)
        at = 0
        for o, n in zip(self.offs, self.sizes, strict=True):
            self.arr[o : o + n] = np.frombuffer(data[at : at + n], np.uint8)
            at += n

    def joined(self) -> bytes:
        return b"".join(
            self.arr[o : o + n].tobytes() for o, n in zip(self.offs, self.sizes, strict=True)
        )

    def gaps_intact(self, fill: int = FILL) -> bool:
        mask = np.ones(self.arr.size, bool)
        for o, n in zip(self.offs, self.sizes, strict=True):
            mask[o : o + n] = False
        return bool(np.all(self.arr[mask] == fill))

    def untouched(self, fill: int = FILL) -> bool:
        return bool(np.all(self.arr == fill))


def put_values(store: Any, keys: list[str], splits: list[list[int]], seed: int) -> list[bytes]:
    """Write ``keys`` in one batch, key i cut into ``splits[i]``; the values."""
    values, bufs = [], []
    for i, sizes in enumerate(splits):
        data = pattern(sum(sizes), seed + i)
        b = Scattered(sizes)
        b.load(data)
        values.append(data)
        bufs.append(b)
    rcs = store.batch_put_from_multi_buffers(keys, [b.ptrs for b in bufs], [b.sizes for b in bufs])
    assert rcs == [0] * len(keys)
    return values


@pytest.mark.parametrize("count", [1, 2, 61])
def test_round_trip_is_byte_exact(store: Any, key: K, count: int) -> None:
    keys = [key(f"m{count}-{j}") for j in range(3)]
    splits = [cut(count, start=j) for j in range(3)]
    values = put_values(store, keys, splits, seed=count)
    # Same split.
    outs = [Scattered(s) for s in splits]
    rcs = store.batch_get_into_multi_buffers(keys, [o.ptrs for o in outs], [o.sizes for o in outs])
    assert rcs == [len(v) for v in values]
    for o, v in zip(outs, values, strict=True):
        assert o.joined() == v
        assert o.gaps_intact()
    # A different split of the same length.
    for k, v in zip(keys, values, strict=True):
        other = [len(v) // 3, len(v) - len(v) // 3] if len(v) > 1 else [1]
        o = Scattered([n for n in other if n > 0])
        assert store.batch_get_into_multi_buffers([k], [o.ptrs], [o.sizes]) == [len(v)]
        assert o.joined() == v and o.gaps_intact()


@pytest.mark.parametrize("count", [1, 2, 61])
def test_single_buffer_reads_of_multi_buffer_keys(store: Any, key: K, count: int) -> None:
    keys = [key(f"s{count}-{j}") for j in range(2)]
    values = put_values(store, keys, [cut(count, 3), cut(count, 7)], seed=40 + count)
    for k, v in zip(keys, values, strict=True):
        assert store.get(k) == v
        assert store.get_size(k) == len(v)
        out = np.zeros(len(v) + 10, np.uint8)
        assert store.get_into(k, ptr(out), out.nbytes) == len(v)
        assert out[: len(v)].tobytes() == v
    outs = [np.zeros(len(v), np.uint8) for v in values]
    assert store.batch_get_into(keys, [ptr(o) for o in outs], [o.nbytes for o in outs]) == [
        len(v) for v in values
    ]
    assert [o.tobytes() for o in outs] == values


@pytest.mark.parametrize("count", [1, 2, 61])
def test_multi_buffer_reads_of_single_buffer_keys(store: Any, key: K, count: int) -> None:
    sizes = cut(count, 5)
    data = pattern(sum(sizes), 70 + count)
    src = np.frombuffer(data, np.uint8).copy()
    k1, k2 = key("pf"), key("pb")
    assert store.put_from(k1, ptr(src), src.nbytes) == 0
    assert store.put(k2, data) == 0
    outs = [Scattered(sizes), Scattered(sizes)]
    rcs = store.batch_get_into_multi_buffers(
        [k1, k2], [o.ptrs for o in outs], [o.sizes for o in outs]
    )
    assert rcs == [len(data), len(data)]
    for o in outs:
        assert o.joined() == data and o.gaps_intact()


def test_batch_mixes_hits_and_misses(store: Any, key: K) -> None:
    [v] = put_values(store, [key("hit")], [[10, 20, 30]], seed=9)
    hit, miss = Scattered([10, 20, 30]), Scattered([60])
    rcs = store.batch_get_into_multi_buffers(
        [key("hit"), key("miss")], [hit.ptrs, miss.ptrs], [hit.sizes, miss.sizes]
    )
    assert rcs == [60, -704]
    assert hit.joined() == v
    assert miss.untouched()


def test_keywords_and_defaults(store: Any, key: K) -> None:
    k = key("kw")
    b = Scattered([100, 28])
    b.load(pattern(128, 1))
    cfg = ReplicateConfig()
    rcs = store.batch_put_from_multi_buffers(
        keys=[k], all_buffer_ptrs=[b.ptrs], all_sizes=[b.sizes], config=cfg
    )
    assert rcs == [0]
    o = Scattered([64, 64])
    rcs = store.batch_get_into_multi_buffers(
        keys=[k], all_buffer_ptrs=[o.ptrs], all_sizes=[o.sizes], prefer_alloc_in_same_node=True
    )
    assert rcs == [128]
    assert o.joined() == pattern(128, 1)
    # Positional flag, as upstream's documentation calls it.
    o2 = Scattered([128])
    assert store.batch_get_into_multi_buffers([k], [o2.ptrs], [o2.sizes], True) == [128]
    assert o2.joined() == pattern(128, 1)


def test_empty_batches(store: Any) -> None:
    assert store.batch_put_from_multi_buffers([], [], []) == []
    assert store.batch_get_into_multi_buffers([], [], []) == []


def test_existing_key_is_kept_and_duplicates_write_once(store: Any, key: K) -> None:
    k = key("dup")
    first, second = Scattered([3000]), Scattered([5000])
    first.load(pattern(3000, 1))
    second.load(pattern(5000, 2))
    rcs = store.batch_put_from_multi_buffers(
        [k, k], [first.ptrs, second.ptrs], [first.sizes, second.sizes]
    )
    assert rcs == [0, 0]
    assert store.get(k) == pattern(3000, 1)
    # Write-once: a second batch leaves the value alone and succeeds.
    assert store.batch_put_from_multi_buffers([k], [second.ptrs], [second.sizes]) == [0]
    assert store.get(k) == pattern(3000, 1)


# ---------------------------------------------------------------- bad input


def test_lists_of_different_lengths_fail_the_call(store: Any, key: K) -> None:
    b = Scattered([64])
    b.load(pattern(64, 3))
    ks = [key("a"), key("b")]
    assert store.batch_put_from_multi_buffers(ks, [b.ptrs], [b.sizes]) == [-600, -600]
    assert store.batch_put_from_multi_buffers(ks, [b.ptrs, b.ptrs], [b.sizes]) == [-600, -600]
    assert store.batch_is_exist(ks) == [0, 0]
    assert store.put(ks[0], pattern(64, 3)) == 0
    o = Scattered([64])
    assert store.batch_get_into_multi_buffers(ks, [o.ptrs], [o.sizes]) == [-600, -600]
    assert store.batch_get_into_multi_buffers(ks, [o.ptrs, o.ptrs], [o.sizes]) == [-600, -600]
    assert o.untouched()


def test_put_per_key_rules(store: Any, key: K) -> None:
    good = Scattered([100, 28])
    good.load(pattern(128, 4))
    flat = np.frombuffer(pattern(30, 5), np.uint8).copy()
    ks = [key("good"), key("zero"), key("none"), "", key("hole")]
    ptrs = [good.ptrs, [good.ptrs[0]], [], good.ptrs, [good.ptrs[0], ptr(flat)]]
    sizes = [good.sizes, [0], [], good.sizes, [0, 30]]
    rcs = store.batch_put_from_multi_buffers(ks, ptrs, sizes)
    # An empty buffer inside a key is skipped: "hole" stores flat's 30 bytes.
    assert rcs == [0, -600, -600, -600, 0]
    assert store.get(ks[0]) == pattern(128, 4)
    assert store.get(ks[4]) == pattern(30, 5)
    assert store.batch_is_exist(ks[1:3]) == [0, 0]


def test_put_key_with_mismatched_lists_fails_the_call(store: Any, key: K) -> None:
    good, two = Scattered([100, 28]), Scattered([10, 20])
    good.load(pattern(128, 4))
    ks = [key("g1"), key("inner"), key("g2")]
    rcs = store.batch_put_from_multi_buffers(
        ks, [good.ptrs, two.ptrs, good.ptrs], [good.sizes, [10], good.sizes]
    )
    assert rcs == [-600, -600, -600]
    assert store.batch_is_exist(ks) == [0, 0, 0]


@pytest.mark.ours
def test_null_pointers_are_refused(store: Any, key: K) -> None:
    b = Scattered([64, 64])
    b.load(pattern(128, 6))
    k = key("null")
    assert store.batch_put_from_multi_buffers([k], [[b.ptrs[0], 0]], [[64, 64]]) == [-600]
    assert store.is_exist(k) == 0
    assert store.batch_put_from_multi_buffers([k], [b.ptrs], [b.sizes]) == [0]
    o = Scattered([64, 64])
    assert store.batch_get_into_multi_buffers([k], [[o.ptrs[0], 0]], [[64, 64]]) == [-600]
    assert o.untouched()
    # A null pointer under an empty buffer is never touched: fine.
    three = [o.ptrs[0], 0, o.ptrs[1]]
    assert store.batch_get_into_multi_buffers([k], [three], [[64, 0, 64]]) == [128]
    assert o.joined() == pattern(128, 6)


@pytest.mark.ours
def test_get_inner_lists_and_empty_key(store: Any, key: K) -> None:
    k = key("inner")
    assert store.put(k, pattern(64, 7)) == 0
    o = Scattered([32, 32])
    rcs = store.batch_get_into_multi_buffers([k, ""], [o.ptrs, o.ptrs], [[64], o.sizes])
    assert rcs == [-600, -600]
    assert o.untouched()


def test_sizes_must_match_the_stored_length(store: Any, key: K) -> None:
    k = key("len")
    [v] = put_values(store, [k], [[3000, 5000]], seed=8)
    small, large, empty = Scattered([1000, 6000]), Scattered([3000, 5100]), Scattered([])
    assert store.batch_get_into_multi_buffers([k], [small.ptrs], [small.sizes]) == [-600]
    assert store.batch_get_into_multi_buffers([k], [large.ptrs], [large.sizes]) == [-800]
    assert store.batch_get_into_multi_buffers([k], [empty.ptrs], [empty.sizes]) == [-600]
    assert small.untouched() and large.untouched()
    # The object is intact and reads with matching sizes.
    ok = Scattered([4000, 4000])
    assert store.batch_get_into_multi_buffers([k], [ok.ptrs], [ok.sizes]) == [8000]
    assert ok.joined() == v


def test_same_node_hint_needs_one_replica(store: Any, key: K) -> None:
    b = Scattered([4096, 4096])
    b.load(pattern(8192, 9))
    cfg = ReplicateConfig()
    cfg.prefer_alloc_in_same_node = True
    cfg.replica_num = 2
    assert store.batch_put_from_multi_buffers([key("two")], [b.ptrs], [b.sizes], cfg) == [-600]
    assert store.is_exist(key("two")) == 0
    cfg.replica_num = 1
    assert store.batch_put_from_multi_buffers([key("one")], [b.ptrs], [b.sizes], cfg) == [0]
    assert store.get(key("one")) == pattern(8192, 9)


@pytest.mark.ours
def test_failures_log_one_line_each(store: Any, key: K, log: pytest.LogCaptureFixture) -> None:
    k, ks = key("logged"), [key("x"), key("y")]
    assert store.put(k, pattern(100, 12)) == 0
    b = Scattered([50, 50])
    cfg = ReplicateConfig()
    cfg.prefer_alloc_in_same_node = True
    cfg.replica_num = 2
    calls: list[tuple[Callable[[], list[int]], list[int], str]] = [
        (
            lambda: store.batch_put_from_multi_buffers(ks, [b.ptrs], [b.sizes]),
            [-600] * 2,
            "differ in length",
        ),
        (
            lambda: store.batch_get_into_multi_buffers(ks, [b.ptrs], [b.sizes]),
            [-600] * 2,
            "differ in length",
        ),
        (
            lambda: store.batch_put_from_multi_buffers([ks[0]], [b.ptrs], [[50]]),
            [-600],
            "has 2 buffer pointers but 1 sizes",
        ),
        (
            lambda: store.batch_get_into_multi_buffers([k], [b.ptrs], [[100]]),
            [-600],
            "2 buffer pointers but 1 sizes",
        ),
        (
            lambda: store.batch_put_from_multi_buffers([ks[0]], [[0]], [[8]]),
            [-600],
            "null buffer pointer",
        ),
        (
            lambda: store.batch_get_into_multi_buffers([k], [[0]], [[100]]),
            [-600],
            "null buffer pointer",
        ),
        (lambda: store.batch_put_from_multi_buffers([ks[0]], [[]], [[]]), [-600], "no bytes"),
        (
            lambda: store.batch_get_into_multi_buffers([k], [b.ptrs], [[50, 40]]),
            [-600],
            "less than the object",
        ),
        (
            lambda: store.batch_get_into_multi_buffers([k], [b.ptrs], [[50, 51]]),
            [-800],
            "add up to the stored length",
        ),
        (
            lambda: store.batch_get_into_multi_buffers([ks[1]], [b.ptrs], [b.sizes]),
            [-704],
            "OBJECT_NOT_FOUND",
        ),
        (
            lambda: store.batch_put_from_multi_buffers([ks[0]], [b.ptrs], [b.sizes], cfg),
            [-600],
            "replica_num 1",
        ),
    ]
    check_codes(log, calls)
    assert b.untouched(), "no failed read wrote into the buffers"
    assert store.batch_is_exist(ks) == [0, 0]


@pytest.mark.ours
def test_same_node_hint_places_on_own_segment(
    store_factory: StoreFactory, master: Master, key: K
) -> None:
    # Two segments: the hint puts every value on the writer's own one.
    store_factory(master)
    writer = store_factory(master)
    cfg = ReplicateConfig()
    cfg.prefer_alloc_in_same_node = True
    before = writer.get_client_stats()
    b = Scattered([1 << 16, 1 << 16])
    b.load(pattern(1 << 17, 10))
    ks = [key(f"own{i}") for i in range(8)]
    rcs = writer.batch_put_from_multi_buffers(ks, [b.ptrs] * 8, [b.sizes] * 8, cfg)
    assert rcs == [0] * 8
    after = writer.get_client_stats()
    assert after["bytes_written_local"] - before["bytes_written_local"] == 8 << 17


@pytest.mark.ours
def test_not_set_up(store_factory: StoreFactory) -> None:
    s = store_factory.raw()
    b = Scattered([8])
    assert s.batch_put_from_multi_buffers(["k"], [b.ptrs], [b.sizes]) == [-600]
    assert s.batch_get_into_multi_buffers(["k", "j"], [b.ptrs, b.ptrs], [[8], [8]]) == [-600, -600]
    assert b.untouched()


@pytest.mark.ours
def test_one_lookup_and_one_put_round_per_batch(store: Any, key: K) -> None:
    ks = [key(f"rpc{i}") for i in range(32)]
    before = store.get_client_stats()["master_rpcs"]
    put_values(store, ks, [cut(5, i) for i in range(32)], seed=11)
    mid = store.get_client_stats()["master_rpcs"]
    assert mid - before == 2  # PutStart + PutEnd
    outs = [Scattered(cut(5, i)) for i in range(32)]
    rcs = store.batch_get_into_multi_buffers(ks, [o.ptrs for o in outs], [o.sizes for o in outs])
    assert all(r > 0 for r in rcs)
    assert store.get_client_stats()["master_rpcs"] - mid == 1  # one replica lookup


# ---------------------------------------------------------------- across processes


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_cross_process_round_trip(
    master: Master, child_factory: Callable[..., Child], mode: str
) -> None:
    """Owner, writer and reader processes; same-host mapping or TCP."""
    owner = child_factory()
    peer = child_factory({"MC_STORE_SAME_HOST": mode})
    assert owner.setup(master) == 0
    assert peer.setup(master, global_segment_size=0) == 0
    sizes = cut(61, 2)
    # Written by the owner, read by the peer in different splits.
    assert owner.call("multi_put_pattern", key="o", sizes=sizes, seed=21) == 0
    total = sum(sizes)
    for split in (sizes, [total], [total // 2, total - total // 2]):
        r = peer.call("multi_check_pattern", key="o", sizes=split, seed=21)
        assert r == {"n": total, "match": True}
    # Written by the peer into the owner's segment, read back by the owner.
    home = owner.call("hostname")
    assert (
        peer.call("multi_put_pattern", key="p", sizes=sizes, seed=22, preferred_segment=home) == 0
    )
    assert owner.call("check_pattern", key="p", size=total, seed=22) == {"n": total, "match": True}
    r = owner.call("multi_check_pattern", key="p", sizes=list(reversed(sizes)), seed=22)
    assert r == {"n": total, "match": True}


@pytest.mark.ours
@pytest.mark.parametrize("mode", ["auto", "off"])
def test_one_data_request_per_owner_per_batch(
    master: Master,
    store_factory: StoreFactory,
    child_factory: Callable[..., Child],
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    """Without a token, a multi-buffer batch whose values live in two other
    processes' segments moves as one scatter/gather request per owner, for
    the write and for the read (TCP with the same-host mapping off; with it
    on, no TCP request at all), and every byte round-trips."""
    owners = [child_factory(), child_factory()]
    for o in owners:
        assert o.setup(master) == 0
    monkeypatch.setenv("MC_STORE_SAME_HOST", mode)
    s = store_factory(master, global_segment_size=0)
    keys = [f"one-req-{mode}-{i}" for i in range(8)]
    splits = [cut(61 if i % 2 else 2, i) for i in range(8)]
    homes = [o.call("hostname") for o in owners]
    values: list[bytes] = []
    before = s.get_client_stats()
    for h, half in zip(homes, (slice(0, 4), slice(4, 8)), strict=True):
        cfg = ReplicateConfig()
        cfg.preferred_segment = h
        ks, sp = keys[half], splits[half]
        bufs = [Scattered(x) for x in sp]
        for i, b in enumerate(bufs):
            data = pattern(sum(b.sizes), 70 + i + half.start)
            b.load(data)
            values.append(data)
        rcs = s.batch_put_from_multi_buffers(
            ks, [b.ptrs for b in bufs], [b.sizes for b in bufs], cfg
        )
        assert rcs == [0] * 4
    mid = s.get_client_stats()
    tcp = 1 if mode == "off" else 0
    assert mid["tcp_write_requests"] - before["tcp_write_requests"] == 2 * tcp
    outs = [Scattered(list(reversed(sp))) for sp in splits]
    rcs = s.batch_get_into_multi_buffers(keys, [o.ptrs for o in outs], [o.sizes for o in outs])
    assert rcs == [sum(sp) for sp in splits]
    after = s.get_client_stats()
    assert after["tcp_read_requests"] - mid["tcp_read_requests"] == 2 * tcp  # one per owner
    assert after["master_rpcs"] - mid["master_rpcs"] == 1
    assert [o.joined() for o in outs] == values
    assert all(o.gaps_intact() for o in outs)


@pytest.mark.ours
def test_batches_into_one_owner_with_a_cluster_token(
    token_owner: Callable[..., tuple[Master, Child]], store_factory: StoreFactory
) -> None:
    """With a cluster token every TCP write needs the master's ticket for its
    range: a batch whose values all land in one owner's segment (multi-buffer
    and single-buffer batch puts) is still written, one ticketed request per
    replica (a ticket covers one range), the owner reads every byte back, and
    a multi-buffer batch read from that owner is one TCP request."""
    m, owner = token_owner("kv batch token\n")
    s = store_factory(m, global_segment_size=0)
    keys = [f"tokmb{i}" for i in range(6)]
    splits = [cut(7, i) for i in range(6)]
    before = s.get_client_stats()
    values = put_values(s, keys, splits, seed=40)
    mid = s.get_client_stats()
    assert mid["tcp_write_requests"] - before["tcp_write_requests"] == len(keys)
    assert mid["bytes_written_tcp"] - before["bytes_written_tcp"] == sum(map(sum, splits))
    for i, (k, sizes) in enumerate(zip(keys, splits, strict=True)):
        r = owner.call("check_pattern", key=k, size=sum(sizes), seed=40 + i)
        assert r == {"n": sum(sizes), "match": True}
    single = [f"tokb{i}" for i in range(5)]
    sizes = [4096 * (i + 1) + i for i in range(5)]
    bufs = [np.frombuffer(pattern(n, 50 + i), np.uint8).copy() for i, n in enumerate(sizes)]
    assert s.batch_put_from(single, [ptr(b) for b in bufs], sizes) == [0] * 5
    assert s.get_client_stats()["tcp_write_requests"] - mid["tcp_write_requests"] == len(single)
    for i, (k, n) in enumerate(zip(single, sizes, strict=True)):
        assert owner.call("check_pattern", key=k, size=n, seed=50 + i) == {"n": n, "match": True}
    # Read back in other splits: one request for the batch, every byte.
    outs = [Scattered(list(reversed(sp))) for sp in splits]
    before = s.get_client_stats()
    rcs = s.batch_get_into_multi_buffers(keys, [o.ptrs for o in outs], [o.sizes for o in outs])
    assert rcs == [sum(sp) for sp in splits]
    after = s.get_client_stats()
    assert after["tcp_read_requests"] - before["tcp_read_requests"] == 1
    assert after["bytes_read_tcp"] - before["bytes_read_tcp"] == sum(map(sum, splits))
    assert [o.joined() for o in outs] == values
    assert all(o.gaps_intact() for o in outs)
