"""Column decoders: the rows of an encoded ``non_tensor_batch`` column from
its payloads (all rows, or the payloads of selected rows)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgpack  # type: ignore[import-untyped]
import numpy as np

from mooncake.structured.common import (
    _RAGGED_TENSOR_DEFAULT_DTYPE,
    _RAGGED_TENSOR_PAYLOAD_NAMES,
    _TYPED_RAGGED_DEFAULT_DTYPE,
    BYTES_CODECS,
    MISSING,
    RAGGED_CODECS,
    _Missing,
    _torch_dtype,
    require_torch,
)
from mooncake.structured.infer import _escape_key


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
