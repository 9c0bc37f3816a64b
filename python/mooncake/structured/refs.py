"""DataProto refs and their handles.

A :class:`MooncakeDataProtoRef` routes field names to the stage objects and
members that hold them and carries no payload. It exports as a small
JSON-safe handle (manifest keys, no manifests) that another process imports;
an imported ref fetches its manifests on first use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

DATAPROTO_REF_HANDLE_TYPE = "mooncake_dataproto_ref"
DATAPROTO_REF_HANDLE_VERSION = 1
STORAGE_GROUP_ID = "storage_group_id"


@dataclass
class RemoteBundleRef:
    """A stored bundle: its manifest key and (when known) manifest."""

    manifest_key: str
    manifest: dict[str, Any]


@dataclass(frozen=True)
class StructuredFieldLocation:
    """Where a DataProto field lives: stage, member and section."""

    stage: str
    member: str
    section: Literal["batch", "non_tensor_batch"]


@dataclass
class MooncakeDataProtoRef:
    """A DataProto stored as stage objects: routing only, no payload."""

    batch_size: int
    stage_refs: dict[str, RemoteBundleRef]
    field_index: dict[str, StructuredFieldLocation]
    meta_info: dict[str, Any]
    namespace: str = "default"
    partition: str = "default"
    global_indexes: list[int] | None = None
    encoded_non_tensor: dict[str, Any] = field(default_factory=dict)
    _storage_group_id: str | None = field(default=None, repr=False)


DataProtoRefLike = MooncakeDataProtoRef | Mapping[str, Any]


def is_dataproto_ref_handle(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("type") == DATAPROTO_REF_HANDLE_TYPE


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    raise TypeError(
        f"DataProto ref handles support only JSON-safe values, got {type(value).__name__}"
    )


def export_dataproto_ref(ref: MooncakeDataProtoRef) -> dict[str, Any]:
    """A JSON-safe handle of ``ref`` (manifest keys, no manifests)."""
    if not isinstance(ref, MooncakeDataProtoRef):
        raise TypeError(f"expected MooncakeDataProtoRef, got {type(ref).__name__}")
    handle = {
        "type": DATAPROTO_REF_HANDLE_TYPE,
        "version": DATAPROTO_REF_HANDLE_VERSION,
        "kind": "bundle_stages",
        "batch_size": int(ref.batch_size),
        "namespace": ref.namespace,
        "partition": ref.partition,
        "global_indexes": _json_safe(ref.global_indexes),
        "stage_refs": {s: {"manifest_key": r.manifest_key} for s, r in ref.stage_refs.items()},
        "field_index": {
            n: {"stage": loc.stage, "member": loc.member, "section": loc.section}
            for n, loc in ref.field_index.items()
        },
        "meta_info": _json_safe(ref.meta_info),
        "encoded_non_tensor": _json_safe(ref.encoded_non_tensor),
    }
    if ref._storage_group_id is not None:
        handle[STORAGE_GROUP_ID] = ref._storage_group_id
    json.dumps(handle, ensure_ascii=False)
    return handle


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"DataProto ref handle {name} must be a mapping")  # noqa: TRY004 - upstream raises ValueError
    return value


def import_dataproto_ref(handle: Mapping[str, Any]) -> MooncakeDataProtoRef:
    """The ref of an exported handle (manifests are fetched on first use)."""
    if not is_dataproto_ref_handle(handle):
        raise ValueError("not a Mooncake DataProto ref handle")
    version = handle.get("version")
    if version not in (DATAPROTO_REF_HANDLE_VERSION, 2):
        raise ValueError(f"unsupported DataProto ref handle version: {version!r}")
    if handle.get("kind") != "bundle_stages":
        raise ValueError(f"unsupported DataProto ref handle kind: {handle.get('kind')!r}")
    stage_refs: dict[str, RemoteBundleRef] = {}
    for stage, raw in _mapping(handle.get("stage_refs"), "stage_refs").items():
        key = _mapping(raw, f"stage_refs[{stage!r}]").get("manifest_key")
        if not isinstance(stage, str) or not stage or not isinstance(key, str) or not key:
            raise ValueError(
                "DataProto ref handle stage refs must contain non-empty string names "
                "and manifest_key values"
            )
        stage_refs[stage] = RemoteBundleRef(key, {})
    index: dict[str, StructuredFieldLocation] = {}
    for name, raw in _mapping(handle.get("field_index"), "field_index").items():
        loc = _mapping(raw, f"field_index[{name!r}]")
        section: Any = loc.get("section")
        where: Any = loc.get("stage")
        member: Any = loc.get("member")
        if section not in ("batch", "non_tensor_batch"):
            raise ValueError(f"invalid DataProto field section: {section!r}")
        if not all(isinstance(v, str) and v for v in (name, where, member)):
            raise ValueError("DataProto ref handle field locations must be non-empty strings")
        if where not in stage_refs:
            raise ValueError(
                f"DataProto ref handle field {name!r} references unknown stage {where!r}"
            )
        index[name] = StructuredFieldLocation(where, member, section)
    group = handle.get(STORAGE_GROUP_ID)
    if (version == 2 and group is None) or (
        group is not None and (not isinstance(group, str) or not group)
    ):
        raise ValueError("DataProto ref handle has invalid storage_group_id")
    indexes = handle.get("global_indexes")
    if indexes is not None and (
        not isinstance(indexes, list)
        or any(isinstance(i, bool) or not isinstance(i, int) for i in indexes)
    ):
        raise ValueError("DataProto ref handle global_indexes must be a list of integers or null")
    return MooncakeDataProtoRef(
        batch_size=int(handle["batch_size"]),
        stage_refs=stage_refs,
        field_index=index,
        meta_info=dict(_mapping(handle.get("meta_info", {}), "meta_info")),
        namespace=str(handle.get("namespace", "default")),
        partition=str(handle.get("partition", "default")),
        global_indexes=None if indexes is None else list(indexes),
        encoded_non_tensor=dict(
            _mapping(handle.get("encoded_non_tensor", {}), "encoded_non_tensor")
        ),
        _storage_group_id=group,
    )


export_ref = export_dataproto_ref
import_ref = import_dataproto_ref


def _resolve_ref(ref: DataProtoRefLike) -> MooncakeDataProtoRef:
    if isinstance(ref, MooncakeDataProtoRef):
        return ref
    if is_dataproto_ref_handle(ref):
        return import_dataproto_ref(ref)
    raise TypeError(f"expected MooncakeDataProtoRef or DataProto handle, got {type(ref).__name__}")
