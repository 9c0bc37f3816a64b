"""Column encoders: a ``non_tensor_batch`` column to flat payloads.

Each codec stores a column as a few flat payloads (data bytes, offsets, null
masks, shapes) so a reader can fetch the bytes of selected rows by range.
Payloads given as :class:`Parts` point at caller memory and are written
without a copy. A structure whose leaves hold tensors, arrays or bytes is
stored leaf by leaf (``structured_recursive``), anything else as one
``msgpack_ragged`` column; a ``FieldSchema`` may name the codec instead.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack  # type: ignore[import-untyped]
import numpy as np

from mooncake.structured.common import (
    _RAGGED_TENSOR_DEFAULT_DTYPE,
    _TYPED_RAGGED_DEFAULT_DTYPE,
    MISSING,
    _Missing,
    require_torch,
    torch_module,
)
from mooncake.structured.infer import (
    _choose_leaf_codec,
    _CodecDecision,
    _InferredLeaf,
    _InferredNode,
    _is_bytes_like,
    _is_pil_image,
    _lookup_path,
    _non_null,
    infer_structure,
)


@dataclass
class _EncodedStructuredLeaf:
    codec: str
    rows: int
    payload: dict[str, Any]
    metadata: dict[str, Any]


@dataclass
class Parts:
    """Bytes given as pieces of caller memory, stored concatenated.

    ``dtype`` and ``count`` describe the concatenation as a flat typed array
    (``None`` for raw bytes); ``owners`` keep the pieces alive until written.
    """

    pieces: list[tuple[int, int]]
    owners: list[Any]
    dtype: str | None = None
    count: int | None = None

    @property
    def nbytes(self) -> int:
        return sum(n for _p, n in self.pieces)


def parts_of_arrays(arrays: Sequence[np.ndarray], dtype: np.dtype[Any]) -> Parts:
    """The C-order bytes of contiguous ``arrays`` as pieces (no copy)."""
    pieces = [(int(a.ctypes.data), int(a.nbytes)) for a in arrays if a.nbytes]
    return Parts(pieces, list(arrays), np.dtype(dtype).str, sum(int(a.size) for a in arrays))


def parts_of_bytes(chunks: Sequence[bytes]) -> Parts:
    """Byte strings as one joined payload (one copy, in C)."""
    joined = b"".join(chunks)
    arr = np.frombuffer(joined, dtype=np.uint8)
    return Parts([(int(arr.ctypes.data), len(joined))] if joined else [], [arr])


def _nulls(values: Sequence[Any]) -> np.ndarray:
    return np.fromiter((v is None for v in values), dtype=np.bool_, count=len(values))


def _offsets(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.asarray(lengths, dtype=np.int64), out=out[1:])
    return out


def _contiguous(value: Any, dtype: np.dtype[Any]) -> np.ndarray:
    if isinstance(value, np.ndarray) and value.dtype == dtype and value.flags.c_contiguous:
        return value
    return np.ascontiguousarray(np.asarray(value, dtype=dtype))


def _ragged_layout(
    values: Sequence[Any],
    row_shapes: Sequence[tuple[int, ...] | None],
    data: Parts,
    dtype_name: str,
    row_format: str,
    ndarray_rows: list[bool] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ragged layout of rows with shapes ``row_shapes`` (``None`` for a
    null row) whose elements are ``data``: element offsets, shapes padded to
    the largest ndim, ndims and nulls, plus the metadata describing them."""
    rows = len(values)
    max_ndim = max((len(s) for s in row_shapes if s is not None), default=0)
    shapes = np.zeros((rows, max(max_ndim, 1)), dtype=np.int64)
    ndims = np.zeros(rows, dtype=np.int16)
    lengths = np.zeros(rows, dtype=np.int64)
    for row, shape in enumerate(row_shapes):
        if shape is None:
            continue
        ndims[row] = len(shape)
        lengths[row] = math.prod(shape)
        if shape:
            shapes[row, : len(shape)] = shape
    return (
        {
            "data": data,
            "offsets": _offsets(lengths),
            "shapes": shapes,
            "ndims": ndims,
            "nulls": _nulls(values),
        },
        {
            "dtype": dtype_name,
            "max_ndim": int(max_ndim),
            "shape_policy": "ragged",
            "row_format": row_format,
            "ndarray_rows": ndarray_rows,
        },
    )


def encode_typed_ragged(
    values: Sequence[Any], dtype_hint: Any = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Numeric rows of any shape: flat data, element offsets, shapes, ndims, nulls."""
    if dtype_hint is None:
        sources = [np.asarray(v) for v in values if v is not None]
        dtype = np.result_type(*sources) if sources else np.dtype(_TYPED_RAGGED_DEFAULT_DTYPE)
    else:
        dtype = np.dtype(dtype_hint)
    if dtype.hasobject or dtype.kind not in "biufc":
        raise ValueError(f"typed_ragged codec requires a numeric dtype, got {dtype}")
    arrays = [None if v is None else _contiguous(v, dtype) for v in values]
    present = [a for a in arrays if a is not None]
    is_array = [isinstance(v, np.ndarray) for v in values]
    if all(v is None or a for v, a in zip(values, is_array, strict=True)):
        row_format = "ndarray"
    elif any(is_array):
        row_format = "mixed"
    else:
        row_format = "list"
    return _ragged_layout(
        values,
        [None if a is None else a.shape for a in arrays],
        parts_of_arrays(present, dtype),
        str(dtype),
        row_format,
        is_array if row_format == "mixed" else None,
    )


def encode_ragged_tensor(values: Sequence[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Tensor rows of one dtype: the typed_ragged layout over the tensors' own
    memory (CPU, contiguous; others are copied to that first)."""
    torch = torch_module()
    dtype = None
    tensors: list[Any] = []
    for v in values:
        if v is None:
            tensors.append(None)
            continue
        if isinstance(v, np.ndarray):
            if v.dtype == object:
                raise ValueError("ragged tensor codec requires numeric rows")
            v = require_torch().from_numpy(np.ascontiguousarray(v))
        elif torch is None or not isinstance(v, torch.Tensor):
            raise TypeError(f"ragged tensor codec requires tensors, got {type(v).__name__}")
        t = v
        if t.device.type != "cpu" or not t.is_contiguous():
            t = t.detach().cpu().contiguous()
        if dtype is None:
            dtype = t.dtype
        elif t.dtype != dtype:
            raise ValueError(f"mixed tensor dtype: {dtype} vs {t.dtype}")
        tensors.append(t)
    present = [t for t in tensors if t is not None]
    dtype_name = str(dtype) if dtype is not None else _RAGGED_TENSOR_DEFAULT_DTYPE
    itemsize = present[0].element_size() if present else 4
    pieces = [(int(t.data_ptr()), int(t.numel()) * itemsize) for t in present if t.numel()]
    return _ragged_layout(
        values,
        [None if t is None else tuple(t.shape) for t in tensors],
        Parts(pieces, present),
        dtype_name,
        "tensor",
        None,
    )


def encode_numeric_scalars(
    values: Sequence[Any], dtype: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    dt = np.dtype(dtype)
    fill = False if dt == np.bool_ else 0
    data = np.asarray([fill if v is None else v for v in values], dtype=dt)
    return {"data": data, "nulls": _nulls(values)}, {
        "dtype": str(data.dtype),
        "shape": list(data.shape),
    }


def _media_bytes(value: Any) -> tuple[bytes, dict[str, Any]]:
    if value is None:
        return b"", {"kind": "null"}
    if _is_bytes_like(value):
        return bytes(value), {"kind": "bytes"}
    if _is_pil_image(value):
        return value.tobytes(), {
            "kind": "pil_raw",
            "mode": value.mode,
            "size": list(value.size),
            "format": getattr(value, "format", None),
        }
    return bytes(value), {"kind": "bytes"}


def encode_byte_rows(
    chunks: Sequence[bytes | None], encodings: list[dict[str, Any]] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Rows already as bytes (``None`` for nulls): joined data, byte offsets, nulls."""
    lengths = [0 if c is None else len(c) for c in chunks]
    metadata: dict[str, Any] = {}
    if encodings is not None and any(e.get("kind") == "pil_raw" for e in encodings):
        metadata["media_encodings"] = encodings
        metadata["media_types"] = ["image/raw"]
    return (
        {
            "data": parts_of_bytes([c for c in chunks if c]),
            "offsets": _offsets(lengths),
            "nulls": _nulls(chunks),
        },
        metadata,
    )


def encode_text(values: Sequence[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    strings = [v for v in values if v is not None]
    if all(s.isascii() for s in strings):
        joined = "".join(strings).encode("ascii")
        lengths = [0 if v is None else len(v) for v in values]
        arr = np.frombuffer(joined, dtype=np.uint8)
        data = Parts([(int(arr.ctypes.data), len(joined))] if joined else [], [arr])
        return {"data": data, "offsets": _offsets(lengths), "nulls": _nulls(values)}, {}
    return encode_byte_rows([None if v is None else v.encode("utf-8") for v in values])


def _serialized_rows(
    path: str,
    values: Sequence[Any],
    serialize: Callable[[Any], bytes],
    errors: tuple[type[Exception], ...],
    problem: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Byte rows of ``serialize(value)`` per non-null row; a row it fails on
    with one of ``errors`` raises ``ValueError`` saying the value is ``problem``."""
    chunks: list[bytes | None] = []
    for row, v in enumerate(values):
        if v is None:
            chunks.append(None)
            continue
        try:
            chunks.append(serialize(v))
        except errors as exc:
            raise ValueError(f"field {path!r} row {row}: value is {problem} ({exc})") from None
    return encode_byte_rows(chunks)


def encode_msgpack(path: str, values: Sequence[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    packer = msgpack.Packer(use_bin_type=True, strict_types=True)
    return _serialized_rows(
        path,
        values,
        packer.pack,
        (TypeError, ValueError, OverflowError),
        "not serializable by the msgpack_ragged codec",
    )


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def encode_json(path: str, values: Sequence[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return _serialized_rows(
        path,
        values,
        _json_bytes,
        (TypeError, ValueError, OverflowError, RecursionError),
        "not JSON-serializable",
    )


def encode_media_lists(values: Sequence[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    items: list[bytes] = []
    encodings: list[dict[str, Any]] = []
    row_lengths: list[int] = []
    for v in values:
        row = [] if v is None else list(v)
        for item in row:
            data, enc = _media_bytes(item)
            items.append(data)
            encodings.append(enc)
        row_lengths.append(len(row))
    return (
        {
            "data": parts_of_bytes(items),
            "row_offsets": _offsets(row_lengths),
            "byte_offsets": _offsets([len(i) for i in items]),
            "nulls": _nulls(values),
        },
        {"encode_source": "raw_pixels_from_object", "media_encodings": encodings},
    )


def _encode_rows(
    path: str, values: list[Any], codec: str, dtype: Any
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Payload and metadata of ``values`` under the column codec ``codec``
    (``dtype`` serves ``typed_ragged`` and ``ndarray``); ``None`` for a codec
    that is not a column codec."""
    if codec == "ragged_tensor":
        return encode_ragged_tensor(values)
    if codec == "typed_ragged":
        return encode_typed_ragged(values, dtype)
    if codec == "media_list_ragged":
        return encode_media_lists(values)
    if codec == "ndarray":
        return encode_numeric_scalars(values, dtype)
    if codec in ("bytes_ragged", "media_bytes"):
        pairs = [_media_bytes(v) for v in values]
        return encode_byte_rows(
            [None if v is None else b for v, (b, _e) in zip(values, pairs, strict=True)],
            [e for _b, e in pairs],
        )
    if codec == "utf8_ragged":
        return encode_text(values)
    if codec == "msgpack_ragged":
        return encode_msgpack(path, values)
    if codec == "json_ragged":
        return encode_json(path, values)
    return None


def encode_leaf(path: str, values: list[Any], decision: _CodecDecision) -> _EncodedStructuredLeaf:
    """Encode a column with an accepted decision (``ValueError`` otherwise)."""
    if not decision.accepted:
        raise ValueError(
            f"field {path!r}: unsupported structured non-tensor values ({decision.reason})"
        )
    codec = decision.codec
    dtype = decision.metadata["dtype"] if codec == "ndarray" else decision.metadata.get("dtype")
    encoded = _encode_rows(path, values, codec, dtype)
    if encoded is None:
        raise ValueError(f"field {path!r}: unsupported codec {codec!r}")
    payload, metadata = encoded
    metadata.update(
        {
            "schema_source": "inferred_from_runtime_values",
            "decision_reason": decision.reason,
            "normalized_type": decision.normalized_type,
            **{k: v for k, v in decision.metadata.items() if k != "dtype" or k not in metadata},
        }
    )
    return _EncodedStructuredLeaf(codec, len(values), payload, metadata)


def _recursive_leaf_needed(leaf: _InferredLeaf) -> bool:
    codec = leaf.decision.codec
    if codec in {"ragged_tensor", "bytes_ragged", "media_bytes", "media_list_ragged"}:
        return True
    return codec == "typed_ragged" and any(
        isinstance(v, np.ndarray) for v in _non_null(leaf.values)
    )


def encode_recursive(
    path: str, values: list[Any], leaves: list[_InferredLeaf], nodes: list[_InferredNode]
) -> _EncodedStructuredLeaf:
    """Store an expanded structure leaf by leaf, with per-node masks."""
    payload: dict[str, Any] = {}
    node_specs: list[dict[str, Any]] = []
    for i, node in enumerate(nodes):
        spec: dict[str, Any] = {
            "id": i,
            "path": node.path,
            "node_type": node.node_type,
            "children": list(node.children),
        }
        payload[f"node.{i}.missing"] = np.fromiter(
            (_lookup_path(v, path, node.path) is MISSING for v in values),
            dtype=np.bool_,
            count=len(values),
        )
        spec["missing_payload"] = f"node.{i}.missing"
        if node.row_mask is not None:
            payload[f"node.{i}.row_mask"] = np.asarray(node.row_mask, dtype=np.bool_)
            spec["row_mask_payload"] = f"node.{i}.row_mask"
        if node.lengths is not None:
            payload[f"node.{i}.lengths"] = np.asarray(node.lengths, dtype=np.int64)
            spec["lengths_payload"] = f"node.{i}.lengths"
        node_specs.append(spec)
    leaf_specs: list[dict[str, Any]] = []
    for i, leaf in enumerate(leaves):
        missing = [isinstance(v, _Missing) for v in leaf.values]
        column = [None if m else v for m, v in zip(missing, leaf.values, strict=True)]
        decision = leaf.decision
        if not decision.accepted and not _non_null(leaf.values):
            decision = _CodecDecision(True, "json_ragged", "all rows are null or missing", "json")
        encoded = encode_leaf(leaf.path, column, decision)
        members: dict[str, str] = {}
        for name, value in encoded.payload.items():
            payload[f"leaf.{i}.{name}"] = value
            members[name] = f"leaf.{i}.{name}"
        payload[f"leaf.{i}.missing"] = np.asarray(missing, dtype=np.bool_)
        members["missing"] = f"leaf.{i}.missing"
        leaf_specs.append(
            {
                "id": i,
                "path": leaf.path,
                "codec": encoded.codec,
                "rows": encoded.rows,
                "metadata": encoded.metadata,
                "payload_members": members,
            }
        )
    return _EncodedStructuredLeaf(
        "structured_recursive",
        len(values),
        payload,
        {
            "schema_source": "inferred_from_runtime_values",
            "structure_version": 1,
            "root_path": path,
            "nodes": node_specs,
            "leaves": leaf_specs,
        },
    )


def encode_inferred(path: str, values: list[Any]) -> _EncodedStructuredLeaf:
    """Encode an object column with the codec inferred from its values
    (``mooncake.structured.infer``)."""
    leaves: list[_InferredLeaf] = []
    nodes: list[_InferredNode] = []
    infer_structure(path, values, leaves, nodes)
    if nodes and any(_recursive_leaf_needed(leaf) for leaf in leaves):
        return encode_recursive(path, values, leaves, nodes)
    return encode_leaf(path, values, _choose_leaf_codec(values))


def _normalize_scalar(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return _normalize_scalar(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {k: _normalize_scalar(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalize_scalar(v) for v in value]
    return value


def ragged_tensor_dict_keys(keys: Any) -> list[str]:
    out: list[str] = []
    for key in keys:
        if not isinstance(key, str) or not key:
            raise ValueError(f"ragged_tensor_dict keys must be non-empty strings, got {key!r}")
        if any(sep in key for sep in (".", "/", "\\")):
            raise ValueError(f"ragged_tensor_dict key {key!r} must not contain '.', '/' or '\\'")
        if key in out:
            raise ValueError(f"ragged_tensor_dict keys contain duplicate key {key!r}")
        out.append(key)
    return out


def encode_ragged_tensor_dict(
    path: str, values: list[Any], declared: Any
) -> _EncodedStructuredLeaf:
    keys = None if declared is None else ragged_tensor_dict_keys(declared)
    seen: set[str] = set()
    for row, item in enumerate(values):
        if item is None:
            continue
        if not isinstance(item, Mapping):
            raise TypeError(
                f"field {path!r} row {row}: ragged_tensor_dict rows must be mappings or None, "
                f"got {type(item).__name__}"
            )
        nulls = sorted(k for k, v in item.items() if v is None)
        if nulls:
            raise TypeError(f"field {path!r} row {row}: explicit None for keys {nulls}")
        row_keys = ragged_tensor_dict_keys(item.keys())
        if keys is not None and set(row_keys) - set(keys):
            raise ValueError(
                f"field {path!r} row {row} has keys not declared: {sorted(set(row_keys) - set(keys))}"
            )
        seen.update(row_keys)
    if keys is None:
        keys = sorted(seen)
    payload: dict[str, Any] = {"null_mask": _nulls(values)}
    key_codecs: dict[str, Any] = {}
    for key in keys:
        column = [None if v is None else v.get(key) for v in values]
        sub, meta = encode_ragged_tensor(column)
        for name, value in sub.items():
            payload[f"{key}.{name}"] = value
        key_codecs[key] = meta
    return _EncodedStructuredLeaf(
        "ragged_tensor_dict", len(values), payload, {"keys": keys, "key_codecs": key_codecs}
    )


def schema_dtype(metadata: Mapping[str, Any]) -> np.dtype[Any] | None:
    name = metadata.get("dtype")
    if name is None:
        return None
    try:
        dtype: np.dtype[Any] = np.dtype(name)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"invalid FieldSchema metadata['dtype']: {name!r}") from exc
    if dtype.kind not in "biufc":
        raise ValueError(f"FieldSchema metadata['dtype'] must be numeric or bool, got {dtype}")
    return dtype


def encode_with_codec(
    path: str, values: list[Any], codec: str, metadata: Mapping[str, Any]
) -> _EncodedStructuredLeaf:
    """Encode with a codec named by a ``FieldSchema`` (no inference)."""
    if codec == "auto":
        return encode_fallback(path, values)
    if codec == "ragged_tensor_dict":
        return encode_ragged_tensor_dict(path, values, metadata.get("keys"))
    dtype = schema_dtype(metadata) if codec in ("typed_ragged", "ndarray") else None
    if codec == "ndarray" and dtype is None:
        return encode_fallback(path, values)
    encoded = _encode_rows(path, values, codec, dtype)
    if encoded is None:
        raise ValueError(f"unsupported schema codec: {codec!r}")
    payload, meta = encoded
    return _EncodedStructuredLeaf(codec, len(values), payload, meta)


def encode_fallback(path: str, values: list[Any]) -> _EncodedStructuredLeaf:
    """The inferred codec, then msgpack, then JSON of plain Python values."""
    errors: list[str] = []
    leaves: list[_InferredLeaf] = []
    nodes: list[_InferredNode] = []
    try:
        infer_structure(path, values, leaves, nodes)
        if nodes and any(_recursive_leaf_needed(leaf) for leaf in leaves):
            return encode_recursive(path, values, leaves, nodes)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        errors.append(f"structured_recursive: {exc}")
    decision = _choose_leaf_codec(values)
    tried = [decision.codec] + [c for c in ("msgpack_ragged", "json_ragged") if c != decision.codec]
    for codec in tried:
        column = (
            [_normalize_scalar(v) for v in values]
            if codec in ("msgpack_ragged", "json_ragged")
            else values
        )
        try:
            meta = dict(decision.metadata) if codec == decision.codec else {}
            return encode_with_codec(path, column, codec, meta)
        except (TypeError, ValueError, OverflowError, RecursionError, RuntimeError) as exc:
            errors.append(f"{codec}: {exc}")
    raise ValueError(f"field {path!r}: no codec can store these values; tried {errors}")
