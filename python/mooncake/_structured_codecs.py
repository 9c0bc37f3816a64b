"""Leaf codecs and structure inference of ``mooncake.structured_object_store``.

A ``non_tensor_batch`` field is a column of per-row Python values. It is
stored as a few flat payloads (data bytes, offsets, null masks, shapes) so a
reader can fetch the bytes of selected rows by range. The codec of a column
is chosen from its values:

* every non-null row a ``torch.Tensor`` of one dtype: ``ragged_tensor``;
* every row a list of bytes-like or PIL images: ``media_list_ragged``;
* every row a numeric ``numpy.ndarray``: ``typed_ragged`` (rows come back as
  arrays), numeric lists or tuples: ``typed_ragged`` (rows come back as lists);
* numeric scalars (``bool``, ``int``, ``float``, numpy numbers): ``ndarray``;
* bytes-like: ``bytes_ragged``; PIL images: ``media_bytes``; ``str``:
  ``utf8_ragged``; dicts, lists and tuples: ``msgpack_ragged``;
* anything else is not accepted (``msgpack_ragged`` named as the fallback).

``None`` rows are nulls of any codec. Columns of dicts and short lists are
first expanded by :func:`infer_structure` into interior nodes and leaf
columns (paths like ``root.key`` and ``root[0]``, with ``.``, ``[`` and ``\\``
escaped in keys); a structure whose leaves hold tensors, arrays or bytes is
stored leaf by leaf (``structured_recursive``), anything else as one
``msgpack_ragged`` column. Expansion deeper than 32 levels is a ``ValueError``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack  # type: ignore[import-untyped]
import numpy as np

_INFER_MAX_STRUCT_KEYS = 64
_INFER_MAX_LIST_LEN = 8
_INFER_MAX_SAMPLE_ROWS = 128
_INFER_MAX_JSON_BYTES = 1 << 20
_INFER_MAX_DEPTH = 32
_TYPED_RAGGED_DEFAULT_DTYPE = "int64"
_RAGGED_TENSOR_DEFAULT_DTYPE = "torch.float32"
_RAGGED_TENSOR_PAYLOAD_NAMES = frozenset({"data", "offsets", "shapes", "ndims", "nulls"})
BYTES_CODECS = frozenset(
    {"media_bytes", "bytes_ragged", "utf8_ragged", "msgpack_ragged", "json_ragged"}
)
RAGGED_CODECS = frozenset({"ragged_tensor", "typed_ragged"})


def torch_module() -> Any:
    """``torch`` when it is already imported, else None (values of a process
    that never imported torch cannot be tensors)."""
    return sys.modules.get("torch")


def require_torch() -> Any:
    import torch

    return torch


def is_tensor(value: Any) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(value, torch.Tensor)


# ---------------------------------------------------------------- inference


@dataclass
class _CodecDecision:
    accepted: bool
    codec: str
    reason: str
    normalized_type: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class _InferredLeaf:
    path: str
    values: list[Any]
    decision: _CodecDecision


@dataclass
class _InferredNode:
    path: str
    node_type: str
    children: list[Any]
    lengths: list[int] | None = None
    row_mask: list[bool] | None = None


@dataclass
class _EncodedStructuredLeaf:
    codec: str
    rows: int
    payload: dict[str, Any]
    metadata: dict[str, Any]


class _Missing:
    """A dict key absent from a row (not the same as a ``None`` value)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<MISSING>"

    def __reduce__(self) -> str:
        return "MISSING"


MISSING = _Missing()


def _non_null(values: Sequence[Any]) -> list[Any]:
    return [v for v in values if v is not None and not isinstance(v, _Missing)]


def _is_pil_image(value: Any) -> bool:
    module = getattr(type(value), "__module__", "") or ""
    return module.startswith("PIL.") and hasattr(value, "save")


def _is_bytes_like(value: Any) -> bool:
    return isinstance(value, (bytes, bytearray, memoryview))


def _is_media_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(
        _is_pil_image(item) or _is_bytes_like(item) for item in value
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.number))


def _choose_leaf_codec(values: Sequence[Any]) -> _CodecDecision:
    """The codec a column of leaf values is stored with (module doc)."""
    nn = _non_null(values)
    if not nn:
        return _CodecDecision(False, "msgpack_ragged", "all rows are null", "msgpack")
    torch = torch_module()
    if torch is not None and all(isinstance(v, torch.Tensor) for v in nn):
        dtypes = sorted({str(v.dtype) for v in nn})
        if len(dtypes) != 1:
            return _CodecDecision(
                False, "ragged_tensor", f"mixed tensor dtype: {dtypes}", "torch.Tensor"
            )
        return _CodecDecision(
            True,
            "ragged_tensor",
            "all non-null rows are Tensor",
            "torch.Tensor",
            {"dtype": dtypes[0]},
        )
    if all(_is_media_list(v) for v in nn):
        return _CodecDecision(True, "media_list_ragged", "all rows are media lists", "media list")
    if all(isinstance(v, np.ndarray) for v in nn):
        if all(np.issubdtype(v.dtype, np.number) for v in nn):
            return _CodecDecision(
                True,
                "typed_ragged",
                "all rows are numeric ndarray",
                "numeric sequence",
                {"recursive_source": "ndarray"},
            )
        return _CodecDecision(False, "msgpack_ragged", "object ndarray rows", "python object")
    if all(isinstance(v, (list, tuple)) for v in nn):
        try:
            dtype = np.result_type(*[np.asarray(v).dtype for v in nn])
        except (TypeError, ValueError, OverflowError):
            dtype = None
        if dtype is not None and np.issubdtype(dtype, np.number):
            return _CodecDecision(
                True,
                "typed_ragged",
                "all rows are numeric sequences",
                "numeric sequence",
                {"dtype": str(dtype)},
            )
    if all(_is_number(v) for v in nn):
        return _CodecDecision(
            True,
            "ndarray",
            "all rows are numeric scalar",
            "numeric scalar",
            {"dtype": str(np.result_type(*nn))},
        )
    if all(_is_bytes_like(v) for v in nn):
        return _CodecDecision(True, "bytes_ragged", "all rows are bytes-like", "bytes-like")
    if all(_is_pil_image(v) for v in nn):
        return _CodecDecision(True, "media_bytes", "all rows are media", "media")
    if all(isinstance(v, str) for v in nn):
        return _CodecDecision(True, "utf8_ragged", "all rows are str", "str")
    if all(isinstance(v, (dict, list, tuple)) for v in nn):
        return _CodecDecision(True, "msgpack_ragged", "all rows are msgpack-like", "msgpack")
    return _CodecDecision(False, "msgpack_ragged", "no codec matched", "python object")


def _escape_key(key: str) -> str:
    """A dict key as one path segment: ``\\``, ``.`` and ``[`` escaped."""
    return key.replace("\\", "\\\\").replace(".", "\\.").replace("[", "\\[")


def _dict_children(values: Sequence[Any]) -> list[str] | None:
    nn = _non_null(values)
    if not nn or not all(isinstance(v, dict) for v in nn):
        return None
    keys = {k for v in nn for k in v}
    if len(keys) > _INFER_MAX_STRUCT_KEYS or not all(isinstance(k, str) for k in keys):
        return None
    return sorted(keys)


def _list_children(values: Sequence[Any]) -> tuple[int, list[int]] | None:
    nn = _non_null(values)
    if not nn or not all(isinstance(v, (list, tuple)) for v in nn):
        return None
    longest = max(len(v) for v in nn)
    if longest > _INFER_MAX_LIST_LEN:
        return None
    if not all(item is None or isinstance(item, (dict, list, tuple)) for v in nn for item in v):
        return None
    return longest, [len(v) if isinstance(v, (list, tuple)) else 0 for v in values]


def infer_structure(
    path: str,
    values: list[Any],
    leaves: list[_InferredLeaf],
    nodes: list[_InferredNode],
    *,
    _depth: int = 0,
) -> None:
    """Expand a column of ``values`` into interior ``nodes`` and ``leaves``.

    Dicts with at most 64 string keys become ``dict`` nodes (children are the
    sorted keys; a key absent from a row is ``MISSING`` in the child column);
    lists of at most 8 containers become ``list`` nodes with per-row lengths.
    ``row_mask`` records which rows hold a real container (``None`` rows do
    not). Other columns are leaves with their codec decision. More than 32
    levels raise ``ValueError`` naming the path.
    """
    if _depth > _INFER_MAX_DEPTH:
        raise ValueError(
            f"nesting deeper than {_INFER_MAX_DEPTH} levels at {path!r} "
            f"(infer_structure exceeded max depth {_INFER_MAX_DEPTH})"
        )
    keys = _dict_children(values)
    if keys is not None:
        nodes.append(
            _InferredNode(path, "dict", keys, row_mask=[isinstance(v, dict) for v in values])
        )
        for key in keys:
            child = [v.get(key, MISSING) if isinstance(v, dict) else None for v in values]
            infer_structure(f"{path}.{_escape_key(key)}", child, leaves, nodes, _depth=_depth + 1)
        return
    listed = _list_children(values)
    if listed is not None:
        longest, lengths = listed
        nodes.append(
            _InferredNode(
                path,
                "list",
                list(range(longest)),
                lengths,
                row_mask=[isinstance(v, (list, tuple)) for v in values],
            )
        )
        for index in range(longest):
            child = [
                (v[index] if index < len(v) else MISSING) if isinstance(v, (list, tuple)) else None
                for v in values
            ]
            infer_structure(f"{path}[{index}]", child, leaves, nodes, _depth=_depth + 1)
        return
    leaves.append(_InferredLeaf(path, values, _choose_leaf_codec(values)))


def _path_tokens(path: str) -> list[Any]:
    tokens: list[Any] = []
    current: list[str] = []

    def flush() -> None:
        # A name ends at ".", "[" or the end of the path; empty names are dropped.
        if current:
            tokens.append("".join(current))
            current.clear()

    i = 0
    while i < len(path):
        c = path[i]
        if c == "\\" and i + 1 < len(path):
            current.append(path[i + 1])
            i += 2
            continue
        if c == ".":
            flush()
            i += 1
            continue
        if c == "[":
            flush()
            end = path.index("]", i)
            tokens.append(int(path[i + 1 : end]))
            i = end + 1
            continue
        current.append(c)
        i += 1
    flush()
    return tokens


def _lookup_path(value: Any, root: str, target: str) -> Any:
    suffix = target[len(root) :].removeprefix(".")
    current = value
    for token in _path_tokens(suffix) if suffix else []:
        if isinstance(token, str):
            if not isinstance(current, dict) or token not in current:
                return MISSING
        elif not isinstance(current, (list, tuple)) or token >= len(current):
            return MISSING
        current = current[token]
    return current


# ---------------------------------------------------------------- payload parts


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


# ---------------------------------------------------------------- leaf encoders


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
    """Encode an object column with the inferred codec (module doc)."""
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


# ---------------------------------------------------------------- decoders


def _torch_dtype(name: str) -> Any:
    torch = require_torch()
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype: {name}")  # noqa: TRY004
    return dtype


def decode_typed_ragged(
    payload: Mapping[str, Any], rows: int, metadata: Mapping[str, Any]
) -> list[Any]:
    data = payload["data"]
    offsets = payload["offsets"]
    shapes = payload["shapes"]
    ndims = payload["ndims"]
    nulls = payload["nulls"]
    row_format = metadata.get("row_format")
    as_tensor = row_format == "tensor"
    raw = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    if as_tensor:
        torch = require_torch()
        tdtype = _torch_dtype(metadata.get("dtype", _RAGGED_TENSOR_DEFAULT_DTYPE))
        flat = torch.from_numpy(raw.reshape(-1).view(np.uint8)).view(tdtype)
    else:
        dtype = np.dtype(metadata.get("dtype", _TYPED_RAGGED_DEFAULT_DTYPE))
        flat = raw if raw.dtype == dtype else raw.reshape(-1).view(np.uint8).view(dtype)
    mixed = metadata.get("ndarray_rows") or []
    off = offsets.tolist()
    nd = ndims.tolist()
    nl = nulls.tolist()
    values: list[Any] = []
    shape_rows = shapes.tolist()
    for row in range(rows):
        if nl[row]:
            values.append(None)
            continue
        shape = tuple(shape_rows[row][: nd[row]])
        item = flat[off[row] : off[row + 1]].reshape(shape)
        if as_tensor or row_format == "ndarray" or (row_format == "mixed" and mixed[row]):
            values.append(item)
        else:
            values.append(item.tolist())
    return values


def decode_numeric_scalars(payload: Mapping[str, Any]) -> list[Any]:
    data: np.ndarray[Any, Any] = payload["data"]
    nulls = payload["nulls"]
    out: list[Any]
    if not bool(np.asarray(nulls).any()):
        out = data.tolist()
        return out
    values = data.astype(object)
    values[np.asarray(nulls, dtype=bool)] = None
    out = values.tolist()
    return out


def _decode_media(view: memoryview, encoding: Mapping[str, Any] | None) -> Any:
    if not encoding or encoding.get("kind") != "pil_raw":
        return bytes(view)
    try:
        from PIL import Image  # type: ignore[import-not-found]
    except ImportError:
        return bytes(view)
    image = Image.frombuffer(
        encoding["mode"], tuple(encoding["size"]), bytes(view), "raw", encoding["mode"], 0, 1
    )
    image.format = encoding.get("format")
    return image


def decode_byte_rows(
    payload: Mapping[str, Any], rows: int, codec: str, metadata: Mapping[str, Any]
) -> list[Any]:
    data = payload["data"]
    offsets = payload["offsets"].tolist()
    nulls = payload["nulls"].tolist()
    view = memoryview(data).cast("B") if len(data) else memoryview(b"")
    if codec == "msgpack_ragged":
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(view), 1 << 20))
        unpacker.feed(view)
        it = iter(unpacker)
        return [None if nulls[r] else next(it) for r in range(rows)]
    if codec == "utf8_ragged":
        text = bytes(view)
        if text.isascii():
            s = text.decode("ascii")
            return [None if nulls[r] else s[offsets[r] : offsets[r + 1]] for r in range(rows)]
        return [
            None if nulls[r] else text[offsets[r] : offsets[r + 1]].decode("utf-8")
            for r in range(rows)
        ]
    if codec == "json_ragged":
        return [
            None if nulls[r] else json.loads(view[offsets[r] : offsets[r + 1]].tobytes())
            for r in range(rows)
        ]
    encodings = metadata.get("media_encodings") or []
    return [
        None
        if nulls[r]
        else _decode_media(
            view[offsets[r] : offsets[r + 1]], encodings[r] if r < len(encodings) else None
        )
        for r in range(rows)
    ]


def decode_media_lists(
    payload: Mapping[str, Any], rows: int, metadata: Mapping[str, Any]
) -> list[Any]:
    view = memoryview(payload["data"]).cast("B") if len(payload["data"]) else memoryview(b"")
    row_offsets = payload["row_offsets"].tolist()
    byte_offsets = payload["byte_offsets"].tolist()
    nulls = payload["nulls"].tolist()
    encodings = metadata.get("media_encodings") or []
    out: list[Any] = []
    for r in range(rows):
        if nulls[r]:
            out.append(None)
            continue
        out.append(
            [
                _decode_media(
                    view[byte_offsets[i] : byte_offsets[i + 1]],
                    encodings[i] if i < len(encodings) else None,
                )
                for i in range(row_offsets[r], row_offsets[r + 1])
            ]
        )
    return out


def decode_leaf(
    codec: str, payload: Mapping[str, Any], rows: int, metadata: Mapping[str, Any] | None
) -> list[Any]:
    metadata = metadata or {}
    if codec in RAGGED_CODECS:
        if codec == "ragged_tensor":
            metadata = {**metadata, "row_format": "tensor"}
        return decode_typed_ragged(payload, rows, metadata)
    if codec == "ndarray":
        return decode_numeric_scalars(payload)
    if codec in BYTES_CODECS:
        return decode_byte_rows(payload, rows, codec, metadata)
    if codec == "media_list_ragged":
        return decode_media_lists(payload, rows, metadata)
    raise ValueError(f"unknown structured non-tensor codec: {codec}")


def decode_encoded(encoded: Mapping[str, Any], payload: Mapping[str, Any], rows: int) -> list[Any]:
    """Rows of an encoded column from its (possibly row-selected) payloads."""
    codec = encoded["codec"]
    metadata = encoded.get("metadata") or {}
    if codec == "ragged_tensor_dict":
        null_mask = payload["null_mask"].tolist()
        columns = {
            key: decode_leaf(
                "ragged_tensor",
                {n: payload[f"{key}.{n}"] for n in _RAGGED_TENSOR_PAYLOAD_NAMES},
                rows,
                (metadata.get("key_codecs") or {}).get(key),
            )
            for key in metadata.get("keys", [])
        }
        out: list[Any] = []
        for r in range(rows):
            if null_mask[r]:
                out.append(None)
            else:
                out.append({k: col[r] for k, col in columns.items() if col[r] is not None})
        return out
    if codec == "structured_recursive":
        return _decode_recursive(metadata, payload, rows)
    return decode_leaf(codec, payload, rows, metadata)


def _child_path(node: Mapping[str, Any], child: Any) -> str:
    if node["node_type"] == "dict":
        return f"{node['path']}.{_escape_key(str(child))}"
    return f"{node['path']}[{int(child)}]"


def _decode_recursive(
    metadata: Mapping[str, Any], payload: Mapping[str, Any], rows: int
) -> list[Any]:
    columns: dict[str, list[Any]] = {}
    for leaf in metadata.get("leaves", []):
        members = leaf["payload_members"]
        sub = {n: payload[g] for n, g in members.items() if n != "missing"}
        values = decode_leaf(leaf["codec"], sub, rows, leaf.get("metadata"))
        missing = payload[members["missing"]].tolist()
        columns[leaf["path"]] = [MISSING if missing[r] else values[r] for r in range(rows)]
    nodes = sorted(
        metadata.get("nodes", []),
        key=lambda n: n["path"].count(".") + n["path"].count("["),
        reverse=True,
    )
    for node in nodes:
        missing = payload[node["missing_payload"]].tolist()
        mask = payload[node["row_mask_payload"]].tolist() if "row_mask_payload" in node else None
        lengths = payload[node["lengths_payload"]].tolist() if "lengths_payload" in node else None
        out: list[Any] = []
        for r in range(rows):
            if missing[r]:
                out.append(MISSING)
            elif mask is not None and not mask[r]:
                out.append(None)
            elif node["node_type"] == "dict":
                item: dict[str, Any] = {}
                for child in node["children"]:
                    v = columns[_child_path(node, child)][r]
                    if not isinstance(v, _Missing):
                        item[child] = v
                out.append(item)
            else:
                n = lengths[r] if lengths is not None else len(node["children"])
                seq: list[Any] = [None] * n
                for child in node["children"]:
                    if int(child) < n:
                        v = columns[_child_path(node, child)][r]
                        if not isinstance(v, _Missing):
                            seq[int(child)] = v
                out.append(seq)
        columns[node["path"]] = out
    return columns[metadata["root_path"]]
