"""Byte-value API: put/get, parts, batches, upsert, BufferHandle, config."""

from __future__ import annotations

import array
from collections.abc import Callable
from typing import Any

import mooncake.store as ms
import numpy as np
import pytest
from conftest import Master, StoreFactory, pattern
from mooncake.store import ReplicateConfig, SoftPinAction

K = Callable[[str], str]
MiB = 1 << 20


# ---------------------------------------------------------------- put / get basics


def test_put_is_write_once(store: Any, key: K) -> None:
    k1 = key("k1")
    assert store.put(k1, b"hello") == 0
    assert store.put(k1, b"world!!") == 0
    assert store.get(k1) == b"hello"
    assert store.get_size(k1) == 5


def test_missing_key(store: Any, key: K) -> None:
    k1, missing = key("k1"), key("missing")
    assert store.put(k1, b"hello") == 0
    assert store.get(missing) == b""
    assert store.get_size(missing) == -704
    assert store.is_exist(missing) == 0
    assert store.batch_is_exist([k1, missing]) == [1, 0]
    assert store.batch_is_exist([]) == []


def test_empty_value_rejected(store: Any, key: K) -> None:
    assert store.put(key("e"), b"") == -600
    assert store.is_exist(key("e")) == 0


def test_empty_key_rejected(store: Any) -> None:
    assert store.put("", b"x") == -600


def test_put_parts(store: Any, key: K) -> None:
    pp = key("pp")
    assert store.put_parts(pp) == 0
    assert store.is_exist(pp) == 0
    assert store.put_parts(pp, b"ab", b"cd", memoryview(b"ef")) == 0
    assert store.get(pp) == b"abcdef"


@pytest.mark.parametrize(
    "value",
    [b"bytes-value", bytearray(b"bytearray-value"), memoryview(b"memoryview-value")],
    ids=["bytes", "bytearray", "memoryview"],
)
def test_buffer_protocol_values(store: Any, key: K, value: Any) -> None:
    k = key("v")
    assert store.put(k, value) == 0
    assert store.get(k) == bytes(value)


def test_numpy_uint8_value(store: Any, key: K) -> None:
    arr = np.frombuffer(pattern(1000, 3), np.uint8).copy()
    assert store.put(key("u8"), arr) == 0
    assert store.get(key("u8")) == arr.tobytes()


@pytest.mark.ours
def test_numpy_int32_value_stores_byte_image(store: Any, key: K) -> None:
    arr = np.arange(4, dtype=np.int32)
    assert store.put(key("n"), arr) == 0
    got = store.get(key("n"))
    assert len(got) == 16
    assert got == arr.tobytes()


@pytest.mark.ours
def test_non_contiguous_value_is_copied(store: Any, key: K) -> None:
    base = np.arange(64, dtype=np.uint8).reshape(8, 8)
    view = base[:, ::2]
    assert store.put(key("nc"), view) == 0
    assert store.get(key("nc")) == np.ascontiguousarray(view).tobytes()


@pytest.mark.parametrize("bad", [123, None, 1.5, ["a"]], ids=["int", "None", "float", "list"])
def test_non_buffer_value_raises_type_error(store: Any, key: K, bad: Any) -> None:
    with pytest.raises(TypeError):
        store.put(key("bad"), bad)
    assert store.is_exist(key("bad")) == 0


def test_non_str_key_raises_type_error(store: Any) -> None:
    with pytest.raises(TypeError):
        store.put(123, b"x")


def test_unicode_and_long_keys(store: Any, key: K) -> None:
    uni = key("ключ-鍵-🔑")
    long_key = key("L" * 10000)
    assert store.put(uni, b"u") == 0
    assert store.put(long_key, b"l") == 0
    assert store.get(uni) == b"u"
    assert store.get(long_key) == b"l"


def test_value_sizes_roundtrip(store: Any, key: K) -> None:
    for size in (1, 63, 64, 65, 4096, 1 * MiB + 7, 8 * MiB):
        data = pattern(size, size)
        k = key(f"s{size}")
        assert store.put(k, data) == 0, size
        assert store.get_size(k) == size
        assert store.get(k) == data, size


def test_get_positional_and_size_grants_lease(store: Any, key: K) -> None:
    k = key("gs")
    assert store.put(k, b"12345") == 0
    assert store.get_size(k) == 5
    assert store.remove(k) == -706


@pytest.mark.ours
def test_get_by_keyword(store: Any, key: K) -> None:
    k = key("kw")
    assert store.put(k, b"kwv") == 0
    assert store.get(key=k) == b"kwv"
    assert store.get_size(key=k) == 3
    assert store.is_exist(key=k) == 1
    assert store.get_batch(keys=[k]) == [b"kwv"]
    assert store.batch_is_exist(keys=[k]) == [1]


# ---------------------------------------------------------------- batches


def test_get_batch_empty_quirk(store: Any) -> None:
    assert store.get_batch([]) == [b""]


def test_put_batch_length_mismatch(store: Any, key: K) -> None:
    a, b = key("a"), key("b")
    assert store.put_batch([a, b], [b"x"]) == -600
    assert store.batch_is_exist([a, b]) == [0, 0]


def test_put_batch_empty(store: Any) -> None:
    assert store.put_batch([], []) == 0


def test_put_batch_and_get_batch(store: Any, key: K) -> None:
    keys = [key(f"b{i}") for i in range(5)]
    vals = [pattern(100 * (i + 1), i) for i in range(5)]
    assert store.put_batch(keys, vals) == 0
    assert store.get_batch(keys) == vals
    assert store.get_batch([keys[0], key("missing"), keys[4]]) == [vals[0], b"", vals[4]]


def test_put_batch_empty_value_writes_nothing(store: Any, key: K) -> None:
    a, b = key("a"), key("b")
    assert store.put_batch([a, b], [b"x", b""]) == -600
    assert store.batch_is_exist([a, b]) == [0, 0]


def test_put_batch_duplicate_keys_first_wins(store: Any, key: K) -> None:
    d = key("dup")
    assert store.put_batch([d, d], [b"first", b"second"]) == 0
    assert store.get(d) == b"first"


# ---------------------------------------------------------------- upsert


def test_upsert_replaces(store: Any, key: K) -> None:
    u = key("u")
    assert store.upsert(u, b"v1") == 0
    assert store.get(u) == b"v1"
    assert store.upsert(u, b"v2-longer") == 0
    assert store.get(u) == b"v2-longer"
    # upsert right after a read (leased object) still succeeds
    assert store.upsert(u, b"v3") == 0
    assert store.get(u) == b"v3"
    # same size: in place
    assert store.upsert(u, b"v4") == 0
    assert store.get(u) == b"v4"
    assert store.upsert(u, b"") == -600
    assert store.get(u) == b"v4"


def test_upsert_parts_and_batch(store: Any, key: K) -> None:
    u = key("up")
    assert store.upsert_parts(u, b"ab", b"c") == 0
    assert store.get(u) == b"abc"
    assert store.upsert_parts(u, b"xyz", memoryview(b"w")) == 0
    assert store.get(u) == b"xyzw"
    keys = [key("ub0"), key("ub1")]
    assert store.upsert_batch(keys, [b"0", b"1"]) == 0
    assert store.upsert_batch(keys, [b"00", b"11"]) == 0
    assert store.get_batch(keys) == [b"00", b"11"]
    assert store.upsert_batch(keys, [b"only-one"]) == -600


# ---------------------------------------------------------------- BufferHandle


def test_buffer_handle(store: Any, key: K) -> None:
    k = key("bh")
    value = pattern(5000, 9)
    assert store.put(k, value) == 0
    h = store.get_buffer(k)
    assert h is not None
    assert len(h) == h.size() == 5000
    assert h.ptr() != 0
    assert memoryview(h).tobytes() == value
    assert np.frombuffer(h, np.uint8).tobytes() == value
    assert store.remove(k, True) == 0
    assert store.get(k) == b""
    assert memoryview(h).tobytes() == value


def test_buffer_handle_format(store: Any, key: K) -> None:
    k = key("bhf")
    assert store.put(k, b"abc") == 0
    h = store.get_buffer(k)
    mv = memoryview(h)
    assert mv.ndim == 1 and mv.itemsize == 1 and mv.format == "b" and not mv.readonly


def test_get_buffer_missing(store: Any, key: K) -> None:
    assert store.get_buffer(key("nope")) is None


def test_batch_get_buffer(store: Any, key: K) -> None:
    a, b = key("a"), key("b")
    assert store.put(a, b"AAA") == 0
    hs = store.batch_get_buffer([a, key("missing"), a])
    assert len(hs) == 3
    assert hs[1] is None
    assert bytes(memoryview(hs[0])) == b"AAA"
    assert bytes(memoryview(hs[2])) == b"AAA"
    assert b  # unused second key kept for readability


# ---------------------------------------------------------------- local-buffer cap


def test_local_buffer_cap(store_factory: StoreFactory, shared_master: Master, key: K) -> None:
    s = store_factory(shared_master, local_buffer_size=1 * MiB)
    assert s.put(key("big"), pattern(2 * MiB)) == -600
    arr = np.frombuffer(pattern(4 * MiB, 1), np.uint8).copy()
    k = key("pf")
    assert s.put_from(k, int(arr.ctypes.data), arr.nbytes) == 0
    assert s.get(k) == b""
    assert s.get_buffer(k) is None
    out = np.zeros(4 * MiB, np.uint8)
    assert s.get_into(k, int(out.ctypes.data), out.nbytes) == 4194304
    assert out.tobytes() == arr.tobytes()


def test_zero_local_buffer(store_factory: StoreFactory, shared_master: Master, key: K) -> None:
    s = store_factory(shared_master, local_buffer_size=0)
    assert s.put(key("z"), b"abc") == -600
    assert s.is_exist(key("z")) == 0


# ---------------------------------------------------------------- ReplicateConfig


def test_replicate_config_str_default() -> None:
    assert str(ReplicateConfig()) == (
        "ReplicateConfig: { replica_num: 1, nof_replica_num: 0, dfs_replica_num: 0, "
        "soft_pin_action: PRESERVE, soft_pin_ttl_ms: default, with_hard_pin: 0, "
        "preferred_segments: [], preferred_nof_segments: [], prefer_alloc_in_same_node: 0, "
        "data_type: UNKNOWN }"
    )


def test_replicate_config_fields() -> None:
    c = ReplicateConfig()
    assert c.replica_num == 1
    assert c.with_hard_pin is False
    assert c.preferred_segments == []
    assert c.preferred_segment == ""
    assert c.prefer_alloc_in_same_node is False
    c.preferred_segments = ["a:1"]
    c.preferred_segments.append("b:2")
    assert c.preferred_segments == ["a:1"]
    with pytest.raises(TypeError):
        c.replica_num = -1
    with pytest.raises(TypeError):
        c.soft_pin_ttl_ms = -1


def test_soft_pin_action_enum() -> None:
    e = SoftPinAction(1)
    assert e == SoftPinAction.ENABLE
    assert e != 1
    assert str(e) == "SoftPinAction.ENABLE"
    assert int(SoftPinAction.PRESERVE) == 0 and int(SoftPinAction.DISABLE) == 2
    assert not hasattr(ms, "ENABLE")


def test_object_data_type_exported() -> None:
    assert int(ms.KVCACHE) == 1
    assert ms.ObjectDataType.GENERAL == ms.GENERAL
    assert int(ms.ObjectDataType.METADATA) == 8


def test_public_names_importable() -> None:
    for name in (
        "MooncakeDistributedStore",
        "ReplicateConfig",
        "EngramStore",
        "EngramStoreConfig",
        "ParallelAxis",
        "TensorParallelism",
        "ReadTarget",
        "SoftPinAction",
        "ObjectDataType",
        "BufferHandle",
    ):
        assert hasattr(ms, name), name


@pytest.mark.ours
def test_error_code_enum() -> None:
    ec = ms.ErrorCode
    assert ec.OBJECT_NOT_FOUND == -704
    assert ec.INVALID_PARAMS == -600
    assert ec.NO_AVAILABLE_HANDLE == -200
    assert ec.NOT_SUPPORTED == -1012


@pytest.mark.ours
def test_replicate_config_kwargs() -> None:
    c = ReplicateConfig(replica_num=2, with_hard_pin=True)
    assert c.replica_num == 2 and c.with_hard_pin is True


@pytest.mark.ours
def test_config_none_means_default(store: Any, key: K) -> None:
    assert store.put(key("cn"), b"x", None) == 0
    assert store.get(key("cn")) == b"x"


def test_replica_num_zero(store: Any, key: K) -> None:
    c = ReplicateConfig()
    c.replica_num = 0
    assert store.put(key("r0"), b"x", c) == -600
    assert store.is_exist(key("r0")) == 0


def test_soft_pin_validation(store: Any, key: K) -> None:
    c = ReplicateConfig()
    c.soft_pin_ttl_ms = 100  # PRESERVE + ttl
    assert store.put(key("sp1"), b"x", c) == -600
    c = ReplicateConfig()
    c.soft_pin_action = SoftPinAction.ENABLE
    c.soft_pin_ttl_ms = 10**12
    assert store.put(key("sp2"), b"x", c) == -600
    c = ReplicateConfig()
    c.soft_pin_action = SoftPinAction.ENABLE
    assert store.put(key("sp3"), b"x", c) == 0
    assert store.get(key("sp3")) == b"x"


def test_prefer_alloc_in_same_node_rejected(store: Any, key: K) -> None:
    c = ReplicateConfig()
    c.prefer_alloc_in_same_node = True
    arr = np.frombuffer(b"abcdefgh" * 16, np.uint8).copy()
    p = int(arr.ctypes.data)
    assert store.put(key("pa"), b"x", c) == -600
    assert store.put_from(key("pf"), p, 128, c) == -600
    assert store.batch_put_from([key("b1"), key("b2")], [p, p], [64, 64], c) == [-600, -600]
    assert store.batch_is_exist([key("pa"), key("pf"), key("b1")]) == [0, 0, 0]


# ---------------------------------------------------------------- empty keys


def test_empty_key_writes_rejected(store: Any) -> None:
    arr = np.zeros(64, np.uint8)
    p = int(arr.ctypes.data)
    assert store.put("", b"x") == -600
    assert store.upsert("", b"x") == -600
    assert store.put_parts("", b"a", b"b") == -600
    assert store.put_from("", p, 64) == -600
    assert store.upsert_from("", p, 64) == -600
    assert store.batch_put_from(["", "ok-not-written"], [p, p], [64, 64])[0] == -600
    assert store.put_batch(["", "x"], [b"1", b"2"]) == -600
    assert store.get("") == b""
    assert store.get_buffer("") is None


@pytest.mark.ours
def test_empty_key_reads_rejected(store: Any) -> None:
    arr = np.zeros(64, np.uint8)
    assert store.get_size("") == -600
    assert store.remove("") == -600
    assert store.get_into("", int(arr.ctypes.data), 64) == -600


# ---------------------------------------------------------------- Tier 2 surface


TIER2_METHODS = [
    "get_replica_desc",
    "batch_get_replica_desc",
    "create_copy_task",
    "create_move_task",
    "query_task",
    "mount_segment",
    "unmount_segment",
    "allocate_and_mount_segment",
    "unmount_and_free_segment",
    "batch_put_session_start",
    "batch_put_session_end",
    "batch_get_session_start",
    "batch_get_session_end",
    "batch_put_from_multi_buffers",
    "batch_get_into_multi_buffers",
    "batch_put_from_multi_buffer_ranges",
    "batch_get_into_multi_buffer_ranges",
    "setup_dummy",
]


def test_tier2_methods_exist() -> None:
    missing = [m for m in TIER2_METHODS if not hasattr(ms.MooncakeDistributedStore, m)]
    assert not missing


# ---------------------------------------------------------------- logging


@pytest.mark.ours
def test_failures_are_logged(store: Any, key: K, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    missing = key("not-there")
    with caplog.at_level(logging.INFO, logger="mooncake.store"):
        assert store.get(missing) == b""
        assert store.put("", b"x") == -600
    recs = [r for r in caplog.records if r.name == "mooncake.store"]
    nf = [r for r in recs if missing in r.getMessage()]
    assert nf and nf[0].levelno == logging.INFO and "get" in nf[0].getMessage()
    assert any(r.levelno == logging.WARNING and "put" in r.getMessage() for r in recs)


@pytest.mark.ours
@pytest.mark.parametrize(
    "value",
    [
        np.arange(6, dtype=">f4"),
        np.float32(1.5),
        np.arange(12, dtype=np.float64).reshape(3, 4),
        np.arange(12, dtype=np.int16).reshape(3, 4).T,
        array.array("d", [1.0, 2.5]),
    ],
    ids=["big-endian", "numpy-scalar", "2d-float64", "transposed", "array.array"],
)
def test_any_format_value_stores_its_c_order_bytes(store: Any, key: K, value: Any) -> None:
    k = key("fmt")
    assert store.put(k, value) == 0
    assert store.get(k) == np.ascontiguousarray(value).tobytes()
