"""Every store method of a dummy client, served by a real ``mooncake_client``
daemon: bytes, ``_from``/``_into`` with ``register_buffer``, batch forms,
ranges, sessions, multi-buffers, upserts, ``is_exist``, removals, tensors
and parallel tensors. Values round-trip byte-exact, the objects live in the
daemon's segment (the dummy has none), and payloads in shared memory reach
the daemon in place: the dummy's counters show no staging copy for them."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import Daemon, Dummies, MiB
from helpers.common import pattern, pattern_array
from mooncake.store import MooncakeHostMemAllocator, ReplicateConfig

K = Callable[[str], str]


class Shm:
    """Shared host memory from MooncakeHostMemAllocator, as numpy views."""

    def __init__(self) -> None:
        self.alloc = MooncakeHostMemAllocator()
        self.ptrs: list[int] = []

    def __call__(self, size: int) -> tuple[int, np.ndarray]:
        p = self.alloc.alloc(size)
        assert p != 0
        self.ptrs.append(p)
        return p, np.frombuffer((ctypes.c_uint8 * size).from_address(p), dtype=np.uint8)

    def free_all(self) -> None:
        for p in self.ptrs:
            self.alloc.free(p)


@pytest.fixture
def shm() -> Any:
    s = Shm()
    yield s
    s.free_all()


@pytest.fixture
def store(daemon: Daemon, dummies: Dummies) -> Any:
    return dummies(daemon)


def staged(s: Any) -> int:
    return int(s.get_client_stats()["dummy_staged_bytes"])


def test_a_dummy_has_no_segment_and_writes_into_the_daemons(
    store: Any, daemon: Daemon, key: K
) -> None:
    assert store.get_hostname() == ""  # upstream: a dummy client has no segment
    assert len(daemon.master.segments()) == 1
    k = key("where")
    assert store.put(k, pattern(4096)) == 0
    status, body = daemon.master.query_key(k)
    assert status == 200, body
    assert daemon.master.segments()[0] in str(body)
    assert store.health_check() == 0


def test_bytes_api(store: Any, key: K) -> None:
    a, b, c = key("a"), key("b"), key("c")
    va, vb = pattern(100_000, 1), pattern(3000, 2)
    assert store.put(a, va) == 0
    assert store.get(a) == va
    assert store.get(key=a) == va
    assert store.get_size(a) == len(va)
    assert store.is_exist(a) == 1
    assert store.is_exist(key("nope")) == 0
    assert store.put_parts(b, vb[:1000], vb[1000:]) == 0
    assert store.get(b) == vb
    assert store.put_batch([c, key("d")], [b"x" * 10, b"y" * 20]) == 0
    assert store.get_batch([a, c, key("nope")]) == [va, b"x" * 10, b""]
    assert store.batch_is_exist([a, key("nope"), c]) == [1, 0, 1]
    h = store.get_buffer(a)
    assert h is not None and bytes(memoryview(h)) == va
    hs = store.batch_get_buffer([b, key("nope")])
    assert hs[1] is None and bytes(memoryview(hs[0])) == vb
    # Upserts replace.
    assert store.upsert(a, b"new") == 0
    assert store.get(a) == b"new"
    assert store.upsert_parts(b, b"p", b"q") == 0
    assert store.get(b) == b"pq"
    assert store.upsert_batch([c], [b"zz"]) == 0
    assert store.get(c) == b"zz"
    # Write-once put of an existing key: 0, and the value is kept.
    assert store.put(c, b"other") == 0
    assert store.get(c) == b"zz"


def test_zero_copy_from_shared_memory_is_not_staged(store: Any, shm: Shm, key: K) -> None:
    p, v = shm(8 * MiB)
    assert store.register_buffer(p, 8 * MiB) == 0
    v[: 2 * MiB] = pattern_array(2 * MiB, 3)
    before = staged(store)
    k1, k2, k3 = key("z1"), key("z2"), key("z3")
    assert store.put_from(k1, p, MiB) == 0
    assert store.batch_put_from([k2, k3], [p + MiB, p + MiB + 4096], [4096, 8192]) == [0, 0]
    assert store.get_into(k1, p + 4 * MiB, MiB) == MiB
    assert (v[4 * MiB : 5 * MiB] == v[:MiB]).all()
    assert store.batch_get_into([k2, k3], [p + 6 * MiB, p + 7 * MiB], [MiB, MiB]) == [4096, 8192]
    assert (v[6 * MiB : 6 * MiB + 4096] == v[MiB : MiB + 4096]).all()
    assert (v[7 * MiB : 7 * MiB + 8192] == v[MiB + 4096 : MiB + 4096 + 8192]).all()
    assert store.upsert_from(k1, p + MiB, 1000) == 0
    assert store.batch_upsert_from([k2], [p], [500]) == [0]
    assert store.get(k1) == v[MiB : MiB + 1000].tobytes()
    assert store.get_size(k2) == 500
    # Everything above went in place: only get() staged its 1000 bytes.
    assert staged(store) - before == 1000
    assert store.unregister_buffer(p) == 0
    assert store.unregister_buffer(p) != 0


def test_buffers_unregistered_freed_or_allocated_again_between_calls(store: Any, key: K) -> None:
    """The daemon resolves each call's buffers afresh. A buffer unregistered
    between calls is still shared memory, read and written in place; memory
    freed and allocated again (often at the same address, with a new memfd
    behind it) gets the bytes of later calls, never the old mapping."""
    alloc = MooncakeHostMemAllocator()
    size, page = 4 * MiB, 64 * 1024
    keys = [key(f"again{i}") for i in range(4)]

    def view(p: int) -> np.ndarray:
        return np.frombuffer((ctypes.c_uint8 * size).from_address(p), dtype=np.uint8)

    p = alloc.alloc(size)
    assert p != 0
    assert store.register_buffer(p, size) == 0
    v = view(p)
    v[: 4 * page] = pattern_array(4 * page, 5)
    srcs = [p + i * page for i in range(4)]
    assert store.batch_put_from(keys, srcs, [page] * 4) == [0] * 4
    assert store.unregister_buffer(p) == 0
    before = staged(store)
    dsts = [p + MiB + i * page for i in range(4)]
    assert store.batch_get_into(keys, dsts, [page] * 4) == [page] * 4
    assert (v[MiB : MiB + 4 * page] == v[: 4 * page]).all()
    assert staged(store) == before
    want = v[: 4 * page].copy()
    for round_ in range(3):
        assert alloc.free(p) == 0
        p = alloc.alloc(size)
        assert p != 0
        v = view(p)
        assert not v.any()  # new memory: none of the old bytes
        if round_ % 2 == 0:
            assert store.register_buffer(p, size) == 0
        got = [p + 2 * MiB + i * page for i in range(4)]
        assert store.batch_get_into(keys, got, [page] * 4) == [page] * 4
        assert (v[2 * MiB : 2 * MiB + 4 * page] == want).all()
        # Writes read the new memory too.
        want = pattern_array(4 * page, 6 + round_)
        v[: 4 * page] = want
        assert (
            store.batch_upsert_from(keys, [p + i * page for i in range(4)], [page] * 4) == [0] * 4
        )
        assert store.get(keys[3]) == want[3 * page :].tobytes()
        if round_ % 2 == 0:
            assert store.unregister_buffer(p) == 0
    assert staged(store) - before == page * 3  # only get() staged its bytes
    assert alloc.free(p) == 0


def test_registering_maps_only_what_the_dummy_wrote(store: Any, daemon: Daemon, key: K) -> None:
    """Registering a buffer maps into the daemon only the pages the dummy
    has written: a pool nobody has filled yet commits no memory there (a
    read of an unwritten page of shared memory would allocate and zero it).
    The rest is mapped by the calls that use it."""
    assert daemon.proc is not None

    def daemon_shmem() -> int:
        with open(f"/proc/{daemon.proc.pid}/status") as f:  # type: ignore[union-attr]
            for line in f:
                if line.startswith("RssShmem:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no RssShmem line")

    alloc = MooncakeHostMemAllocator()
    size = 256 * MiB
    p = alloc.alloc(size)
    assert p != 0
    view = np.frombuffer((ctypes.c_uint8 * size).from_address(p), dtype=np.uint8)
    view[192 * MiB : 224 * MiB] = 7  # the dummy wrote 32 MiB of it
    before = daemon_shmem()
    assert store.register_buffer(p, size) == 0
    grown = daemon_shmem() - before
    assert 32 * MiB <= grown < 48 * MiB, grown
    # Written and unwritten pages both work in place.
    k1, k2 = key("written"), key("unwritten")
    assert store.put_from(k1, p + 192 * MiB, MiB) == 0
    assert store.put_from(k2, p, MiB) == 0
    assert store.get_into(k1, p + 8 * MiB, MiB) == MiB
    assert (view[8 * MiB : 9 * MiB] == 7).all()
    assert store.get_into(k2, p + 200 * MiB, MiB) == MiB
    assert not view[200 * MiB : 201 * MiB].any()
    assert store.unregister_buffer(p) == 0
    assert alloc.free(p) == 0


def test_other_memory_is_staged_and_still_correct(store: Any, key: K) -> None:
    src = pattern_array(3 * MiB, 4)
    dst = np.zeros(3 * MiB, np.uint8)
    k = key("plain")
    before = staged(store)
    assert store.put_from(k, src.ctypes.data, src.nbytes) == 0
    assert store.get_into(k, dst.ctypes.data, dst.nbytes) == src.nbytes
    assert (dst == src).all()
    assert staged(store) - before == 2 * src.nbytes
    # Memory outside shared memory cannot be registered (upstream: -1).
    assert store.register_buffer(dst.ctypes.data, dst.nbytes) == -1


def test_values_larger_than_the_local_buffer(daemon: Daemon, dummies: Dummies, key: K) -> None:
    s = dummies(daemon, local_buffer_size=64 * 1024)
    v = pattern(5 * MiB, 5)
    k = key("big")
    assert s.put(k, v) == 0
    assert s.get(k) == v
    assert s.get_batch([k, k]) == [v, v]


def test_multi_buffers(store: Any, shm: Shm, key: K) -> None:
    p, v = shm(4 * MiB)
    v[:MiB] = pattern_array(MiB, 6)
    k1, k2 = key("m1"), key("m2")
    rcs = store.batch_put_from_multi_buffers(
        [k1, k2], [[p, p + 4096], [p + 8192]], [[4096, 100], [300]], ReplicateConfig()
    )
    assert rcs == [0, 0]
    assert store.get(k1) == v[:4096].tobytes() + v[4096 : 4096 + 100].tobytes()
    got = store.batch_get_into_multi_buffers(
        [k1, k2], [[p + 2 * MiB, p + 3 * MiB], [p + 3 * MiB + 8192]], [[4000, 196], [300]]
    )
    assert got == [4196, 300]
    assert (v[2 * MiB : 2 * MiB + 4000] == v[:4000]).all()
    assert (v[3 * MiB : 3 * MiB + 96] == v[4000:4096]).all()
    assert (v[3 * MiB + 96 : 3 * MiB + 196] == v[4096:4196]).all()
    assert (v[3 * MiB + 8192 : 3 * MiB + 8492] == v[8192:8492]).all()
    # The client's list rules hold through the daemon.
    bad = store.batch_get_into_multi_buffers([k1], [[p, p + 100]], [[100]])
    assert bad[0] < 0


def test_get_into_ranges(store: Any, shm: Shm, key: K) -> None:
    p, v = shm(64)
    v[:] = ord("_")
    k1, k2 = key("r1"), key("r2")
    d1, d2 = b"0123456789ABCDEFGHIJ", b"abcdefghijklmnopqrst"
    assert store.put(k1, d1) == 0 and store.put(k2, d2) == 0
    assert store.register_buffer(p, 64) == 0
    r = store.get_into_ranges([p], [[k1, k2]], [[[0, 10], [20]]], [[[1, 5], [2]]], [[[4, 3], [5]]])
    assert r == [[[4, 3], [5]]]
    assert v[0:4].tobytes() == d1[1:5]
    assert v[10:13].tobytes() == d1[5:8]
    assert v[20:25].tobytes() == d2[2:7]
    assert v[4:10].tobytes() == b"______"
    # An unregistered destination fails its fragments, as in process.
    assert store.unregister_buffer(p) == 0
    r = store.get_into_ranges([p], [[k1]], [[[0]]], [[[0]]], [[[4]]])
    assert r[0][0][0] < 0


def test_sessions(store: Any, shm: Shm, key: K) -> None:
    layers, page = 4, 4096
    p, v = shm(2 * layers * page)
    v[: layers * page] = pattern_array(layers * page, 7)
    keys = [key("s1")]
    size = layers * page
    assert store.batch_put_session_start(keys, [size]) == [0]
    for layer in range(layers):
        rcs = store.batch_put_from_multi_buffer_ranges(
            keys, [[p + layer * page]], [[page]], [[layer * page]]
        )
        assert rcs == [page]
    assert store.batch_put_session_end(keys) == [0]
    assert store.get(keys[0]) == v[:size].tobytes()
    assert store.batch_get_session_start(keys) == [0]
    for layer in range(layers):
        rcs = store.batch_get_into_multi_buffer_ranges(
            keys, [[p + size + layer * page]], [[page]], [[layer * page]]
        )
        assert rcs == [page]
    assert store.batch_get_session_end(keys) == 0
    assert (v[size:] == v[:size]).all()
    # Revoke: the reservation goes, the key stays absent.
    k = [key("s2")]
    assert store.batch_put_session_start(k, [page]) == [0]
    assert store.batch_put_session_revoke(k) == [0]
    assert store.is_exist(k[0]) == 0


def test_removals(store: Any, key: K) -> None:
    ks = [key(f"rm{i}") for i in range(4)]
    for k in ks:
        assert store.put(k, b"v") == 0
    assert store.remove(ks[0], True) == 0
    assert store.is_exist(ks[0]) == 0
    assert store.batch_remove([ks[1], key("nope")], True)[0] == 0
    import re

    assert store.remove_by_regex("^" + re.escape(ks[2]) + "$", True) == 1
    assert store.batch_is_exist(ks) == [0, 0, 0, 1]


def test_put_from_with_metadata(store: Any, shm: Shm, key: K) -> None:
    p, v = shm(8192)
    v[:4096] = pattern_array(4096, 8)
    v[4096:4112] = np.arange(16, dtype=np.uint8)
    k = key("meta")
    assert store.put_from_with_metadata(k, p, p + 4096, 4096, 16) == 0
    assert store.get(k) == v[4096:4112].tobytes() + v[:4096].tobytes()
    assert store.put_from_with_metadata(key("empty"), p, p + 4096, 0, 16) == 0
    assert store.is_exist(key("empty")) == 0


def test_tensors(store: Any, key: K) -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(4096, dtype=torch.float32).reshape(64, 64)
    k = key("t")
    assert store.put_tensor(k, t) == 0
    assert torch.equal(store.get_tensor(k), t)
    ks = [key("t1"), key("t2")]
    ts = [torch.ones(10, dtype=torch.int64), torch.zeros(3, 5, dtype=torch.bfloat16)]
    assert store.batch_put_tensor(ks, ts) == [0, 0]
    got = store.batch_get_tensor(ks)
    assert all(torch.equal(a, b) for a, b in zip(got, ts, strict=True))
    assert store.upsert_tensor(k, t * 2) == 0
    assert torch.equal(store.get_tensor(k), t * 2)
    # _into a caller buffer (here plain memory: staged back).
    buf = torch.zeros(64 * 64 * 4 + 4096, dtype=torch.uint8)
    out = store.get_tensor_into(k, buf.data_ptr(), buf.numel())
    assert torch.equal(out, t * 2)
    # A large tensor (result pool) and a missing key.
    big = torch.randn(1024, 1024)
    assert store.put_tensor(key("big"), big) == 0
    assert torch.equal(store.get_tensor(key("big")), big)
    assert store.get_tensor(key("missing")) is None


def test_parallel_tensors(store: Any, key: K) -> None:
    torch = pytest.importorskip("torch")
    from mooncake.store import TP, ReadTarget, TensorParallelism

    t = torch.arange(64 * 8, dtype=torch.float32).reshape(64, 8)
    k = key("tp")
    assert store.put_tensor_with_tp(k, t, tp_size=4, split_dim=0) == 0
    for r in range(4):
        shard = store.get_tensor_with_tp(k, tp_rank=r, tp_size=4, split_dim=0)
        assert torch.equal(shard, t.chunk(4, 0)[r])
    k2 = key("par")
    for r in range(2):
        par = TensorParallelism([TP(r, 2, 1)])
        assert store.put_tensor_with_parallelism(k2, t.chunk(2, 1)[r], parallelism=par) == 0
    full = store.get_tensor_with_parallelism(k2, ReadTarget(mode="full"))
    assert torch.equal(full, t)
    shard = store.get_tensor_with_parallelism(
        k2, ReadTarget("shard", TensorParallelism([TP(1, 2, 1)]))
    )
    assert torch.equal(shard, t.chunk(2, 1)[1])
