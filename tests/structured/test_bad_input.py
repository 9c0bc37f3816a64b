"""Bad input: each case raises a clear error naming the field and loses
nothing (no key is left behind, and what was stored still reads)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from mooncake.structured_object_store import (
    FieldSchema,
    MooncakeBundleTransfer,
    export_ref,
    import_ref,
    raw_destination,
)


def obj(values: list[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


@pytest.fixture
def stored(transfer: Any) -> Any:
    data = {
        "batch": {"input_ids": torch.arange(8).reshape(4, 2)},
        "non_tensor_batch": {"prompt": obj(["a", "b", "c", "d"])},
        "meta_info": {"step": 1},
    }
    return transfer.put_dataproto(data, stage="rollout")


def still_reads(transfer: Any, ref: Any) -> None:
    out = transfer.get_dataproto(ref)
    assert torch.equal(out["batch"]["input_ids"], torch.arange(8).reshape(4, 2))
    assert out["non_tensor_batch"]["prompt"].tolist() == ["a", "b", "c", "d"]


def test_a_field_name_used_twice_needs_overwrite(
    transfer: Any, stored: Any, prefix: str, keys_of: Any
) -> None:
    before = keys_of(prefix)
    with pytest.raises(ValueError, match=r"already exist: \['input_ids'\].*overwrite=True"):
        transfer.append_dataproto_fields(stored, {"input_ids": torch.zeros(4, 2)}, stage="later")
    with pytest.raises(ValueError, match=r"already exist: \['prompt'\]"):
        transfer.append_dataproto_fields(
            export_ref(stored), {"non_tensor_batch": {"prompt": obj(list("wxyz"))}}, stage="rollout"
        )
    assert keys_of(prefix) == before
    still_reads(transfer, stored)


def test_one_name_in_batch_and_non_tensor_batch(transfer: Any, prefix: str, keys_of: Any) -> None:
    data = {"batch": {"x": torch.zeros(2, 1)}, "non_tensor_batch": {"x": obj(["a", "b"])}}
    with pytest.raises(ValueError, match=r"overlap: \['x'\]"):
        transfer.put_dataproto(data)
    assert keys_of(prefix) == []


@pytest.mark.parametrize("rows", [[4], [0, -5], slice(0, 2, -1), ["1"]])
def test_rows_out_of_range(transfer: Any, stored: Any, rows: Any) -> None:
    with pytest.raises((IndexError, ValueError, TypeError), match="row"):
        transfer.get_dataproto(stored, rows=rows)
    with pytest.raises(IndexError, match=r"row index 4 out of range for 4 rows"):
        transfer.get_dataproto(stored, fields=["prompt"], rows=[0, 4])
    still_reads(transfer, stored)


def test_a_handle_whose_manifests_were_cleaned_up(
    transfer: Any, sstore: Any, stored: Any, prefix: str
) -> None:
    handle = export_ref(stored)
    transfer.cleanup_dataproto(handle)
    fresh = MooncakeBundleTransfer(sstore, key_prefix=prefix)  # no manifest cache
    for call in (
        lambda: fresh.get_dataproto(handle),
        lambda: fresh.get_dataproto(import_ref(handle), fields=["prompt"], rows=[1]),
        lambda: fresh.dataproto_manifest_view(handle),
        lambda: fresh.append_dataproto_fields(handle, {"y": torch.zeros(4)}, stage="rollout"),
        lambda: fresh.cleanup_dataproto(handle),
    ):
        with pytest.raises(KeyError, match=r"'rollout'.*manifest .* is missing"):
            call()
    # The transfer that cleaned up (and the ref carrying manifests) fail too.
    with pytest.raises(KeyError, match=r"field 'input_ids'.*missing"):
        transfer.get_dataproto(stored, fields=["input_ids"])


@pytest.mark.parametrize("late", [object(), {1, 2}, complex(1, 2)])
def test_a_non_json_value_late_in_a_json_field(
    transfer: Any, stored: Any, prefix: str, keys_of: Any, late: Any
) -> None:
    before = keys_of(prefix)
    rows = [{"ok": i} for i in range(300)] + [{"ok": 300, "bad": late}]
    n = len(rows)
    with pytest.raises(ValueError, match=r"field 'meta'.* row 300"):
        transfer.put_dataproto({"non_tensor_batch": {"meta": obj(rows)}})
    schema = {"meta": FieldSchema("json_ragged", True, {"section": "non_tensor_batch"})}
    with pytest.raises(ValueError, match=r"field 'meta'.*row 300.*JSON"):
        transfer.put_dataproto({"non_tensor_batch": {"meta": obj(rows)}}, field_schemas=schema)
    with pytest.raises(ValueError, match=r"field 'meta'"):
        transfer.append_dataproto_fields(
            stored, {"non_tensor_batch": {"meta": obj(rows[-4:])}}, stage="more"
        )
    # Bytes are msgpack values, not JSON ones.
    raw = rows[:-1] + [{"ok": 300, "bad": b"\xff"}]
    with pytest.raises(ValueError, match=r"field 'meta'.*row 300.*JSON"):
        transfer.put_dataproto({"non_tensor_batch": {"meta": obj(raw)}}, field_schemas=schema)
    assert n == 301 and keys_of(prefix) == before
    still_reads(transfer, stored)


def test_nesting_deeper_than_the_limit(transfer: Any, prefix: str, keys_of: Any) -> None:
    deep: Any = 1
    for _ in range(40):
        deep = {"a": deep}
    with pytest.raises(ValueError, match=r"field 'deep'.*deeper than 32"):
        transfer.put_dataproto({"non_tensor_batch": {"deep": obj([deep, deep])}})
    assert keys_of(prefix) == []


def test_destinations_that_are_too_small(transfer: Any, stored: Any) -> None:
    small = np.empty(3, dtype=np.uint8)
    dest = raw_destination(small.ctypes.data, small.nbytes, small)
    with pytest.raises(ValueError, match=r"field 'input_ids'.*destination has 3 bytes"):
        transfer.get_dataproto(stored, batch_fields=["input_ids"], destinations={"input_ids": dest})
    arr = np.empty((1, 2), dtype=np.int64)
    with pytest.raises(
        ValueError, match=r"field 'input_ids'.*destination has 0 bytes, needs at least 336"
    ):
        transfer.get_dataproto(
            stored,
            fields=["input_ids"],
            rows=[0, 1],
            destinations={"input_ids": raw_destination(0, 0)},
        )
    stored2 = transfer.append_dataproto_fields(stored, {"n": np.zeros((4, 2))}, stage="np")
    with pytest.raises(ValueError, match=r"field 'n'.*shape mismatch"):
        transfer.get_dataproto(
            stored2, fields=["n"], rows=[0, 1, 2], destinations={"n": np.empty((2, 2))}
        )
    with pytest.raises(KeyError, match="not read"):
        transfer.get_dataproto(stored, fields=["prompt"], destinations={"input_ids": arr})
    still_reads(transfer, stored)


def test_inconsistent_batch_sizes_and_wrong_types(transfer: Any, prefix: str, keys_of: Any) -> None:
    with pytest.raises(
        ValueError, match=r"inconsistent batch sizes \(2 rows: \['b'\]; 3 rows: \['a'\]\)"
    ):
        transfer.put_dataproto(
            {"batch": {"a": torch.zeros(3)}, "non_tensor_batch": {"b": obj([1, 2])}}
        )
    with pytest.raises(TypeError, match="batch field 'a'"):
        transfer.put_dataproto({"batch": {"a": [1, 2, 3]}})
    with pytest.raises(ValueError, match=r"field 'o'.*no codec matched"):
        transfer.put_dataproto({"non_tensor_batch": {"o": obj([object(), object()])}})
    assert keys_of(prefix) == []


def test_a_failed_write_leaves_nothing(store_factory: Any, prefix: str, keys_of: Any) -> None:
    small = store_factory(global_segment_size=32 << 20, local_buffer_size=8 << 20)
    transfer = MooncakeBundleTransfer(small, key_prefix=prefix)
    big = np.zeros((2048, 1024), np.int64)  # 16 MiB per field, 48 MiB in all
    data = {"batch": {"a": big, "b": big, "c": big}, "non_tensor_batch": {"t": obj(["x"] * 2048)}}
    before = small.get_client_stats()
    with pytest.raises(RuntimeError, match=r"member 'batch\.(a|b|c)'.*nothing was kept"):
        transfer.put_dataproto(data)
    assert keys_of(prefix) == []
    assert small.get_client_stats()["master_rpcs"] > before["master_rpcs"]
