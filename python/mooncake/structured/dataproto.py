"""The shape rules of DataProto-like data, without store access: splitting
an object into ``batch``, ``non_tensor_batch`` and ``meta_info``, the batch
size, ``FieldSchema`` sections, the rules of a put into an existing ref,
field selection, flat-dict conversion and building the result object."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mooncake.structured.common import is_tensor
from mooncake.structured.encode import schema_dtype
from mooncake.structured.objects import FieldSchema
from mooncake.structured.refs import MooncakeDataProtoRef


def _mapping_to_dict(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    items = getattr(value, "items", None)
    if callable(items):
        return dict(items())
    raise TypeError(f"expected mapping-like value, got {type(value).__name__}")


def _split_dataproto_like(data: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    if isinstance(data, Mapping):
        keys = set(data)
        if (
            data
            and keys <= {"batch", "non_tensor_batch", "meta_info"}
            and all(
                v is None or isinstance(v, Mapping) or callable(getattr(v, "items", None))
                for v in data.values()
            )
        ):
            return (
                _mapping_to_dict(data.get("batch")),
                _mapping_to_dict(data.get("non_tensor_batch")),
                _mapping_to_dict(data.get("meta_info")),
            )
        return dict(data), {}, {}
    return (
        _mapping_to_dict(getattr(data, "batch", None)),
        _mapping_to_dict(getattr(data, "non_tensor_batch", None)),
        _mapping_to_dict(getattr(data, "meta_info", None)),
    )


def _batch_size(batch: Mapping[str, Any], non_tensor: Mapping[str, Any]) -> int:
    sizes: dict[int, list[str]] = {}
    for section in (batch, non_tensor):
        for name, value in section.items():
            try:
                n = len(value)
            except TypeError as exc:
                raise TypeError(f"field {name!r}: {exc}") from exc
            sizes.setdefault(n, []).append(name)
    if len(sizes) > 1:
        detail = "; ".join(f"{n} rows: {names}" for n, names in sorted(sizes.items()))
        raise ValueError(f"DataProto fields have inconsistent batch sizes ({detail})")
    return next(iter(sizes), 0)


def _storage_group(config: Any) -> str | None:
    ids = getattr(config, "group_ids", None)
    if ids is None:
        return f"structured-{uuid.uuid4().hex}"
    if isinstance(ids, str):
        return ids or None
    ids = list(ids)
    if len(ids) > 1:
        raise ValueError(
            "structured object store config.group_ids must contain exactly one logical group id"
        )
    if ids and not isinstance(ids[0], str):
        raise ValueError("structured object store config.group_ids must contain strings")
    return ids[0] if ids and ids[0] else None


def _schema_section(name: str, schema: FieldSchema) -> str | None:
    section = schema.metadata.get("section")
    if section is not None and section not in ("batch", "non_tensor_batch", "meta_info"):
        raise ValueError(
            f"FieldSchema for {name!r} metadata['section'] must be one of "
            "['batch', 'meta_info', 'non_tensor_batch']"
        )
    return section


def _schema_for(
    schemas: Mapping[str, FieldSchema] | None, name: str, section: str
) -> FieldSchema | None:
    schema = (schemas or {}).get(name)
    if schema is None:
        return None
    declared = _schema_section(name, schema)
    return schema if declared in (None, section) else None


def _validate_schema_sections(
    batch: Mapping[str, Any],
    non_tensor: Mapping[str, Any],
    meta: Mapping[str, Any],
    schemas: Mapping[str, FieldSchema] | None,
) -> None:
    for name, schema in (schemas or {}).items():
        declared = _schema_section(name, schema)
        actual = {
            s
            for s, d in (("batch", batch), ("non_tensor_batch", non_tensor), ("meta_info", meta))
            if name in d
        }
        if declared is not None and actual and declared not in actual:
            raise ValueError(
                f"FieldSchema for {name!r} declares section {declared!r}, but data contains it in "
                + ", ".join(repr(s) for s in sorted(actual))
            )


def _check_stage_update(
    ref: MooncakeDataProtoRef,
    stage: str,
    batch: Mapping[str, Any],
    non_tensor: Mapping[str, Any],
    batch_size: int,
    overwrite: bool,
) -> None:
    """Rules of a put into an existing DataProto ref: same batch size, and
    fields that exist already only with ``overwrite=True``, which must then
    replace all of the stage's fields and no other stage's."""
    if (batch or non_tensor) and batch_size != ref.batch_size:
        raise ValueError(
            f"DataProto append batch size {batch_size} does not match ref batch size {ref.batch_size}"
        )
    updates = {**{n: "batch" for n in batch}, **{n: "non_tensor_batch" for n in non_tensor}}
    dup = sorted(set(ref.field_index) & set(updates))
    if dup and not overwrite:
        raise ValueError(
            f"DataProto fields already exist: {dup}; pass overwrite=True to replace a stage's fields"
        )
    if overwrite:
        dangling = sorted(
            n for n, loc in ref.field_index.items() if loc.stage == stage and n not in updates
        )
        if dangling:
            raise ValueError(
                f"DataProto overwrite for stage {stage!r} must include existing fields: {dangling}"
            )
        moved = sorted(n for n in dup if ref.field_index[n].stage != stage)
        if moved:
            raise ValueError(
                f"DataProto overwrite for stage {stage!r} would replace fields of other stages: {moved}"
            )


def _select_fields(
    r: MooncakeDataProtoRef,
    fields: Sequence[str] | None,
    batch_fields: Sequence[str] | None,
    non_tensor_fields: Sequence[str] | None,
) -> tuple[list[str], list[str]]:
    if fields is not None and (batch_fields is not None or non_tensor_fields is not None):
        raise ValueError("fields cannot be combined with batch_fields or non_tensor_fields")
    if fields is not None:
        requested = list(fields)
        _check_known(r, requested)
        return (
            [n for n in requested if r.field_index[n].section == "batch"],
            [n for n in requested if r.field_index[n].section == "non_tensor_batch"],
        )
    if batch_fields is None and non_tensor_fields is None:
        return (
            [n for n, loc in r.field_index.items() if loc.section == "batch"],
            [n for n, loc in r.field_index.items() if loc.section == "non_tensor_batch"],
        )
    b = list(batch_fields or [])
    nt = list(non_tensor_fields or [])
    _check_known(r, [*b, *nt])
    wrong = [n for n in b if r.field_index[n].section != "batch"] + [
        n for n in nt if r.field_index[n].section != "non_tensor_batch"
    ]
    if wrong:
        raise ValueError(f"fields requested from the wrong section: {wrong}")
    return b, nt


def _check_known(r: MooncakeDataProtoRef, names: Sequence[str]) -> None:
    missing = [n for n in names if n not in r.field_index]
    if missing:
        raise KeyError(f"unknown DataProto fields: {missing}")


def _build_result(
    batch: dict[str, Any], non_tensor: dict[str, Any], meta: dict[str, Any], data_cls: Any
) -> Any:
    payload = {"batch": batch, "non_tensor_batch": non_tensor, "meta_info": meta}
    if data_cls is None or data_cls is dict:
        return payload
    from_dict = getattr(data_cls, "from_dict", None)
    try:
        if callable(from_dict):
            return from_dict(batch, non_tensor, meta_info=meta)
        return data_cls(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)
    except TypeError as exc:
        raise TypeError(
            f"{getattr(data_cls, '__name__', data_cls)!r} cannot be constructed from "
            "batch, non_tensor_batch, and meta_info"
        ) from exc


def _object_array(values: Sequence[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))


def _is_dense(value: Any) -> bool:
    return (is_tensor(value) and value.ndim > 0) or (
        isinstance(value, np.ndarray) and value.dtype != object and value.ndim > 0
    )


def _flat_dict_to_envelope(
    data: Mapping[str, Any], schemas: Mapping[str, FieldSchema] | None
) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise TypeError("flat dict payload must be a mapping")
    schemas = schemas or {}
    sections = {n: _schema_section(n, s) for n, s in schemas.items() if n in data}
    pinned = {len(data[n]) for n, s in sections.items() if s in ("batch", "non_tensor_batch")}
    if len(pinned) > 1:
        raise ValueError(f"flat dict fields have inconsistent batch sizes: {sorted(pinned)}")
    rows = pinned.pop() if pinned else 0
    schema_rows = rows
    if not rows:
        meta_pinned = {n for n, s in sections.items() if s == "meta_info"}
        dense = {len(v) for k, v in data.items() if k not in meta_pinned and _is_dense(v)}
        if len(dense) > 1:
            raise ValueError(f"flat dict dense fields have ambiguous batch sizes: {sorted(dense)}")
        if dense:
            rows = dense.pop()
        else:
            sized = {
                len(v)
                for k, v in data.items()
                if k not in meta_pinned
                and ((isinstance(v, np.ndarray) and v.ndim > 0) or _is_sequence(v))
            }
            if len(sized) > 1:
                raise ValueError(
                    f"flat dict fields have ambiguous batch sizes: {sorted(sized)}; "
                    "pass FieldSchema metadata['section'] for list-valued metadata fields"
                )
            rows = sized.pop() if sized else 0
    batch: dict[str, Any] = {}
    non_tensor: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for key, value in data.items():
        section = sections.get(key)
        if section is None:
            if rows and _is_dense(value) and len(value) == rows:
                batch[key] = value
            elif not schema_rows and rows and _is_sequence(value) and len(value) == rows:
                non_tensor[key] = _flat_non_tensor(key, value, rows, schemas.get(key))
            else:
                meta[key] = value
        elif section == "batch":
            batch[key] = value
        elif section == "non_tensor_batch":
            non_tensor[key] = _flat_non_tensor(key, value, rows, schemas.get(key))
        else:
            meta[key] = value
    return {"batch": batch, "non_tensor_batch": non_tensor, "meta_info": meta}


def _flat_non_tensor(name: str, value: Any, rows: int, schema: FieldSchema | None) -> Any:
    if not (isinstance(value, np.ndarray) or _is_sequence(value)) or (
        isinstance(value, np.ndarray) and value.ndim == 0
    ):
        raise TypeError(
            f"flat dict non_tensor_batch field {name!r} must be an ndarray or non-string sequence"
        )
    if len(value) != rows:
        raise ValueError(
            f"flat dict non_tensor_batch field {name!r} has batch size {len(value)}, expected {rows}"
        )
    dtype = schema_dtype(schema.metadata) if schema is not None else None
    if (
        schema is not None
        and schema.codec == "ndarray"
        and dtype is not None
        and all(v is not None for v in value)
    ):
        return np.asarray(value, dtype=dtype)
    if isinstance(value, np.ndarray):
        return value
    return _object_array(list(value))


def _envelope_to_flat_dict(data: Mapping[str, Any]) -> dict[str, Any]:
    meta = _mapping_to_dict(data.get("meta_info"))
    batch = _mapping_to_dict(data.get("batch"))
    non_tensor = _mapping_to_dict(data.get("non_tensor_batch"))
    overlap = (
        (set(meta) & set(batch)) | (set(meta) & set(non_tensor)) | (set(batch) & set(non_tensor))
    )
    if overlap:
        raise ValueError(f"Duplicate keys found across DataProto sections: {sorted(overlap)}")
    out = dict(meta)
    out.update(batch)
    for name, value in non_tensor.items():
        out[name] = (
            value.tolist() if isinstance(value, np.ndarray) and value.dtype == object else value
        )
    return out
