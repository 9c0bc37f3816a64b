"""Real callers' call sequences.

* miles (``miles/utils/object_store.py``): ``MooncakeBundleTransfer(store,
  key_prefix="miles-object-store")``; ``put(value, type="dict",
  namespace="miles", chunk_bytes=..., config=..., field_schemas=...)`` with
  ``FieldSchema(codec, nullable=False, metadata={"section": ..., "dtype": ...})``
  from its ``ROLLOUT_DATA_VALUE_SPEC``; the handle travels as
  ``export_ref(ref)``; the trainer calls ``get(import_ref(h), type="dict")``,
  releases with ``MooncakeBundleTransfer.release_result`` and removes with
  ``cleanup_dataproto(import_ref(h))``; a later get raises.
* verl: ``DataProto`` objects (``batch`` of tensors, ``non_tensor_batch`` of
  object arrays, ``meta_info``) go through ``put_dataproto`` and come back
  with ``data_cls=DataProto`` (``DataProto.from_dict(tensors, non_tensors,
  meta_info=...)``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from mooncake.store import ReplicateConfig
from mooncake.structured_object_store import (
    FieldSchema,
    MooncakeBundleTransfer,
    export_ref,
    import_ref,
)


@dataclass(frozen=True)
class ValueSpec:
    codec: str
    dtype: str | None = None


ROLLOUT_DATA_VALUE_SPEC = {
    **{f: ValueSpec(codec="typed_ragged") for f in ("tokens", "loss_masks", "rollout_log_probs")},
    "partition": ValueSpec(codec="ndarray", dtype="int64"),
    "response_lengths": ValueSpec(codec="ndarray", dtype="int64"),
    "rewards": ValueSpec(codec="ndarray", dtype="float32"),
    "truncated": ValueSpec(codec="ndarray", dtype="int64"),
    "sample_indices": ValueSpec(codec="ndarray", dtype="int64"),
    "multimodal_train_inputs": ValueSpec(codec="ragged_tensor_dict"),
    "prompt": ValueSpec(codec="msgpack_ragged"),
    "metadata": ValueSpec(codec="msgpack_ragged"),
    "raw_reward": ValueSpec(codec="auto"),
    "total_lengths": ValueSpec(codec="auto"),
}


def field_schemas_for_value(value: dict, value_spec: dict | None) -> dict | None:
    if value_spec is None:
        return None
    return {
        field: FieldSchema(
            codec=spec.codec,
            nullable=False,
            metadata={
                "section": "meta_info" if spec.codec == "auto" else "non_tensor_batch",
                **({"dtype": spec.dtype} if spec.dtype is not None else {}),
            },
        )
        for field, spec in value_spec.items()
        if field in value
    }


def rollout_data() -> dict[str, Any]:
    return {
        "tokens": [
            torch.tensor([1, 2, 3], dtype=torch.int32),
            torch.tensor([4, 5], dtype=torch.int32),
        ],
        "loss_masks": [
            torch.tensor([1, 1, 1], dtype=torch.int32),
            torch.tensor([1, 1], dtype=torch.int32),
        ],
        "rollout_log_probs": [
            torch.tensor([-0.5, -1.0], dtype=torch.float32),
            torch.tensor([-2.0]),
        ],
        "rewards": [0.5, 1.0],
        "response_lengths": [3, 2],
        "partition": [0, 1],
        "sample_indices": [0, 1],
        "truncated": [0, 0],
        "raw_reward": [0.5, 1.0],
        "total_lengths": [3, 2],
        "prompt": ["hello", "world"],
        "metadata": [{"a": 1}, {"b": 2}],
        "multimodal_train_inputs": [
            {"pixel_values": torch.ones(2, 3)},
            {"pixel_values": torch.zeros(1, 3)},
        ],
    }


def tolist(v: Any) -> list:
    return v.tolist() if hasattr(v, "tolist") else list(v)


@pytest.mark.parametrize("replicas", [1, 2])
def test_miles_object_store_sequence(store_factory: Any, replicas: int) -> None:
    writer = store_factory()
    trainer = store_factory()
    rollout = MooncakeBundleTransfer(writer, key_prefix="miles-object-store")
    config = None
    if replicas > 1:
        config = ReplicateConfig()
        config.replica_num = replicas
    value = rollout_data()
    ref = rollout.put(
        value,
        type="dict",
        namespace="miles",
        chunk_bytes=None,
        config=config,
        field_schemas=field_schemas_for_value(value, ROLLOUT_DATA_VALUE_SPEC),
    )
    box = json.loads(json.dumps(export_ref(ref)))  # crosses Ray as a Box(export_ref(ref))

    train = MooncakeBundleTransfer(trainer, key_prefix="miles-object-store")
    fetched = train.get(import_ref(box), type="dict")
    assert sorted(fetched) == sorted(value)
    assert [tolist(t) for t in fetched["tokens"]] == [tolist(t) for t in value["tokens"]]
    assert tolist(fetched["rewards"]) == value["rewards"]
    assert tolist(fetched["raw_reward"]) == value["raw_reward"]
    assert tolist(fetched["total_lengths"]) == value["total_lengths"]
    assert list(fetched["prompt"]) == value["prompt"]
    assert list(fetched["metadata"]) == value["metadata"]
    assert torch.equal(fetched["multimodal_train_inputs"][0]["pixel_values"], torch.ones(2, 3))
    MooncakeBundleTransfer.release_result(fetched)

    train.cleanup_dataproto(import_ref(box))
    with pytest.raises(Exception):  # noqa: B017 - miles expects any exception
        train.get(import_ref(box), type="dict")
    with pytest.raises(Exception):  # noqa: B017
        MooncakeBundleTransfer(trainer, key_prefix="miles-object-store").get(
            import_ref(box), type="dict"
        )


class TensorDictLike(dict):
    """verl's ``batch`` is a TensorDict: mapping-like with ``items()``."""


class DataProto:
    """The parts of verl's DataProto the transfer touches."""

    def __init__(self, batch=None, non_tensor_batch=None, meta_info=None) -> None:
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch or {}
        self.meta_info = meta_info or {}

    @classmethod
    def from_dict(
        cls, tensors, non_tensors=None, meta_info=None, num_batch_dims=1, auto_padding=False
    ):
        return cls(TensorDictLike(tensors), non_tensors or {}, meta_info or {})

    def __len__(self) -> int:
        return len(next(iter(self.batch.values())))


def test_verl_dataproto_stage_sequence(transfer: Any) -> None:
    n = 8
    rollout = DataProto(
        TensorDictLike(
            input_ids=torch.randint(0, 1000, (n, 16)),
            attention_mask=torch.ones(n, 16, dtype=torch.int64),
            responses=torch.randint(0, 1000, (n, 8)),
        ),
        {
            "uid": np.array([f"uid-{i}" for i in range(n)], dtype=object),
            "raw_prompt": np.array(
                [[{"role": "user", "content": f"q{i}"}] for i in range(n)] + [None], dtype=object
            )[:n],
        },
        {"global_steps": 3, "eos_token_id": 2},
    )
    ref = transfer.put_dataproto(rollout, namespace="verl", partition="step-3", stage="rollout")
    old = DataProto(TensorDictLike(old_log_probs=torch.randn(n, 8)), {}, {"temperature": 1.0})
    ref = transfer.append_dataproto_fields(ref, old, stage="old_log_prob")
    adv = DataProto(TensorDictLike(advantages=torch.randn(n, 8), returns=torch.randn(n, 8)), {}, {})
    ref = transfer.append_dataproto_fields(export_ref(ref), adv, stage="adv")
    mb = transfer.get_dataproto(
        export_ref(ref),
        batch_fields=["input_ids", "old_log_probs", "advantages"],
        non_tensor_fields=["uid"],
        meta_info_keys=["global_steps", "temperature"],
        data_cls=DataProto,
        rows=slice(2, 6),
    )
    assert isinstance(mb, DataProto) and len(mb) == 4
    assert torch.equal(mb.batch["input_ids"], rollout.batch["input_ids"][2:6])
    assert torch.equal(mb.batch["old_log_probs"], old.batch["old_log_probs"][2:6])
    assert mb.non_tensor_batch["uid"].tolist() == [f"uid-{i}" for i in range(2, 6)]
    assert mb.meta_info == {"global_steps": 3, "temperature": 1.0}
    full = transfer.get_dataproto(ref, non_tensor_fields=["raw_prompt"])
    assert full["non_tensor_batch"]["raw_prompt"][5] == [{"role": "user", "content": "q5"}]
    transfer.cleanup_dataproto(ref)
