"""Values to store members: tensors, arrays, byte strings, tensor-object
buffers and encoded ``non_tensor_batch`` columns become members (a field
spec plus pieces of memory, kept alive until written)."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mooncake.structured.common import is_tensor
from mooncake.structured.dataproto import _schema_for
from mooncake.structured.encode import (
    Parts,
    _EncodedStructuredLeaf,
    encode_inferred,
    encode_with_codec,
)
from mooncake.structured.memory import (
    TENSOR_HEADER_BYTES,
    _byte_array,
    _header_shape,
    _prod,
)
from mooncake.structured.objects import (
    BundleTransferPolicy,
    FieldSchema,
    _TensorObjectBufferPayload,
)
from mooncake.structured.refs import (
    StructuredFieldLocation,
    _json_safe,
)


@dataclass
class _Member:
    """One member to store: field spec, payload spec extras and its pieces."""

    fspec: dict[str, Any]
    pieces: list[tuple[int, int]]
    owners: list[Any]
    tensor: bool = False
    caller_object: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _encode_member(name: str, value: Any, policy: BundleTransferPolicy) -> _Member:
    if isinstance(value, _TensorObjectBufferPayload):
        header = ctypes.string_at(value.ptr, min(value.size, TENSOR_HEADER_BYTES))
        if len(header) < TENSOR_HEADER_BYTES:
            raise ValueError(
                f"member {name!r}: a tensor object buffer holds at least {TENSOR_HEADER_BYTES} bytes"
            )
        shape = _header_shape(header)
        data = int(np.frombuffer(header, "<u8", 1, 32)[0])
        element = data // max(_prod(shape), 1) if _prod(shape) else 0
        return _Member(
            {"encoding": "torch_tensor", "shape": shape, "element_size": element},
            [(value.ptr, value.size)],
            [value.owner],
            tensor=True,
            caller_object=True,
        )
    if policy.copy_mode == "zero_copy":
        if is_tensor(value):
            raise ValueError(
                f"member {name!r}: zero-copy structured tensor fields require a BufferPool tensor-object buffer"
            )
        raise RuntimeError(f"member {name!r}: zero-copy put requires tensor-object buffers")
    if is_tensor(value):
        t = value.detach()
        if t.is_nested:
            raise ValueError(f"member {name!r}: nested (jagged) tensors are not supported")
        if t.device.type != "cpu" or not t.is_contiguous():
            t = t.cpu().contiguous()
        from mooncake.store import _serialize_tensor

        header, ptr, nbytes, owner = _serialize_tensor(t)
        hdr = np.frombuffer(bytes(header), dtype=np.uint8)
        pieces = [(int(hdr.ctypes.data), hdr.nbytes)]
        if nbytes:
            pieces.append((int(ptr), int(nbytes)))
        return _Member(
            {
                "encoding": "torch_tensor",
                "dtype": str(t.dtype),
                "shape": list(t.shape),
                "element_size": int(t.element_size()),
            },
            pieces,
            [hdr, t, owner],
            tensor=True,
            extra={"dtype": str(t.dtype), "shape": list(t.shape)},
        )
    if isinstance(value, Parts):
        fspec: dict[str, Any] = {"encoding": "bytes"}
        if value.dtype is not None and value.count is not None:
            fspec = {"encoding": "ndarray", "dtype": value.dtype, "shape": [value.count]}
        return _Member(fspec, list(value.pieces), value.owners)
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError(
                f"member {name!r}: object arrays cannot be stored as raw ndarray members"
            )
        arr = np.ascontiguousarray(value)
        return _Member(
            {"encoding": "ndarray", "dtype": arr.dtype.str, "shape": list(arr.shape)},
            [(int(arr.ctypes.data), arr.nbytes)] if arr.nbytes else [],
            [arr],
        )
    arr = _byte_array(value, f"member {name!r}")
    return _Member(
        {"encoding": "bytes"}, [(int(arr.ctypes.data), arr.nbytes)] if arr.nbytes else [], [arr]
    )


def _encode_non_tensor(
    path: str, value: Any, schema: FieldSchema | None
) -> _EncodedStructuredLeaf | np.ndarray:
    if isinstance(value, (list, tuple)) or (
        schema is not None and not isinstance(value, np.ndarray)
    ):
        if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Sequence):
            raise TypeError("a non_tensor_batch field must be an ndarray or a non-string sequence")
        arr = np.empty(len(value), dtype=object)
        for i, v in enumerate(value):
            arr[i] = v
        value = arr
    if not isinstance(value, np.ndarray):
        raise TypeError(
            f"a non_tensor_batch field must be a numpy.ndarray, got {type(value).__name__}"
        )
    if schema is not None and schema.codec != "auto":
        values = list(value)
        if not schema.nullable and any(v is None for v in values):
            raise ValueError(f"FieldSchema for {path!r} is not nullable")
        return encode_with_codec(path, values, schema.codec, schema.metadata)
    if schema is not None and not schema.nullable and any(v is None for v in value.flat):
        raise ValueError(f"FieldSchema for {path!r} is not nullable")
    if value.dtype != object:
        return value
    return encode_inferred(path, list(value))


def _encode_batch_fields(
    batch: Mapping[str, Any],
    stage: str,
    p: BundleTransferPolicy,
    members: dict[str, _Member],
    index: dict[str, StructuredFieldLocation],
) -> None:
    """Encodes the ``batch`` (tensor) fields into ``members`` and ``index``."""
    for name, value in batch.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"DataProto field names must be non-empty strings, got {name!r}")
        if not (is_tensor(value) or isinstance(value, (np.ndarray, _TensorObjectBufferPayload))):
            raise TypeError(
                f"batch field {name!r} must be a torch.Tensor, numpy.ndarray or tensor_object_buffer, "
                f"got {type(value).__name__}"
            )
        if isinstance(value, np.ndarray) and value.dtype.hasobject:
            raise TypeError(f"batch field {name!r} is an object array; put it in non_tensor_batch")
        member = f"batch.{name}"
        try:
            members[member] = _encode_member(member, value, p)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise type(exc)(f"batch field {name!r}: {exc}") from exc
        index[name] = StructuredFieldLocation(stage, member, "batch")


def _encode_non_tensor_fields(
    non_tensor: Mapping[str, Any],
    stage: str,
    p: BundleTransferPolicy,
    field_schemas: Mapping[str, FieldSchema] | None,
    members: dict[str, _Member],
    index: dict[str, StructuredFieldLocation],
    encoded_updates: dict[str, Any],
) -> None:
    """Encodes the ``non_tensor_batch`` fields into ``members``, ``index``
    and ``encoded_updates`` (the codec record of each encoded field)."""
    for name, value in non_tensor.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"DataProto field names must be non-empty strings, got {name!r}")
        path = f"non_tensor_batch.{name}"
        try:
            encoded = _encode_non_tensor(
                path, value, _schema_for(field_schemas, name, "non_tensor_batch")
            )
            if p.copy_mode == "zero_copy":
                raise RuntimeError("zero-copy put requires tensor-object buffers")
        except (TypeError, ValueError, RuntimeError, RecursionError, OverflowError) as exc:
            kind = (
                type(exc) if isinstance(exc, (TypeError, ValueError, RuntimeError)) else ValueError
            )
            raise kind(f"non_tensor_batch field {name!r}: {exc}") from exc
        if isinstance(encoded, np.ndarray):
            members[path] = _encode_member(path, encoded, p)
            index[name] = StructuredFieldLocation(stage, path, "non_tensor_batch")
            continue
        payload_members: dict[str, str] = {}
        for pname, pvalue in encoded.payload.items():
            member = f"{path}.{pname}"
            members[member] = _encode_member(member, pvalue, p)
            payload_members[pname] = member
        index[name] = StructuredFieldLocation(stage, path, "non_tensor_batch")
        encoded_updates[name] = {
            "codec": encoded.codec,
            "rows": encoded.rows,
            "metadata": _json_safe(encoded.metadata),
            "payload_members": payload_members,
        }
