"""DataProto batches through ``MooncakeBundleTransfer`` against a real master:
round trips of every field kind, the read selectors, range reads (bytes moved
per ``get_client_stats()``), batched writes, stages, handles and cleanup."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from conftest import read_bytes, rpcs
from mooncake.structured_object_store import (
    MISSING,
    BundleTransferPolicy,
    FieldSchema,
    MooncakeBundleTransfer,
    MooncakeDataProtoRef,
    StructuredMemberSlice,
    StructuredObjectPayload,
    export_dataproto_ref,
    export_ref,
    import_dataproto_ref,
    import_ref,
    raw_destination,
    tensor_object_buffer,
)


class SimpleDataProto:
    """A DataProto-like class with verl's ``from_dict`` shape."""

    def __init__(self, batch=None, non_tensor_batch=None, meta_info=None) -> None:
        self.batch = batch or {}
        self.non_tensor_batch = non_tensor_batch or {}
        self.meta_info = meta_info or {}

    @classmethod
    def from_dict(cls, tensors, non_tensors=None, meta_info=None, num_batch_dims=1):
        return cls(tensors, non_tensors, meta_info)


def obj(values: list[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def rich_batch(n: int = 6) -> dict[str, Any]:
    return {
        "batch": {
            "input_ids": torch.arange(n * 4, dtype=torch.int64).reshape(n, 4),
            "log_probs": torch.linspace(0, 1, n * 3, dtype=torch.bfloat16).reshape(n, 3),
            "mask": np.arange(n * 2, dtype=np.int8).reshape(n, 2),
        },
        "non_tensor_batch": {
            "prompt": obj(["a", "bb", None, "dddd", "é€", ""][:n]),
            "meta": obj([{"i": i, "tags": ["x"] * i, "a.b": {"c[0]": i}} for i in range(n)]),
            "response": obj([torch.arange(i + 1, dtype=torch.float32) for i in range(n)]),
            "score": obj([0.5, None, 1, 2, 3, 4][:n]),
            "raw": obj([b"\x00\x01", None, b"", b"x", b"yy", b"z"][:n]),
            "ids": obj([[1, 2], [3], [], [4, 5, 6], [7], [8]][:n]),
            "uid": np.arange(n, dtype=np.int64),
        },
        "meta_info": {"step": 7, "temperature": 1.0},
    }


def assert_same_rows(got: Any, want: Any) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, torch.Tensor):
            assert torch.equal(g, w)
        elif isinstance(w, bytes):
            assert bytes(g) == w
        else:
            assert g == w


def test_round_trip_of_every_field_kind(transfer: Any) -> None:
    data = rich_batch()
    ref = transfer.put_dataproto(data, namespace="rollout", partition="step-1", stage="rollout")
    assert isinstance(ref, MooncakeDataProtoRef)
    assert ref.batch_size == 6 and set(ref.stage_refs) == {"rollout"}
    out = transfer.get_dataproto(ref)
    assert set(out) == {"batch", "non_tensor_batch", "meta_info"}
    for name, value in data["batch"].items():
        got = out["batch"][name]
        if isinstance(value, torch.Tensor):
            assert got.dtype == value.dtype and torch.equal(got, value)
        else:
            assert got.dtype == value.dtype and np.array_equal(got, value)
    for name, value in data["non_tensor_batch"].items():
        got = out["non_tensor_batch"][name]
        assert isinstance(got, np.ndarray)
        if value.dtype != object:
            assert np.array_equal(got, value)
        else:
            assert got.dtype == object
            assert_same_rows(list(got), list(value))
    assert out["meta_info"] == data["meta_info"]
    proto = transfer.get_dataproto(ref, data_cls=SimpleDataProto)
    assert isinstance(proto, SimpleDataProto) and proto.meta_info["step"] == 7


def test_selectors_fields_sections_meta_and_data_cls(transfer: Any) -> None:
    ref = transfer.put_dataproto(rich_batch())
    r = transfer.get_dataproto(ref, fields=["input_ids", "prompt"], meta_info_keys=["step"])
    assert set(r["batch"]) == {"input_ids"} and set(r["non_tensor_batch"]) == {"prompt"}
    assert r["meta_info"] == {"step": 7}
    r = transfer.get_dataproto(ref, batch_fields=["mask"])
    assert set(r["batch"]) == {"mask"} and r["non_tensor_batch"] == {}
    r = transfer.get_dataproto(ref, non_tensor_fields=["score"])
    assert r["batch"] == {} and r["non_tensor_batch"]["score"].tolist() == [0.5, None, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="cannot be combined"):
        transfer.get_dataproto(ref, fields=["mask"], batch_fields=["mask"])
    with pytest.raises(KeyError, match="nope"):
        transfer.get_dataproto(ref, fields=["nope"])


@pytest.mark.parametrize(
    "rows, idx",
    [
        (slice(2, 5), [2, 3, 4]),
        (slice(None, None, 2), [0, 2, 4]),
        (StructuredMemberSlice(axis=0, start=1, end=4), [1, 2, 3]),
        ([4, 1, 3], [4, 1, 3]),
        ([-1, 0], [5, 0]),
        (np.array([5, 5, 2]), [5, 5, 2]),
        ([], []),
    ],
)
def test_rows_select_the_same_rows_of_every_field(transfer: Any, rows: Any, idx: list[int]) -> None:
    data = rich_batch()
    ref = transfer.put_dataproto(data)
    out = transfer.get_dataproto(import_ref(export_ref(ref)), rows=rows)
    for name, value in data["batch"].items():
        got = out["batch"][name]
        want = value[idx] if len(idx) else value[:0]
        assert (
            torch.equal(got, want) if isinstance(value, torch.Tensor) else np.array_equal(got, want)
        )
    for name, value in data["non_tensor_batch"].items():
        got = out["non_tensor_batch"][name]
        if value.dtype != object:
            assert np.array_equal(got, value[idx])
        else:
            assert_same_rows(list(got), [value[i] for i in idx])


def test_row_reads_move_only_the_selected_bytes(transfer: Any, sstore: Any) -> None:
    n, width = 100_000, 16
    data = {
        "batch": {
            "input_ids": torch.arange(n * width, dtype=torch.int64).reshape(n, width),
            "values": np.random.default_rng(0).random((n, 4), dtype=np.float32),
        },
        "non_tensor_batch": {"prompt": obj([f"prompt number {i}" for i in range(n)])},
    }
    ref = transfer.put_dataproto(data)
    rows = list(range(1000, 100_000, 780))[:128]
    before = read_bytes(sstore)
    out = transfer.get_dataproto(ref, fields=["input_ids", "values", "prompt"], rows=rows)
    moved = read_bytes(sstore) - before
    text = sum(len(f"prompt number {i}") for i in rows)
    # Rows of both tensors, the prompts' bytes and, per prompt row, its two
    # offsets (8 bytes each) and null flag.
    expected = len(rows) * (width * 8 + 4 * 4) + text + len(rows) * (16 + 1)
    assert expected <= moved <= expected + 4096, (moved, expected)
    assert torch.equal(out["batch"]["input_ids"], data["batch"]["input_ids"][rows])
    assert out["non_tensor_batch"]["prompt"].tolist() == [f"prompt number {i}" for i in rows]


def test_a_put_is_one_batched_write_and_a_read_one_request(transfer: Any, sstore: Any) -> None:
    data = rich_batch()
    before = rpcs(sstore)
    ref = transfer.put_dataproto(data)
    writes = rpcs(sstore) - before
    # PutStart and PutEnd for every payload and the manifest together.
    assert writes == 2, writes
    before = rpcs(sstore)
    transfer.get_dataproto(ref, fields=["input_ids", "mask", "uid"])
    assert rpcs(sstore) - before == 1
    before = rpcs(sstore)
    transfer.get_dataproto(import_ref(export_ref(ref)), fields=["input_ids"], rows=[1, 3])
    assert rpcs(sstore) - before <= 2  # the (cached) manifest plus the ranges


def test_destinations_ndarray_raw_and_tensor_object(transfer: Any, sstore: Any) -> None:
    from mooncake.store import BufferPool, _deserialize_tensor, _tensor_metadata_size

    data = rich_batch()
    ref = transfer.put_dataproto(data)
    dst = np.empty((3, 2), dtype=np.int8)
    r = transfer.get_dataproto(
        ref, batch_fields=["mask"], rows=[4, 1, 3], destinations={"mask": dst}
    )
    assert r["batch"]["mask"] is dst and np.array_equal(dst, data["batch"]["mask"][[4, 1, 3]])
    pool = BufferPool(sstore, 1 << 20)
    lease = pool.acquire(4096)
    r = transfer.get_dataproto(
        ref,
        batch_fields=["mask"],
        destinations={"mask": raw_destination(lease.ptr, lease.size, lease, pre_registered=True)},
    )
    assert np.array_equal(r["batch"]["mask"], data["batch"]["mask"])
    nbytes = _tensor_metadata_size() + 3 * 4 * 8
    r = transfer.get_dataproto(
        ref,
        batch_fields=["input_ids"],
        rows=[4, 1, 3],
        destinations={
            "input_ids": raw_destination(lease.ptr, lease.size, lease, pre_registered=True)
        },
    )
    assert r["batch"]["input_ids"].ptr == lease.ptr
    decoded = _deserialize_tensor(bytes(lease.buffer[:nbytes]))
    assert torch.equal(decoded, data["batch"]["input_ids"][[4, 1, 3]])
    r = transfer.get_dataproto(
        ref,
        batch_fields=["input_ids"],
        destinations={"input_ids": tensor_object_buffer(lease.ptr, lease.size, lease)},
    )
    assert torch.equal(r["batch"]["input_ids"], data["batch"]["input_ids"])
    del r
    lease.release()
    pool.close()


def test_tensor_object_buffer_fields_use_the_native_tensor_path(transfer: Any) -> None:
    from mooncake.store import _serialize_tensor

    t = torch.arange(20, dtype=torch.float32).reshape(5, 4)
    header, _ptr, nbytes, _owner = _serialize_tensor(t)
    buf = np.empty(len(header) + nbytes, dtype=np.uint8)
    buf[: len(header)] = np.frombuffer(header, dtype=np.uint8)
    buf[len(header) :] = t.numpy().view(np.uint8).reshape(-1)
    field = tensor_object_buffer(buf.ctypes.data, buf.nbytes, buf, batch_size=5)
    ref = transfer.put_dataproto(
        {"hidden": field}, policy=BundleTransferPolicy(copy_mode="zero_copy")
    )
    assert torch.equal(transfer.get_dataproto(ref)["batch"]["hidden"], t)
    assert torch.equal(transfer.get_dataproto(ref, rows=[3, 0])["batch"]["hidden"], t[[3, 0]])
    bad = np.zeros(400, dtype=np.uint8)
    with pytest.raises(RuntimeError, match="hidden"):
        transfer.put_dataproto(
            {"hidden": tensor_object_buffer(bad.ctypes.data, 400, bad, batch_size=1)}
        )
    with pytest.raises(ValueError, match="zero-copy"):
        transfer.put_dataproto({"x": t}, policy=BundleTransferPolicy(copy_mode="zero_copy"))


def test_stages_append_same_stage_overwrite_and_manifest_view(transfer: Any) -> None:
    data = rich_batch()
    ref = transfer.put_dataproto(data, stage="rollout")
    logp = torch.randn(6, 4)
    ref2 = transfer.append_dataproto_fields(
        export_ref(ref),
        {"batch": {"old_log_probs": logp}, "meta_info": {"v": 1}},
        stage="old_log_prob",
    )
    assert set(ref2.stage_refs) == {"rollout", "old_log_prob"}
    assert ref.field_index.keys() <= ref2.field_index.keys()
    adv = np.ones(6, dtype=np.float32)
    ref3 = transfer.append_dataproto_fields(
        ref2, {"non_tensor_batch": {"adv": adv}}, stage="old_log_prob"
    )
    out = transfer.get_dataproto(ref3, fields=["old_log_probs", "adv", "input_ids"])
    assert torch.equal(out["batch"]["old_log_probs"], logp) and np.array_equal(
        out["non_tensor_batch"]["adv"], adv
    )
    assert out["meta_info"] == {"step": 7, "temperature": 1.0, "v": 1}
    # The earlier ref still reads (its manifest is kept until cleanup).
    assert torch.equal(
        transfer.get_dataproto(ref2, fields=["old_log_probs"])["batch"]["old_log_probs"], logp
    )
    view = transfer.dataproto_manifest_view(export_ref(ref3))
    assert view["batch_size"] == 6 and view["meta_info_keys"] == ["step", "temperature", "v"]
    assert view["batch_fields"]["input_ids"]["spec"]["shape"] == [6, 4]
    assert view["batch_fields"]["old_log_probs"]["stage"] == "old_log_prob"
    assert view["non_tensor_fields"]["prompt"]["spec"]["codec"] == "utf8_ragged"
    assert view["stages"]["rollout"]["dataproto"]["stage"] == "rollout"
    new_logp = torch.zeros(6, 4)
    ref4 = transfer.append_dataproto_fields(
        ref3,
        {"batch": {"old_log_probs": new_logp}, "non_tensor_batch": {"adv": adv * 2}},
        stage="old_log_prob",
        overwrite=True,
    )
    out = transfer.get_dataproto(ref4, fields=["old_log_probs", "adv"])
    assert torch.equal(out["batch"]["old_log_probs"], new_logp)
    assert np.array_equal(out["non_tensor_batch"]["adv"], adv * 2)
    transfer.cleanup_dataproto(ref4)


def test_cleanup_removes_every_key_of_every_stage(transfer: Any, prefix: str, keys_of: Any) -> None:
    ref = transfer.put_dataproto(rich_batch(), stage="a")
    ref = transfer.append_dataproto_fields(ref, {"x": np.zeros((6, 1000))}, stage="b")
    ref = transfer.append_dataproto_fields(ref, {"y": np.zeros((6, 2))}, stage="b")
    assert len(keys_of(prefix)) > 10
    transfer.cleanup_dataproto(export_ref(ref))
    assert keys_of(prefix) == []


def test_chunked_members_round_trip(sstore: Any, prefix: str) -> None:
    transfer = MooncakeBundleTransfer(sstore, key_prefix=prefix, default_chunk_bytes=1000)
    data = {
        "batch": {"x": np.arange(3000, dtype=np.int64).reshape(300, 10)},
        "non_tensor_batch": {"t": obj([str(i) * 7 for i in range(300)])},
    }
    ref = transfer.put_dataproto(data)
    assert len(ref.stage_refs["default"].manifest["buffers"]["batch.x"]["chunks"]) == 24
    out = transfer.get_dataproto(ref, rows=[0, 150, 299, 100])
    assert np.array_equal(out["batch"]["x"], data["batch"]["x"][[0, 150, 299, 100]])
    assert out["non_tensor_batch"]["t"].tolist() == [str(i) * 7 for i in (0, 150, 299, 100)]


def test_field_schemas_and_flat_dict_form(transfer: Any) -> None:
    value = {
        "tokens": [
            torch.tensor([1, 2, 3], dtype=torch.int32),
            torch.tensor([4, 5], dtype=torch.int32),
        ],
        "rewards": [0.5, 1.0],
        "prompt": ["hello", "world"],
        "metadata": [{"a": 1}, {"b": 2}],
        "mm": [{"pixels": torch.ones(2, 3)}, None],
        "total_lengths": [3, 2],
        "num_rollouts": 2,
    }
    schemas = {
        "tokens": FieldSchema("typed_ragged", False, {"section": "non_tensor_batch"}),
        "rewards": FieldSchema(
            "ndarray", False, {"section": "non_tensor_batch", "dtype": "float32"}
        ),
        "prompt": FieldSchema("msgpack_ragged", False, {"section": "non_tensor_batch"}),
        "metadata": FieldSchema("msgpack_ragged", False, {"section": "non_tensor_batch"}),
        "mm": FieldSchema("ragged_tensor_dict", True, {"section": "non_tensor_batch"}),
        "total_lengths": FieldSchema("auto", False, {"section": "meta_info"}),
    }
    ref = transfer.put(value, type="dict", namespace="miles", field_schemas=schemas)
    got = transfer.get(import_ref(export_ref(ref)), type="dict")
    assert got["tokens"] == [[1, 2, 3], [4, 5]]
    assert got["rewards"] == [0.5, 1.0]
    assert got["prompt"] == ["hello", "world"] and got["metadata"] == [{"a": 1}, {"b": 2}]
    assert torch.equal(got["mm"][0]["pixels"], torch.ones(2, 3)) and got["mm"][1] is None
    assert got["total_lengths"] == [3, 2] and got["num_rollouts"] == 2
    one = transfer.get(ref, type="dict", rows=[1])
    assert one["prompt"] == ["world"] and one["tokens"] == [[4, 5]] and one["mm"] == [None]


def test_nested_structures_keep_missing_keys_nulls_and_dotted_keys(transfer: Any) -> None:
    rows = [
        {"tokens": torch.arange(2), "label": None, "a.b": {"x[1]": b"raw"}},
        None,
        {"label": 3},
        {"tokens": None, "label": 4, "a.b": {"x[1]": b""}},
    ]
    ref = transfer.put_dataproto({"non_tensor_batch": {"s": obj(rows)}})
    assert ref.encoded_non_tensor["s"]["codec"] == "structured_recursive"
    for sel in (None, [3, 0], slice(1, 3)):
        got = list(transfer.get_dataproto(ref, rows=sel)["non_tensor_batch"]["s"])
        want = (
            rows
            if sel is None
            else [rows[i] for i in ([3, 0] if isinstance(sel, list) else [1, 2])]
        )
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            if w is None:
                assert g is None
                continue
            assert set(g) == set(w)
            for k in w:
                if isinstance(w[k], torch.Tensor):
                    assert torch.equal(g[k], w[k])
                else:
                    assert g[k] == w[k]
    assert MISSING is not None


def test_structured_object_and_bundle_layers(transfer: Any) -> None:
    payload = StructuredObjectPayload(
        metadata={"step": 7, "layout": "rollout"},
        buffers={
            "tokens": np.arange(24, dtype=np.int32).reshape(6, 4),
            "mask": np.ones((6, 4), dtype=np.int8),
            "prompt_ids": b"sample-ids",
        },
    )
    ref = transfer.put_structured_object(payload)
    result = transfer.materialize(transfer.read_spec(ref))
    assert result.metadata["step"] == 7 and result.objects["prompt_ids"] == b"sample-ids"
    spec = (
        transfer.read_spec(ref)
        .select_members(["tokens"])
        .slice_member("tokens", axis=0, start=2, end=5)
    )
    assert np.array_equal(
        transfer.materialize(spec).objects["tokens"], payload.buffers["tokens"][2:5]
    )
    dst = np.empty((3, 4), dtype=np.int32)
    assert transfer.materialize_into(spec, {"tokens": dst}).objects["tokens"] is dst
    wrapped = transfer.put_object(torch.arange(5))
    assert torch.equal(transfer.get_object(wrapped), torch.arange(5))
    bundle = transfer.put_bundle(b'{"kind": "raw"}', {"a": b"xyz", "b": bytearray(b"")})
    got = transfer.materialize(transfer.read_spec({"manifest_key": bundle.manifest_key}))
    assert got.metadata == {"kind": "raw"} and got.objects == {"a": b"xyz", "b": b""}
    transfer.remove_bundle(bundle)
    transfer.remove_bundle(ref)
    transfer.remove_bundle(wrapped)


def test_release_result_releases_attached_owners(transfer: Any) -> None:
    released: list[int] = []

    class Owner:
        def release(self) -> None:
            released.append(1)

    arr = np.zeros(3).view(type("Pooled", (np.ndarray,), {}))
    arr._mooncake_pool_owner = Owner()  # type: ignore[attr-defined]
    MooncakeBundleTransfer.release_result({"batch": {"x": arr, "y": [arr]}, "meta_info": {}})
    assert released == [1]
    ref = transfer.put_dataproto(rich_batch())
    MooncakeBundleTransfer.release_result(transfer.get_dataproto(ref))


def test_handles_are_json_and_validated() -> None:
    ref = MooncakeDataProtoRef(2, {}, {}, {"a": np.int64(3), "b": np.arange(2)})
    handle = export_dataproto_ref(ref)
    assert json.loads(json.dumps(handle))["meta_info"] == {"a": 3, "b": [0, 1]}
    assert import_dataproto_ref(handle).meta_info == {"a": 3, "b": [0, 1]}
    with pytest.raises(ValueError, match="unknown stage"):
        import_dataproto_ref(
            {**handle, "field_index": {"x": {"stage": "s", "member": "m", "section": "batch"}}}
        )
    with pytest.raises(ValueError, match="not a Mooncake"):
        import_dataproto_ref({"type": "other"})
    with pytest.raises(TypeError, match="JSON-safe"):
        export_dataproto_ref(MooncakeDataProtoRef(1, {}, {}, {"o": object()}))


def test_large_results_are_ordinary_writable_arrays(transfer: Any) -> None:
    t = torch.arange(1 << 20, dtype=torch.float64).reshape(1024, 1024)  # 8 MiB
    a = np.arange(1 << 20, dtype=np.int64).reshape(1024, 1024)
    ref = transfer.put_dataproto({"t": t, "a": a})
    out = transfer.get_dataproto(ref)["batch"]
    assert torch.equal(out["t"], t) and np.array_equal(out["a"], a)
    out["t"][0, 0] = -1.0
    out["a"][0, 0] = -1
    assert out["t"][0, 0] == -1.0 and out["a"][0, 0] == -1 and t[0, 0] == 0.0
    again = transfer.get_dataproto(ref, rows=slice(0, 1000))["batch"]
    assert torch.equal(again["t"], t[:1000]) and np.array_equal(again["a"], a[:1000])


def test_large_results_reuse_freed_memory_and_never_live_memory(transfer: Any) -> None:
    # Results of 4 MiB or more come from the client's result pool: a freed
    # result's memory serves the next read of that size, and memory a live
    # result (or any view of it) still uses is never handed out again.
    def batch(seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        return {
            "t": torch.randint(0, 1 << 40, (1024, 1024), generator=g),  # 8 MiB
            "a": np.full((1024, 1024), seed, dtype=np.int64),
        }

    want_a, want_b = batch(1), batch(2)
    ref_a, ref_b = transfer.put_dataproto(want_a), transfer.put_dataproto(want_b)
    got_a = transfer.get_dataproto(ref_a)["batch"]
    got_b = transfer.get_dataproto(ref_b)["batch"]
    assert got_a["t"].data_ptr() != got_b["t"].data_ptr()
    assert torch.equal(got_a["t"], want_a["t"]) and torch.equal(got_b["t"], want_b["t"])
    assert np.array_equal(got_a["a"], want_a["a"]) and np.array_equal(got_b["a"], want_b["a"])
    # A view keeps its block: reads after the result is dropped get other memory.
    view = got_a["t"][3:5]
    kept = view.clone()
    view_block = got_a["t"].data_ptr()
    del got_a
    again = [transfer.get_dataproto(ref_b)["batch"] for _ in range(3)]
    assert all(g["t"].data_ptr() != view_block for g in again)
    assert all(torch.equal(g["t"], want_b["t"]) for g in again)
    assert torch.equal(view, kept)
    # Freed results' memory is reused by the next read of the same size
    # (both fields are 8 MiB, so either's block may serve either).
    freed = {p for g in [*again, got_b] for p in (g["t"].data_ptr(), g["a"].ctypes.data)}
    del again, got_b
    reread = transfer.get_dataproto(ref_a)["batch"]
    assert reread["t"].data_ptr() in freed
    assert torch.equal(reread["t"], want_a["t"]) and np.array_equal(reread["a"], want_a["a"])


def test_fallback_codec_and_generic_put_get(transfer: Any) -> None:
    mixed = [1, "two", None, [3, {"four": 4.0}]]
    schema = {"m": FieldSchema("ndarray", True, {"section": "non_tensor_batch"})}
    ref = transfer.put({"non_tensor_batch": {"m": obj(mixed)}}, field_schemas=schema)
    assert ref.encoded_non_tensor["m"]["codec"] == "msgpack_ragged"
    assert transfer.get(ref)["non_tensor_batch"]["m"].tolist() == mixed
    assert transfer.get(ref, type="dict", rows=[3]) == {"m": [[3, {"four": 4.0}]]}
    with pytest.raises(ValueError, match="unsupported Mooncake payload type"):
        transfer.put({"x": np.zeros(2)}, type="bogus")
    with pytest.raises(ValueError, match="unsupported Mooncake payload type"):
        transfer.get(ref, type="bogus")


def test_one_transfer_shared_by_threads(sstore: Any, prefix: str) -> None:
    import threading

    transfer = MooncakeBundleTransfer(sstore, key_prefix=prefix)
    data = rich_batch()
    handles = [export_ref(transfer.put_dataproto(data, stage=f"s{i}")) for i in range(3)]
    errors: list[BaseException] = []

    def reader(i: int) -> None:
        try:
            for j in range(5):
                out = transfer.get_dataproto(
                    handles[(i + j) % 3], fields=["input_ids", "prompt"], rows=[j]
                )
                assert torch.equal(out["batch"]["input_ids"], data["batch"]["input_ids"][[j]])
                assert out["non_tensor_batch"]["prompt"].tolist() == [
                    data["non_tensor_batch"]["prompt"][j]
                ]
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    for h in handles:
        transfer.cleanup_dataproto(h)
