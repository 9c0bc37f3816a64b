"""Codec choice and structure inference for ``non_tensor_batch`` columns.

A ``non_tensor_batch`` field is a column of per-row Python values. The codec
of a column is chosen from its values:

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
escaped in keys). Expansion deeper than 32 levels is a ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mooncake.structured.common import (
    MISSING,
    _Missing,
    torch_module,
)

_INFER_MAX_STRUCT_KEYS = 64
_INFER_MAX_LIST_LEN = 8
_INFER_MAX_DEPTH = 32


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
    """The codec a column of leaf values is stored with (rules in the module
    docstring)."""
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
