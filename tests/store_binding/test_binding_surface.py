"""Binding-surface tests for ``mooncake.store`` that need no running master.

Covers ReplicateConfig fields/defaults/str/TypeErrors, the enums, the
not-set-up return values and their log lines, buffer-protocol argument
checking, BufferHandle's buffer export, setup argument validation that
fails before contacting a master, and the Tier 2/3 stubs.
"""

from __future__ import annotations

import logging
import pickle

import mooncake.store as ms
import numpy as np
import pytest
from conftest import store_records
from mooncake.store import (
    BufferHandle,
    ErrorCode,
    MooncakeDistributedStore,
    ObjectDataType,
    ReplicateConfig,
    SoftPinAction,
)

DEFAULT_STR = (
    "ReplicateConfig: { replica_num: 1, nof_replica_num: 0, dfs_replica_num: 0, "
    "soft_pin_action: PRESERVE, soft_pin_ttl_ms: default, with_hard_pin: 0, "
    "preferred_segments: [], preferred_nof_segments: [], prefer_alloc_in_same_node: 0, "
    "data_type: UNKNOWN }"
)


@pytest.fixture
def store() -> MooncakeDistributedStore:
    return MooncakeDistributedStore()


@pytest.fixture
def store_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="mooncake.store")
    return caplog


# --- module surface ---------------------------------------------------------


def test_exports() -> None:
    for name in ("KVCACHE", "TENSOR", "UNKNOWN", "GENERAL", "OPTIMIZER_STATE"):
        assert getattr(ms, name) == getattr(ObjectDataType, name)
    for name in ("PRESERVE", "ENABLE", "DISABLE"):
        assert not hasattr(ms, name)
    assert ErrorCode.OBJECT_NOT_FOUND == -704
    assert ErrorCode.NOT_SUPPORTED == -1012
    assert ErrorCode.OK == 0
    assert ErrorCode(-600).name == "INVALID_PARAMS"


# --- enums --------------------------------------------------------------------


def test_soft_pin_action() -> None:
    a = SoftPinAction(1)
    assert a == SoftPinAction.ENABLE
    assert a != 1
    assert str(a) == "SoftPinAction.ENABLE"
    assert int(a) == 1 and a.value == 1 and a.name == "ENABLE"
    assert hash(a) == hash(SoftPinAction.ENABLE)
    assert {SoftPinAction.DISABLE: 1}[SoftPinAction(2)] == 1
    assert list(SoftPinAction.__members__) == ["PRESERVE", "ENABLE", "DISABLE"]
    assert pickle.loads(pickle.dumps(SoftPinAction.DISABLE)) == SoftPinAction.DISABLE
    with pytest.raises(ValueError):
        SoftPinAction(7)


def test_object_data_type() -> None:
    assert ObjectDataType(9) == ObjectDataType.GENERAL
    assert ObjectDataType.KVCACHE != 1
    assert int(ObjectDataType.METADATA) == 8
    assert str(ObjectDataType.OPTIMIZER_STATE) == "ObjectDataType.OPTIMIZER_STATE"
    assert len(ObjectDataType.__members__) == 10


# --- ReplicateConfig ----------------------------------------------------------


def test_replicate_config_defaults() -> None:
    c = ReplicateConfig()
    assert c.replica_num == 1
    assert c.soft_pin_action == SoftPinAction.PRESERVE
    assert c.soft_pin_ttl_ms is None
    assert c.with_hard_pin is False
    assert c.preferred_segments == []
    assert c.preferred_segment == ""
    assert c.prefer_alloc_in_same_node is False
    assert c.group_ids is None
    assert c.data_type == ObjectDataType.UNKNOWN
    assert c.nof_replica_num == 0 and c.dfs_replica_num == 0
    assert c.preferred_nof_segments == []
    assert str(c) == DEFAULT_STR


def test_replicate_config_str_all_fields() -> None:
    c = ReplicateConfig(
        nof_replica_num=2,
        soft_pin_action=SoftPinAction.ENABLE,
        soft_pin_ttl_ms=5,
        with_hard_pin=True,
        preferred_segments=["a", "b:1"],
        preferred_segment="x",
        preferred_nof_segments=["n"],
        prefer_alloc_in_same_node=True,
        data_type=ms.TENSOR,
        group_ids=["g"],
    )
    assert str(c) == (
        "ReplicateConfig: { replica_num: 1, nof_replica_num: 2, dfs_replica_num: 0, "
        "soft_pin_action: ENABLE, soft_pin_ttl_ms: 5, with_hard_pin: 1, "
        "preferred_segments: [a, b:1], preferred_segment (deprecated): x, "
        "preferred_nof_segments: [n], prefer_alloc_in_same_node: 1, data_type: TENSOR, "
        "group_ids: [g] }"
    )


def test_replicate_config_list_fields_are_copies() -> None:
    c = ReplicateConfig()
    c.preferred_segments.append("x")
    assert c.preferred_segments == []
    c.preferred_segments = ["a"]
    assert c.preferred_segments == ["a"]


def test_replicate_config_ttl_bounds() -> None:
    c = ReplicateConfig()
    c.soft_pin_ttl_ms = 2**64 - 1
    assert c.soft_pin_ttl_ms == 2**64 - 1
    c.soft_pin_ttl_ms = None
    assert c.soft_pin_ttl_ms is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("replica_num", -1),
        ("replica_num", 1.5),
        ("replica_num", "2"),
        ("soft_pin_ttl_ms", -1),
        ("soft_pin_ttl_ms", 2**64),
        ("soft_pin_action", 1),
        ("data_type", 1),
        ("preferred_segments", "ab"),
        ("preferred_segment", 3),
        ("group_ids", "g"),
        ("nof_replica_num", -1),
        ("with_hard_pin", "yes"),
    ],
)
def test_replicate_config_type_errors(field: str, value: object) -> None:
    c = ReplicateConfig()
    with pytest.raises(TypeError):
        setattr(c, field, value)
    with pytest.raises(TypeError):
        ReplicateConfig(**{field: value})


def test_replicate_config_unknown_kwarg() -> None:
    with pytest.raises(TypeError):
        ReplicateConfig(bogus=1)


# --- not set up / closed ------------------------------------------------------


def test_not_set_up_values(store: MooncakeDistributedStore) -> None:
    assert store.put("k", b"v") == -600
    assert store.put_parts("k", b"a") == -600
    assert store.put_batch(["a"], [b"x"]) == -600
    assert store.upsert("k", b"v") == -600
    assert store.upsert_parts("k", b"a") == -600
    assert store.upsert_batch(["a"], [b"x"]) == -600
    assert store.get("k") == b""
    assert store.get(key="k") == b""
    assert store.get_batch(["a", "b"]) == [b"", b""]
    assert store.get_batch([]) == [b""]
    assert store.get_buffer("k") is None
    assert store.batch_get_buffer(["a", "b"]) == [None, None]
    assert store.get_size("k") == -600
    assert store.is_exist("k") == -600
    assert store.batch_is_exist(["a", "b"]) == [-600, -600]
    assert store.batch_is_exist([]) == []
    assert store.remove("k") == -600
    assert store.batch_remove(["a"], True) == [-600]
    assert store.remove_by_regex("x") == -600
    assert store.remove_all(force=True) == -600
    assert store.register_buffer(4096, 16) == -600
    assert store.unregister_buffer(4096) == -600
    assert store.put_from("k", 4096, 16) == -600
    assert store.upsert_from("k", 4096, 16) == -600
    assert store.get_into("k", 4096, 16) == -600
    assert store.batch_put_from(["a", "b"], [1, 2], [3, 4]) == [-600, -600]
    assert store.batch_upsert_from(["a"], [1], [3]) == [-600]
    assert store.batch_get_into(["a", "b"], [1, 2], [3, 4]) == [-600, -600]
    assert store.get_into_ranges(
        [1, 2],
        [["a"], ["b", "c"]],
        [[[0, 1]], [[2], []]],
        [[[0, 1]], [[2], []]],
        [[[1, 1]], [[1], []]],
    ) == [[[-600, -600]], [[-600], []]]
    assert store.batch_put_session_start(["a", "b"], [1, 2]) == [-600, -600]
    assert store.batch_put_session_end(["a"]) == [-600]
    assert store.batch_put_session_revoke(["a"]) == [-600]
    assert store.batch_get_session_start(["a", "b"]) == [-600, -600]
    assert store.batch_get_session_end(["a"]) == -600
    assert store.batch_put_from_multi_buffer_ranges(["a"], [[1]], [[1]], [[0]]) == [-600]
    assert store.batch_get_into_multi_buffer_ranges(["a"], [[1]], [[1]], [[0]]) == [-600]
    assert store.get_hostname() == ""
    assert store.health_check() == 1
    assert store._get_pyclient_capsule() is None
    assert store.get_client_stats() == {}
    assert store.close() == 0
    assert store.close() == 0


def test_not_set_up_logs_one_line(
    store: MooncakeDistributedStore, store_log: pytest.LogCaptureFixture
) -> None:
    store.put("key-1", b"v")
    records = store_records(store_log)
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING
    assert "put" in records[0].getMessage() and "key-1" in records[0].getMessage()
    store_log.clear()
    assert store.batch_is_exist(["a", "b", "c"]) == [-600] * 3
    assert len(store_records(store_log)) == 1


def test_success_shaped_calls_do_not_log(
    store: MooncakeDistributedStore, store_log: pytest.LogCaptureFixture
) -> None:
    assert store.close() == 0
    assert store.health_check() == 1
    assert store_records(store_log) == []


def test_subclassing() -> None:
    class Wrapped(MooncakeDistributedStore):
        pass

    class Cfg(ReplicateConfig):
        pass

    assert Wrapped().put("k", b"v", Cfg(replica_num=2)) == -600


# --- argument types -----------------------------------------------------------


@pytest.mark.parametrize("value", ["text", 5, None, 1.5, [1, 2]])
def test_non_buffer_values_raise(store: MooncakeDistributedStore, value: object) -> None:
    with pytest.raises(TypeError):
        store.put("k", value)
    with pytest.raises(TypeError):
        store.upsert("k", value)
    with pytest.raises(TypeError):
        store.put_parts("k", b"ok", value)
    with pytest.raises(TypeError):
        store.put_batch(["k"], [value])


@pytest.mark.parametrize(
    "value",
    [b"x", bytearray(b"x"), memoryview(b"abc")[::2], np.arange(10, dtype=np.int32)[::3]],
)
def test_buffer_values_accepted(store: MooncakeDistributedStore, value: object) -> None:
    # Accepted (no TypeError); the closed store then answers -600.
    assert store.put("k", value) == -600


def test_argument_type_errors(store: MooncakeDistributedStore) -> None:
    with pytest.raises(TypeError):
        store.put(1, b"v")
    with pytest.raises(TypeError):
        store.get_batch("abc")
    with pytest.raises(TypeError):
        store.get()
    with pytest.raises(TypeError):
        store.get("a", key="b")
    with pytest.raises(TypeError):
        store.get_into("k", -1, 10)
    with pytest.raises(TypeError):
        store.register_buffer(4096, 2**64)
    with pytest.raises(TypeError):
        store.put("k", b"v", config=5)
    with pytest.raises(TypeError):
        store.batch_put_from(["a"], [1.5], [1])


def test_keyword_names(store: MooncakeDistributedStore) -> None:
    assert store.get(arg0="k") == b""
    assert store.get_batch(keys=["k"]) == [b""]
    assert store.get_buffer(key="k") is None
    assert store.batch_get_buffer(arg0=["k"]) == [None]
    assert store.get_size(key="k") == -600
    assert store.is_exist(arg0="k") == -600
    assert store.put(key="k", value=b"v", config=None) == -600
    assert store.put_parts("k", b"a", b"b", config=ReplicateConfig()) == -600
    assert store.remove(key="k", force=True) == -600
    assert store.remove_by_regex(regex_pattern="x", force=False) == -600


# --- BufferHandle -------------------------------------------------------------


def test_buffer_handle_protocol() -> None:
    h = BufferHandle._from_bytes(b"hello")
    assert len(h) == h.size() == 5
    assert h.ptr() != 0
    mv = memoryview(h)
    assert mv.format == "b" and mv.itemsize == 1 and mv.ndim == 1 and not mv.readonly
    assert mv.tobytes() == b"hello"
    arr = np.frombuffer(h, np.uint8)
    assert arr.tobytes() == b"hello"
    mv[0] = ord("j")
    assert bytes(h) == b"jello"
    del mv, arr


def test_buffer_handle_from_noncontiguous() -> None:
    src = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]
    h = BufferHandle._from_bytes(src)
    assert bytes(h) == src.tobytes()


# --- setup validation (no master needed) --------------------------------------

ARGS = ("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", "127.0.0.1:1")


def with_arg(index: int, value: object) -> tuple[object, ...]:
    args = list(ARGS)
    args[index] = value
    return tuple(args)


@pytest.mark.parametrize(
    ("args", "kwargs", "code"),
    [
        (with_arg(2, 100), {}, -600),
        (with_arg(3, 100), {}, -600),
        (with_arg(3, (1 << 40) + 1), {}, -600),
        (with_arg(0, ""), {}, -600),
        (with_arg(4, "udp"), {}, -1),
        (with_arg(4, "RDMA"), {}, -1),
        (with_arg(1, "redis://127.0.0.1:6379"), {}, -1),
        (ARGS, {"engine": object()}, -600),
        (ARGS, {"tenant_id": "_t1"}, -600),
    ],
)
def test_setup_rejected_before_master(
    store: MooncakeDistributedStore,
    store_log: pytest.LogCaptureFixture,
    args: tuple[object, ...],
    kwargs: dict[str, object],
    code: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    assert store.setup(*args, **kwargs) == code
    assert len(store_records(store_log)) == 1
    assert store.health_check() == 1


@pytest.mark.parametrize(
    "config",
    [
        {"local_hostname": "127.0.0.1"},
        {"metadata_server": "P2PHANDSHAKE"},
        {"local_hostname": "", "metadata_server": "P2PHANDSHAKE"},
        {"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "global_segment_size": "50%"},
        {"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "global_segment_size": 100},
        {"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "local_buffer_size": "1 B"},
        {"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "enable_ssd_offload": "maybe"},
        {"local_hostname": "h", "metadata_server": "P2PHANDSHAKE", "client_http_port": "x"},
    ],
)
def test_setup_dict_invalid(store: MooncakeDistributedStore, config: dict[str, object]) -> None:
    assert store.setup(config) == -600
    assert store.setup(config=config) == -600


def test_setup_dict_unsupported(store: MooncakeDistributedStore) -> None:
    base = {"local_hostname": "h", "metadata_server": "P2PHANDSHAKE"}
    assert store.setup({**base, "tenant_id": "_t"}) == -600
    assert store.setup({**base, "protocol": "udp"}) == -1
    assert store.setup({**base, "local_hostname": "h:17000", "protocol": "udp"}) == -600


def test_bad_offload_settings_are_refused_before_the_master(
    store: MooncakeDistributedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "many")
    assert store.setup(*ARGS, enable_ssd_offload=True) == -600
    base = {"local_hostname": "h", "metadata_server": "P2PHANDSHAKE"}
    assert store.setup({**base, "enable_ssd_offload": "on"}) == -600
    assert store.health_check() == 1


def test_setup_type_errors(store: MooncakeDistributedStore) -> None:
    with pytest.raises(TypeError):
        store.setup()
    with pytest.raises(TypeError):
        store.setup(*ARGS[:6])
    with pytest.raises(TypeError):
        store.setup(*with_arg(2, "16MB"))
    with pytest.raises(TypeError):
        store.setup(*with_arg(2, -1))
    with pytest.raises(TypeError):
        store.setup(*with_arg(0, 5))
    with pytest.raises(TypeError):
        store.setup(*ARGS, bogus=1)
    with pytest.raises(TypeError):
        store.setup(*ARGS, local_hostname="x")
    with pytest.raises(TypeError):
        store.setup(*ARGS, None, False, "", "default", False, 9300, "extra")


# --- Tier 2/3 methods ----------------------------------------------------------


def test_tier_methods_on_a_store_not_set_up(
    store: MooncakeDistributedStore, store_log: pytest.LogCaptureFixture
) -> None:
    # Not set up: -600 like every int method; setup_dummy to a port nobody
    # serves: -1 (upstream's code for any setup_dummy failure).
    assert store.unmount_segment(["s"]) == -600
    assert store.unmount_and_free_segment(["s"], 5) == -600
    assert store.setup_dummy(1024, 1024, "127.0.0.1:1") == -1
    assert store.get_tensor_into_cuda("k", object()) == -600
    assert store.batch_get_tensor_into_cuda(["a", "b"], []) == [-600, -600]
    assert store.get_offload_rpc_read_count() == 0
    assert store.alloc_from_mem_pool(4096) == 0
    records = store_records(store_log)
    assert len(records) == 6
    assert "unmount_segment" in records[0].getMessage()
    assert "setup_dummy" in records[2].getMessage()


def test_task_and_clear_methods_on_a_store_not_set_up(
    store: MooncakeDistributedStore, store_log: pytest.LogCaptureFixture
) -> None:
    # Upstream's return shapes, with -600 (not set up) as the code; one
    # log line per call.
    assert store.create_copy_task("k", ["s"]) == ((0, 0), -600)
    assert store.create_move_task("k", "a", "b") == ((0, 0), -600)
    assert store.query_task((1, 2)) == (None, -600)
    assert store.batch_replica_clear(["k"]) == []
    records = store_records(store_log)
    assert [r.getMessage().split(":")[0] for r in records] == [
        "create_copy_task",
        "create_move_task",
        "query_task",
        "batch_replica_clear",
    ]


def test_mount_methods_on_a_store_not_set_up(
    store: MooncakeDistributedStore, store_log: pytest.LogCaptureFixture
) -> None:
    # Upstream's dict shapes, with -600 (not set up) as ret; one log line each.
    assert store.mount_segment("/p", 1024) == {"ret": -600, "segment_ids": []}
    assert store.allocate_and_mount_segment(1024) == {
        "ret": -600,
        "segment_ids": [],
        "allocated_size": 0,
    }
    records = store_records(store_log)
    assert [r.getMessage().split(":")[0] for r in records] == [
        "mount_segment",
        "allocate_and_mount_segment",
    ]


def test_replica_desc_on_a_store_not_set_up(
    store: MooncakeDistributedStore, store_log: pytest.LogCaptureFixture
) -> None:
    assert store.get_replica_desc("k") == []
    assert store.batch_get_replica_desc(["k"]) == {}
    records = store_records(store_log)
    assert [r.getMessage().split(":")[0] for r in records] == [
        "get_replica_desc",
        "batch_get_replica_desc",
    ]
    with pytest.raises(TypeError):
        store.get_replica_desc(1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.batch_get_replica_desc("k")  # type: ignore[arg-type]


def test_empty_batches_answer_empty_and_log_nothing(
    store: MooncakeDistributedStore, store_log: pytest.LogCaptureFixture
) -> None:
    # Not set up: an empty batch has no item to fail.
    assert store.batch_is_exist([]) == []
    assert store.batch_remove([]) == []
    assert store.batch_get_buffer([]) == []
    assert store.batch_put_from([], [], []) == []
    assert store.batch_get_into([], [], []) == []
    assert store.get_into_ranges([], [], [], [], []) == []
    assert store_records(store_log) == []
