"""Structured objects on the Mooncake store: RL batches (DataProto) and bundles.

A *structured object* is one logical object made of named members (tensors,
arrays, byte strings) plus JSON metadata. It is stored as one store object
per member (split into chunks of ``chunk_bytes``) and one JSON manifest that
lists them; the manifest and every member go to the store in **one** batched
write, so a reader that finds the manifest finds every member. A failed write
removes whatever it wrote.

A DataProto-like batch (``batch`` tensor fields indexed by row,
``non_tensor_batch`` per-row values, ``meta_info``) is stored as one
structured object per *stage*; :class:`MooncakeDataProtoRef` routes field
names to stages and members, and exports as a small JSON-safe handle (manifest
keys, no payload) that another process imports. Reads fetch only the selected
fields and, with ``rows``, only the byte ranges of the selected rows
(``get_into_ranges`` straight into the result's memory, every field of a call
in one request; ragged fields take a second request for their data ranges).

``non_tensor_batch`` columns of Python objects are stored with the codecs of
``mooncake._structured_codecs`` (text, bytes, JSON-like values, numeric
sequences, ragged tensors, nested dicts and lists).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import json
import mmap
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from mooncake import _native
from mooncake._structured_codecs import (
    _RAGGED_TENSOR_PAYLOAD_NAMES,
    BYTES_CODECS,
    MISSING,
    RAGGED_CODECS,
    Parts,
    _choose_leaf_codec,
    _CodecDecision,
    _EncodedStructuredLeaf,
    _escape_key,
    _InferredLeaf,
    _InferredNode,
    _Missing,
    _torch_dtype,
    decode_encoded,
    encode_inferred,
    encode_with_codec,
    infer_structure,
    is_tensor,
    require_torch,
    schema_dtype,
    torch_module,
)

__all__ = [
    "DEFAULT_BUNDLE_CHUNK_BYTES",
    "MISSING",
    "STRUCTURED_FIELD_SPECS_KEY",
    "BundleStore",
    "BundleTransferPolicy",
    "FieldSchema",
    "MooncakeBundleTransfer",
    "MooncakeDataProtoRef",
    "RemoteBundleRef",
    "StructuredFieldLocation",
    "StructuredMemberSlice",
    "StructuredObjectPayload",
    "StructuredObjectReadSpec",
    "StructuredObjectResult",
    "_CodecDecision",
    "_InferredLeaf",
    "_InferredNode",
    "_Missing",
    "_choose_leaf_codec",
    "_escape_key",
    "export_dataproto_ref",
    "export_ref",
    "import_dataproto_ref",
    "import_ref",
    "infer_structure",
    "is_dataproto_ref_handle",
    "raw_destination",
    "tensor_object_buffer",
]

DEFAULT_BUNDLE_CHUNK_BYTES = 64 * 1024**2
MISSING_OBJECT_ERROR = -704
LEASE_EXPIRED = -707
_READ_ATTEMPTS = 4
STRUCTURED_FIELD_SPECS_KEY = "__mooncake_structured_fields__"
DATAPROTO_REF_HANDLE_TYPE = "mooncake_dataproto_ref"
DATAPROTO_REF_HANDLE_VERSION = 1
STORAGE_GROUP_ID = "storage_group_id"
TENSOR_HEADER_BYTES = 304
_MANIFEST_CACHE = 512


class BundleStore(Protocol):
    def put(self, key: str, value: Any, config: Any = None) -> int: ...

    def get(self, key: str) -> bytes: ...

    def remove(self, key: str, force: bool = False) -> int: ...


class StructuredObjectMissingError(KeyError):
    """A manifest or member object is no longer in the store (cleaned up or evicted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "object missing"


@dataclass(frozen=True)
class BundleTransferPolicy:
    """How payloads are written: ``copy_mode`` ``"auto"``/``"copy"`` (staged
    as needed) or ``"zero_copy"`` (only ``tensor_object_buffer`` members)."""

    max_inflight_put: int = 1
    put_mode: Literal["auto", "batch", "parallel"] = "auto"
    copy_mode: Literal["auto", "zero_copy", "copy"] = "auto"


@dataclass(frozen=True)
class FieldSchema:
    """Codec hint for a DataProto field; ``metadata["section"]`` may pin it to
    ``batch``, ``non_tensor_batch`` or ``meta_info``, ``metadata["dtype"]``
    types ``ndarray``/``typed_ragged`` codecs."""

    codec: str
    nullable: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class RemoteBundleRef:
    """A stored bundle: its manifest key and (when known) manifest."""

    manifest_key: str
    manifest: dict[str, Any]


@dataclass(frozen=True, init=False)
class StructuredObjectPayload:
    """A structured object to write: named ``buffers`` plus ``metadata``."""

    metadata: Mapping[str, Any]
    buffers: Mapping[str, Any]

    def __init__(
        self,
        metadata: Mapping[str, Any] | None = None,
        buffers: Mapping[str, Any] | None = None,
    ) -> None:
        if buffers is None:
            raise TypeError("StructuredObjectPayload requires buffers")
        object.__setattr__(self, "metadata", {} if metadata is None else metadata)
        object.__setattr__(self, "buffers", buffers)


@dataclass
class StructuredObjectResult:
    """Materialized members and the object's metadata."""

    metadata: dict[str, Any]
    objects: dict[str, Any]


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


@dataclass(frozen=True)
class _TensorObjectBufferPayload:
    ptr: int
    size: int
    owner: Any
    batch_size: int | None = None

    def __len__(self) -> int:
        if self.batch_size is None:
            raise TypeError("tensor object buffer requires batch_size for DataProto use")
        return self.batch_size


@dataclass(frozen=True)
class _RawDestinationBuffer:
    ptr: int
    size: int
    owner: Any
    pre_registered: bool = False


@dataclass(frozen=True)
class StructuredMemberSlice:
    """Rows ``start:end:step`` of one member along ``axis`` (0 only)."""

    axis: int
    start: int
    end: int
    step: int = 1


@dataclass(frozen=True)
class StructuredObjectReadSpec:
    """A lazy read: which members, and which rows of each."""

    ref: RemoteBundleRef | Mapping[str, Any]
    member_names: tuple[str, ...] | None = None
    member_slices: tuple[tuple[str, StructuredMemberSlice], ...] = ()

    def select_members(self, names: Sequence[str] | None) -> StructuredObjectReadSpec:
        return StructuredObjectReadSpec(
            self.ref, None if names is None else tuple(names), self.member_slices
        )

    def slice_member(
        self, name: str, axis: int, start: int, end: int, step: int = 1
    ) -> StructuredObjectReadSpec:
        slices = dict(self.member_slices)
        slices[name] = StructuredMemberSlice(axis, start, end, step)
        return StructuredObjectReadSpec(self.ref, self.member_names, tuple(slices.items()))

    def member_slice(self, name: str) -> StructuredMemberSlice | None:
        return dict(self.member_slices).get(name)


def tensor_object_buffer(
    ptr: int, size: int, owner: Any = None, batch_size: int | None = None
) -> _TensorObjectBufferPayload:
    """A tensor object (304-byte header + payload) in caller memory, written
    with ``put_tensor_from``; as a destination, where a tensor field's object
    is read to. ``owner`` is kept alive with it."""
    return _TensorObjectBufferPayload(int(ptr), int(size), owner, batch_size)


def raw_destination(
    ptr: int, size: int, owner: Any = None, *, pre_registered: bool = False
) -> _RawDestinationBuffer:
    """Caller memory a field is read into (e.g. a ``BufferPool`` lease)."""
    return _RawDestinationBuffer(int(ptr), int(size), owner, pre_registered)


# ---------------------------------------------------------------- handles


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


# ---------------------------------------------------------------- small helpers


def _check_segment(value: Any, what: str) -> None:
    if not isinstance(value, str) or not value or "/" in value or any(ord(c) < 32 for c in value):
        raise ValueError(f"invalid bundle {what}: {value!r}")


def _policy(
    policy: BundleTransferPolicy | None, inflight: int | None = None
) -> BundleTransferPolicy:
    p = policy or BundleTransferPolicy()
    if inflight is not None:
        p = BundleTransferPolicy(inflight, p.put_mode, p.copy_mode)
    if p.max_inflight_put < 1:
        raise ValueError("max_inflight_put must be positive")
    if p.put_mode not in ("auto", "batch", "parallel"):
        raise ValueError(f"unsupported put_mode: {p.put_mode}")
    if p.copy_mode not in ("auto", "zero_copy", "copy"):
        raise ValueError(f"unsupported copy_mode: {p.copy_mode}")
    return p


def _chunk_bytes(value: int) -> int:
    if not isinstance(value, int) or value <= 0:
        raise ValueError("chunk_bytes must be positive")
    return value


def _byte_array(value: Any, what: str) -> np.ndarray:
    """A bytes-like ``value`` as a flat uint8 array over its memory (copied
    only when it is not contiguous)."""
    try:
        view = memoryview(value)
    except TypeError as exc:
        raise TypeError(f"{what} must be bytes-like, got {type(value).__name__}") from exc
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return np.frombuffer(view.cast("B"), dtype=np.uint8) if view.nbytes else np.empty(0, np.uint8)


def _prod(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _config_for(config: Any, n: int) -> Any:
    """``config`` for a batch of ``n`` keys: one caller group id expanded."""
    if config is None:
        return None
    ids = getattr(config, "group_ids", None)
    if not ids:
        return config
    ids = [ids] if isinstance(ids, str) else list(ids)
    if len(ids) != 1:
        raise ValueError(
            "structured object store config.group_ids must contain exactly one logical group id"
        )
    cfg = copy.copy(config)
    cfg.group_ids = ids * n
    return cfg


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


# ---------------------------------------------------------------- transport


@dataclass
class _Obj:
    """One store object to write: its bytes as pieces of memory."""

    key: str
    pieces: list[tuple[int, int]]
    label: str


@dataclass
class _ReadGroup:
    """Fragments read into one destination buffer."""

    ptr: int
    size: int
    label: str
    frags: list[tuple[str, int, int, int]]  # key, dst offset, src offset, size
    pre_registered: bool = False


class _Transport:
    """Batched store calls with clear errors.

    On a ``MooncakeDistributedStore`` every write is one
    ``batch_put_from_multi_buffers`` call and every read one
    ``get_into_ranges`` call. Other stores (wrappers implementing only part
    of the API, at least ``put``/``get``/``remove``) get the same results
    through the calls they have.
    """

    def __init__(self, store: Any) -> None:
        self.store = store

    def _has(self, name: str) -> bool:
        return callable(getattr(self.store, name, None))

    def write(self, objs: Sequence[_Obj], config: Any) -> None:
        """Write every object in one batched call; on failure remove what was
        written and raise naming the members."""
        if not objs:
            return
        keys = [o.key for o in objs]
        cfg = _config_for(config, len(keys))
        extra = () if cfg is None else (cfg,)
        if self._has("batch_put_from_multi_buffers"):
            ptrs = [[p for p, _n in o.pieces] for o in objs]
            sizes = [[n for _p, n in o.pieces] for o in objs]
            results = self.store.batch_put_from_multi_buffers(keys, ptrs, sizes, *extra)
            op = "batch_put_from_multi_buffers"
        elif self._has("batch_put_from") and all(len(o.pieces) == 1 for o in objs):
            results = self.store.batch_put_from(
                keys, [o.pieces[0][0] for o in objs], [o.pieces[0][1] for o in objs], *extra
            )
            op = "batch_put_from"
        else:
            one = () if config is None else (_config_for(config, 1),)
            results = []
            for o in objs:
                try:
                    results.append(self.store.put(o.key, _gather(o.pieces), *one))
                except Exception:  # noqa: BLE001 - a failed put is a failed write
                    results.append(-1)
            op = "put"
        self._check_writes(objs, list(results), op)

    def write_tensor_objects(self, objs: Sequence[_Obj], config: Any) -> None:
        """Caller tensor objects (``tensor_object_buffer``) through the native
        tensor path, which validates their headers."""
        if not objs:
            return
        keys = [o.key for o in objs]
        ptrs = [o.pieces[0][0] for o in objs]
        sizes = [o.pieces[0][1] for o in objs]
        if config is None and self._has("batch_put_tensor_from"):
            results = self.store.batch_put_tensor_from(keys, ptrs, sizes)
        elif config is None and self._has("put_tensor_from"):
            results = [
                self.store.put_tensor_from(k, p, n)
                for k, p, n in zip(keys, ptrs, sizes, strict=True)
            ]
        elif self._has("put_from"):
            cfg = () if config is None else (_config_for(config, 1),)
            results = [
                self.store.put_from(k, p, n, *cfg)
                for k, p, n in zip(keys, ptrs, sizes, strict=True)
            ]
        else:
            self.write(objs, config)
            return
        self._check_writes(objs, list(results), "put_tensor_from")

    def _check_writes(self, objs: Sequence[_Obj], results: Sequence[Any], op: str) -> None:
        failed = [(o, r) for o, r in zip(objs, results, strict=True) if r not in (0, None)]
        if len(results) != len(objs):
            failed = [(o, -1) for o in objs]
        if failed:
            self.remove([o.key for o in objs], strict=False)
            named = ", ".join(f"{o.label} (code {r})" for o, r in failed[:4])
            raise RuntimeError(
                f"{op} failed for {len(failed)} object(s): {named}; nothing was kept"
            )

    def remove(self, keys: Sequence[str], strict: bool) -> None:
        pending = list(dict.fromkeys(keys))
        if not pending:
            return
        bad: list[tuple[str, Any]] = []
        if self._has("batch_remove"):
            try:
                results = list(self.store.batch_remove(pending, True))
            except TypeError:
                results = list(self.store.batch_remove(pending))
            bad = [
                (k, r)
                for k, r in zip(pending, results, strict=True)
                if r not in (0, None, MISSING_OBJECT_ERROR)
            ]
            pending = [k for k, _r in bad]
            bad = []
        for k in pending:
            try:
                r = self.store.remove(k, True)
            except KeyError:
                continue
            except Exception as exc:  # noqa: BLE001 - reported below
                r = str(exc)
            if r not in (0, None, MISSING_OBJECT_ERROR):
                bad.append((k, r))
        if bad and strict:
            raise RuntimeError(f"failed to remove {len(bad)} Mooncake keys: {bad[:3]}")

    def get_blobs(self, keys: Sequence[str]) -> list[bytes]:
        if not keys:
            return []
        if self._has("get_batch"):
            return list(self.store.get_batch(list(keys)))
        out = []
        for k in keys:
            try:
                out.append(bytes(self.store.get(k)))
            except KeyError:
                out.append(b"")
        return out

    def read(self, groups: Sequence[_ReadGroup]) -> None:
        """Run every group's fragments in one ``get_into_ranges`` call.

        A copy that outlived its read lease (LEASE_EXPIRED, a slow copy on a
        loaded host) is discarded by the store; those groups are read again,
        one call each, up to four attempts in all (objects are write-once, so
        a repeated read returns the same bytes)."""
        groups = [g for g in groups if g.frags]
        if not groups:
            return
        if not self._has("get_into_ranges"):
            self._read_with_get(groups)
            return
        retry = self._read_once(groups)
        for attempt in range(1, _READ_ATTEMPTS):
            if not retry:
                return
            retry = [
                g
                for group in retry
                for g in self._read_once([group], last=attempt == _READ_ATTEMPTS - 1)
            ]

    def _read_once(self, groups: Sequence[_ReadGroup], last: bool = False) -> list[_ReadGroup]:
        """One ``get_into_ranges`` call; the groups to read again (lease expired)."""
        registered: list[int] = []
        can_register = self._has("register_buffer") and self._has("unregister_buffer")
        try:
            for g in groups:
                if not can_register or g.pre_registered or g.size == 0:
                    continue
                if self.store.register_buffer(g.ptr, g.size) == 0:
                    registered.append(g.ptr)
            ptrs: list[int] = []
            all_keys: list[list[str]] = []
            dsts: list[list[list[int]]] = []
            srcs: list[list[list[int]]] = []
            sizes: list[list[list[int]]] = []
            for g in groups:
                by_key: dict[str, tuple[list[int], list[int], list[int]]] = {}
                for key, dst, src, n in g.frags:
                    entry = by_key.setdefault(key, ([], [], []))
                    entry[0].append(dst)
                    entry[1].append(src)
                    entry[2].append(n)
                ptrs.append(g.ptr)
                all_keys.append(list(by_key))
                dsts.append([v[0] for v in by_key.values()])
                srcs.append([v[1] for v in by_key.values()])
                sizes.append([v[2] for v in by_key.values()])
            try:
                results = self.store.get_into_ranges(ptrs, all_keys, dsts, srcs, sizes)
            except KeyError as exc:
                raise StructuredObjectMissingError(
                    f"{groups[0].label}: object {exc} is missing (cleaned up or evicted)"
                ) from None
        finally:
            for p in registered:
                self.store.unregister_buffer(p)
        again: list[_ReadGroup] = []
        for g, keys, want, got in zip(groups, all_keys, sizes, results, strict=True):
            for key, w, r in zip(keys, want, got, strict=True):
                if list(r) != list(w):
                    codes = sorted({c for c in r if c < 0})
                    if MISSING_OBJECT_ERROR in codes:
                        raise StructuredObjectMissingError(
                            f"{g.label}: object {key!r} is missing (cleaned up or evicted)"
                        )
                    if codes == [LEASE_EXPIRED] and not last:
                        again.append(g)
                        break
                    raise RuntimeError(f"{g.label}: reading {key!r} failed (codes {codes or r})")
        return again

    def _read_with_get(self, groups: Sequence[_ReadGroup]) -> None:
        cache: dict[str, bytes] = {}
        for g in groups:
            for key, dst, src, n in g.frags:
                if key not in cache:
                    try:
                        cache[key] = bytes(self.store.get(key))
                    except KeyError:
                        cache[key] = b""
                data = cache[key]
                if len(data) < src + n:
                    if not data:
                        raise StructuredObjectMissingError(
                            f"{g.label}: object {key!r} is missing (cleaned up or evicted)"
                        )
                    raise RuntimeError(
                        f"{g.label}: object {key!r} is shorter than its manifest says"
                    )
                ctypes.memmove(g.ptr + dst, data[src : src + n], n)


def _gather(pieces: Sequence[tuple[int, int]]) -> bytes:
    """The concatenated bytes of ``pieces`` (for stores without pointer writes)."""
    return b"".join(ctypes.string_at(p, n) for p, n in pieces)


def _split_chunks(pieces: Sequence[tuple[int, int]], chunk: int) -> list[list[tuple[int, int]]]:
    out: list[list[tuple[int, int]]] = []
    cur: list[tuple[int, int]] = []
    room = chunk
    for ptr, n in pieces:
        while n > 0:
            take = min(n, room)
            cur.append((ptr, take))
            ptr += take
            n -= take
            room -= take
            if room == 0:
                out.append(cur)
                cur, room = [], chunk
    if cur:
        out.append(cur)
    return out


def _fragments(
    spec: Mapping[str, Any], src: int, n: int, dst: int
) -> list[tuple[str, int, int, int]]:
    """Payload bytes ``[src, src+n)`` as per-chunk fragments landing at ``dst``."""
    out = []
    base = 0
    end = src + n
    for chunk in spec["chunks"]:
        size = int(chunk["bytes"])
        lo, hi = max(src, base), min(end, base + size)
        if lo < hi:
            out.append((chunk["key"], dst + lo - src, lo - base, hi - lo))
        base += size
        if base >= end:
            break
    return out


# ---------------------------------------------------------------- row selection


@dataclass(frozen=True)
class _Rows:
    """Selected rows: ``runs`` of (first source row, count, first output row)."""

    count: int
    runs: tuple[tuple[int, int, int], ...]
    indices: tuple[int, ...]


def _runs_of(indices: Sequence[int]) -> tuple[tuple[int, int, int], ...]:
    runs: list[list[int]] = []
    for out, row in enumerate(indices):
        if runs and runs[-1][0] + runs[-1][1] == row:
            runs[-1][1] += 1
        else:
            runs.append([row, 1, out])
    return tuple((a, b, c) for a, b, c in runs)


def _rows_of(rows: Any, total: int) -> _Rows | None:
    if rows is None:
        return None
    if isinstance(rows, StructuredMemberSlice):
        if rows.axis != 0:
            raise ValueError("DataProto row slicing currently supports axis=0 only")
        rows = slice(rows.start, rows.end, rows.step)
    if isinstance(rows, slice):
        if rows.step is not None and rows.step <= 0:
            raise ValueError("DataProto row slicing step must be positive")
        indices = tuple(range(*rows.indices(total)))
    elif (
        isinstance(rows, Sequence)
        and not isinstance(rows, (str, bytes, bytearray))
        or isinstance(rows, np.ndarray)
    ):
        out = []
        for i in rows:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                raise TypeError("DataProto row indices must be integers")
            j = int(i) + total if int(i) < 0 else int(i)
            if not 0 <= j < total:
                raise IndexError(f"DataProto row index {int(i)} out of range for {total} rows")
            out.append(j)
        indices = tuple(out)
    else:
        raise TypeError(
            "DataProto rows must be a slice, StructuredMemberSlice, or row index sequence"
        )
    return _Rows(len(indices), _runs_of(indices), indices)


# ---------------------------------------------------------------- member reads


class _Pending:
    """A planned member read: groups to run, then ``finish()`` for the value."""

    def __init__(self, groups: list[_ReadGroup], finish: Callable[[], Any]) -> None:
        self.groups = groups
        self.finish = finish


def _dest_ptr(label: str, dest: Any, nbytes: int) -> tuple[int, int, bool]:
    if dest.size < nbytes:
        raise ValueError(f"{label}: destination has {dest.size} bytes, needs at least {nbytes}")
    return dest.ptr, dest.size, bool(getattr(dest, "pre_registered", False))


_HUGE_MIN = 4 << 20


def _fresh(nbytes: int) -> Any:
    """Memory for a result of ``nbytes``: large results come from the
    client's result pool (huge-page advised blocks that go back to the pool
    when the result is freed, so the next read of that size copies into
    pages already in memory instead of faulting fresh ones in), or, when
    the pool does not serve the size, an anonymous mapping advised to use
    transparent huge pages; smaller ones come from the allocator."""
    if nbytes < _HUGE_MIN:
        return None
    pooled = _native._result_memory(nbytes)
    if pooled is not None:
        return pooled
    mm = mmap.mmap(-1, nbytes)
    advise = getattr(mm, "madvise", None)
    if advise is not None and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            advise(mmap.MADV_HUGEPAGE)
    return mm


def _empty_array(shape: Sequence[int], dtype: np.dtype[Any]) -> np.ndarray:
    n = _prod(shape) * dtype.itemsize
    mm = _fresh(n)
    if mm is None:
        return np.empty(tuple(shape), dtype=dtype)
    return np.frombuffer(mm, dtype=dtype, count=n // dtype.itemsize).reshape(tuple(shape))


def _empty_tensor(shape: Sequence[int], dtype: Any, element: int) -> Any:
    torch = require_torch()
    mm = _fresh(_prod(shape) * element)
    if mm is None:
        return torch.empty(list(shape), dtype=dtype)
    return torch.frombuffer(mm, dtype=dtype).view(list(shape))


def _ndarray_target(
    label: str, dest: Any, dtype: np.dtype[Any], shape: tuple[int, ...]
) -> tuple[np.ndarray, bool]:
    nbytes = _prod(shape) * dtype.itemsize
    if dest is None:
        return _empty_array(shape, dtype), False
    if isinstance(dest, _RawDestinationBuffer):
        ptr, _size, pre = _dest_ptr(label, dest, nbytes)
        buf = (ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr)
        arr = np.frombuffer(buf, dtype=np.uint8, count=nbytes).view(dtype).reshape(shape)
        return arr, pre
    if not isinstance(dest, np.ndarray):
        raise TypeError(f"{label}: destination must be a numpy.ndarray or raw_destination")
    if dest.dtype != dtype:
        raise ValueError(
            f"{label}: destination dtype mismatch: expected {dtype.str}, got {dest.dtype.str}"
        )
    if tuple(dest.shape) != tuple(shape):
        raise ValueError(
            f"{label}: destination shape mismatch: expected {tuple(shape)}, got {tuple(dest.shape)}"
        )
    if not dest.flags["C_CONTIGUOUS"]:
        raise ValueError(f"{label}: destination must be C-contiguous")
    if not dest.flags["WRITEABLE"]:
        raise ValueError(f"{label}: destination must be writeable")
    return dest, False


def _row_frags(
    spec: Mapping[str, Any],
    rows: _Rows | None,
    total_bytes: int,
    row_width: int,
    base: int,
    dst0: int = 0,
) -> list[tuple[str, int, int, int]]:
    if rows is None:
        return _fragments(spec, base, total_bytes, dst0)
    frags: list[tuple[str, int, int, int]] = []
    for src_row, count, out_row in rows.runs:
        frags.extend(
            _fragments(
                spec, base + src_row * row_width, count * row_width, dst0 + out_row * row_width
            )
        )
    return frags


def _plan_ndarray(
    label: str, spec: Mapping[str, Any], fspec: Mapping[str, Any], rows: _Rows | None, dest: Any
) -> _Pending:
    dtype = np.dtype(fspec["dtype"])
    shape = tuple(int(d) for d in fspec["shape"])
    if rows is not None and not shape:
        raise ValueError(f"{label}: a 0-d member has no rows to select")
    out_shape = shape if rows is None else (rows.count, *shape[1:])
    target, pre = _ndarray_target(label, dest, dtype, out_shape)
    row_width = dtype.itemsize * _prod(shape[1:])
    frags = _row_frags(spec, rows, target.nbytes, row_width, 0)
    ptr = int(target.ctypes.data)
    return _Pending([_ReadGroup(ptr, target.nbytes, label, frags, pre)], lambda: target)


def _plan_bytes(
    label: str, spec: Mapping[str, Any], rows: _Rows | None, dest: Any, as_array: bool
) -> _Pending:
    if rows is not None:
        raise ValueError(f"{label}: a bytes member does not support row selection")
    if dest is not None:
        raise ValueError(f"{label}: a bytes member does not support destinations")
    n = int(spec["bytes"])
    target = _empty_array((n,), np.dtype(np.uint8))
    frags = _fragments(spec, 0, n, 0)
    group = _ReadGroup(int(target.ctypes.data), n, label, frags)
    return _Pending([group], (lambda: target) if as_array else (lambda: target.tobytes()))


def _plan_tensor(
    transport: _Transport,
    label: str,
    spec: Mapping[str, Any],
    fspec: Mapping[str, Any],
    rows: _Rows | None,
    dest: Any,
) -> _Pending:
    shape = [int(d) for d in fspec.get("shape", [])]
    hdr = int(spec.get("metadata_bytes", TENSOR_HEADER_BYTES))
    element = int(fspec.get("element_size", 0))
    if rows is not None and not shape:
        raise ValueError(f"{label}: a 0-d tensor has no rows to select")
    out_shape = shape if rows is None else [rows.count, *shape[1:]]
    row_width = element * _prod(shape[1:])
    data_bytes = element * _prod(out_shape)
    dtype_name = fspec.get("dtype")
    if dest is not None:
        if not isinstance(dest, (_TensorObjectBufferPayload, _RawDestinationBuffer)):
            raise ValueError(
                f"{label}: a tensor member only supports tensor_object_buffer or raw_destination destinations"
            )
        ptr, size, pre = _dest_ptr(label, dest, hdr + data_bytes)
        if rows is None and isinstance(dest, _TensorObjectBufferPayload):
            if callable(getattr(transport.store, "get_tensor_into", None)):

                def via_native() -> Any:
                    return transport.store.get_tensor_into(spec["key"], dest.ptr, dest.size)

                return _Pending([], via_native)
            frags = _fragments(spec, 0, hdr + data_bytes, 0)
            return _Pending([_ReadGroup(ptr, size, label, frags, pre)], lambda: dest)
        header = _tensor_header(transport, spec, dtype_name, out_shape, label)
        ctypes.memmove(ptr, header, hdr)
        frags = _row_frags(spec, rows, data_bytes, row_width, hdr, hdr)
        return _Pending([_ReadGroup(ptr, size, label, frags, pre)], lambda: dest)
    if dtype_name is None:
        # A caller-written tensor object: header plus rows, decoded natively.
        buf = np.empty(hdr + data_bytes, dtype=np.uint8)
        header = _tensor_header(transport, spec, None, out_shape, label)
        buf[:hdr] = np.frombuffer(header, dtype=np.uint8)
        frags = _row_frags(spec, rows, data_bytes, row_width, hdr, hdr)

        def decode() -> Any:
            from mooncake.store import _deserialize_tensor

            return _deserialize_tensor(buf.tobytes())

        return _Pending([_ReadGroup(int(buf.ctypes.data), buf.nbytes, label, frags)], decode)
    require_torch()
    target = _empty_tensor(out_shape, _torch_dtype(dtype_name), element)
    frags = _row_frags(spec, rows, data_bytes, row_width, hdr)
    return _Pending([_ReadGroup(int(target.data_ptr()), data_bytes, label, frags)], lambda: target)


def _tensor_header(
    transport: _Transport,
    spec: Mapping[str, Any],
    dtype_name: str | None,
    shape: list[int],
    label: str,
) -> bytes:
    """The 304-byte header of a tensor of ``shape`` (a stored header patched)."""
    if dtype_name is not None:
        from mooncake.store import _serialize_tensor

        torch = require_torch()
        return bytes(_serialize_tensor(torch.empty(shape, dtype=_torch_dtype(dtype_name)))[0])
    head = np.empty(TENSOR_HEADER_BYTES, dtype=np.uint8)
    transport.read(
        [
            _ReadGroup(
                int(head.ctypes.data),
                head.nbytes,
                label,
                _fragments(spec, 0, TENSOR_HEADER_BYTES, 0),
            )
        ]
    )
    patched = bytearray(head.tobytes())
    element = int(np.frombuffer(patched, "<u8", 1, 32)[0]) // max(_prod(_header_shape(patched)), 1)
    np.frombuffer(patched, "<u8", 1, 32)[0] = element * _prod(shape)
    for off in (40, 104):
        dims = np.frombuffer(patched, "<i8", 8, off)
        for i, d in enumerate(shape):
            dims[i] = d
    return bytes(patched)


def _header_shape(header: bytes | bytearray) -> list[int]:
    ndim = int(np.frombuffer(header, "<i4", 1, 12)[0])
    return [int(d) for d in np.frombuffer(header, "<i8", 8, 104)[:ndim]]


def _plan_member(
    transport: _Transport,
    name: str,
    spec: Mapping[str, Any],
    fspec: Mapping[str, Any],
    rows: _Rows | None,
    dest: Any,
    bytes_as_array: bool = False,
    label: str | None = None,
) -> _Pending:
    encoding = fspec.get("encoding", "bytes")
    label = label or f"member {name!r}"
    if encoding == "ndarray":
        return _plan_ndarray(label, spec, fspec, rows, dest)
    if encoding == "torch_tensor":
        return _plan_tensor(transport, label, spec, fspec, rows, dest)
    if encoding == "bytes":
        return _plan_bytes(label, spec, rows, dest, bytes_as_array)
    raise ValueError(f"{label}: unsupported structured field encoding {encoding!r}")


def _run(transport: _Transport, pendings: Sequence[_Pending]) -> list[Any]:
    transport.read([g for p in pendings for g in p.groups])
    return [p.finish() for p in pendings]


# ---------------------------------------------------------------- member encoding


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


# ---------------------------------------------------------------- the transfer facade


class MooncakeBundleTransfer:
    """Structured objects and DataProto batches on a ``MooncakeDistributedStore``."""

    def __init__(
        self,
        store: BundleStore,
        key_prefix: str = "bundle",
        default_chunk_bytes: int = DEFAULT_BUNDLE_CHUNK_BYTES,
        buffer_pool: Any = None,
    ) -> None:
        prefix = key_prefix.strip("/") if isinstance(key_prefix, str) else ""
        if not prefix or any(ord(c) < 32 for c in prefix):
            raise ValueError("key_prefix must be a non-empty key prefix")
        self.store = store
        self.key_prefix = prefix
        self.default_chunk_bytes = _chunk_bytes(default_chunk_bytes)
        self.buffer_pool = buffer_pool
        self._transport = _Transport(store)
        self._manifests: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._manifests_lock = threading.Lock()

    # ------------------------------------------------------------ bundles

    def _write_bundle(
        self,
        members: Mapping[str, _Member],
        metadata: dict[str, Any] | None,
        meta_bytes: Any,
        partition: str,
        chunk_bytes: int | None,
        config: Any,
        inherited: Mapping[str, Any] | None = None,
        cleanup_keys: Sequence[str] = (),
    ) -> RemoteBundleRef:
        _check_segment(partition, "partition")
        chunk = _chunk_bytes(self.default_chunk_bytes if chunk_bytes is None else chunk_bytes)
        object_id = f"{partition}/{uuid.uuid4().hex}"
        base = f"{self.key_prefix}/{object_id}"
        objs: list[_Obj] = []
        tensor_objs: list[_Obj] = []
        buffers: dict[str, Any] = dict(inherited or {})
        for index, (name, m) in enumerate(members.items()):
            key = f"{base}/b{index}"
            nbytes = sum(n for _p, n in m.pieces)
            spec: dict[str, Any] = {"key": key, "bytes": nbytes, "chunks": []}
            if m.tensor:
                spec.update(kind="tensor", metadata_bytes=TENSOR_HEADER_BYTES, **m.extra)
                spec["chunks"] = [{"key": key, "bytes": nbytes}]
                (tensor_objs if m.caller_object else objs).append(
                    _Obj(key, m.pieces, f"member {name!r}")
                )
            elif nbytes:
                groups = _split_chunks(m.pieces, chunk)
                for j, group in enumerate(groups):
                    ck = key if len(groups) == 1 else f"{key}/c{j}"
                    spec["chunks"].append({"key": ck, "bytes": sum(n for _p, n in group)})
                    objs.append(_Obj(ck, group, f"member {name!r}"))
            buffers[name] = spec
        manifest: dict[str, Any] = {
            "version": 1,
            "layout": "bundle",
            "object_id": object_id,
            "buffers": buffers,
        }
        if metadata is not None:
            manifest["metadata"] = metadata
        if meta_bytes is not None:
            meta = _byte_array(meta_bytes, "meta")
            mkey = f"{base}/meta"
            manifest["meta"] = {"key": mkey, "bytes": meta.nbytes, "chunks": []}
            if meta.nbytes:
                manifest["meta"]["chunks"] = [{"key": mkey, "bytes": meta.nbytes}]
                objs.append(_Obj(mkey, [(int(meta.ctypes.data), meta.nbytes)], "meta"))
                members = {**members, "\x00meta": _Member({}, [], [meta])}
        if cleanup_keys:
            manifest["cleanup_keys"] = list(dict.fromkeys(cleanup_keys))
        blob = np.frombuffer(json.dumps(manifest, separators=(",", ":")).encode(), dtype=np.uint8)
        manifest_key = f"{base}/manifest"
        objs.append(_Obj(manifest_key, [(int(blob.ctypes.data), blob.nbytes)], "manifest"))
        keep_alive = [m.owners for m in members.values()]
        self._transport.write_tensor_objects(tensor_objs, config)
        try:
            self._transport.write(objs, config)
        except Exception:
            self._transport.remove([o.key for o in tensor_objs], strict=False)
            raise
        del keep_alive
        self._remember(manifest_key, manifest)
        return RemoteBundleRef(manifest_key, manifest)

    def _remember(self, key: str, manifest: dict[str, Any]) -> None:
        with self._manifests_lock:
            self._manifests[key] = manifest
            self._manifests.move_to_end(key)
            while len(self._manifests) > _MANIFEST_CACHE:
                self._manifests.popitem(last=False)

    def _forget(self, key: str) -> None:
        with self._manifests_lock:
            self._manifests.pop(key, None)

    def _cached(self, key: Any) -> dict[str, Any] | None:
        if not key:
            return None
        with self._manifests_lock:
            return self._manifests.get(key)

    def _manifests_of(
        self, refs: Sequence[RemoteBundleRef | Mapping[str, Any]], what: str = "bundle"
    ) -> list[dict[str, Any]]:
        """Manifests of ``refs``: carried, cached, or fetched in one batch."""
        out: list[Any] = []
        missing: list[tuple[int, str]] = []
        key: Any
        manifest: Any
        for i, ref in enumerate(refs):
            if isinstance(ref, RemoteBundleRef):
                key, manifest = ref.manifest_key, ref.manifest
            else:
                key, manifest = ref.get("manifest_key"), ref.get("manifest")
                if not isinstance(key, str) and manifest is None:
                    raise ValueError("bundle ref must include manifest_key")
            manifest = manifest or self._cached(key)
            out.append(manifest or None)
            if not manifest:
                missing.append((i, key))
        if missing:
            blobs = self._transport.get_blobs([k for _i, k in missing])
            for (i, key), blob in zip(missing, blobs, strict=True):
                if not blob:
                    raise StructuredObjectMissingError(
                        f"{what} manifest {key!r} is missing from the store (cleaned up or evicted)"
                    )
                try:
                    manifest = json.loads(bytes(blob).decode("utf-8"))
                except (UnicodeDecodeError, ValueError) as exc:
                    raise ValueError(f"{what} manifest {key!r} is not valid JSON") from exc
                out[i] = manifest
                self._remember(key, manifest)
        for m in out:
            self._validate_manifest(m)
        return out

    def _validate_manifest(self, manifest: Any) -> None:
        if (
            not isinstance(manifest, dict)
            or manifest.get("version") != 1
            or manifest.get("layout") != "bundle"
        ):
            raise ValueError("invalid bundle manifest")
        prefix = f"{self.key_prefix}/"
        buffers = manifest.get("buffers")
        if not isinstance(buffers, dict):
            raise ValueError("bundle manifest buffers must be a dict")  # noqa: TRY004 - upstream raises ValueError
        specs = list(buffers.values()) + ([manifest["meta"]] if "meta" in manifest else [])
        for spec in specs:
            if not isinstance(spec, dict) or not isinstance(spec.get("chunks"), list):
                raise ValueError("bundle payload spec must be a dict with chunks")  # noqa: TRY004 - upstream raises ValueError
            total = 0
            for chunk in spec["chunks"]:
                if not isinstance(chunk, dict) or not str(chunk.get("key", "")).startswith(prefix):
                    raise ValueError("bundle chunk key is outside the bundle namespace")
                total += int(chunk.get("bytes", -1))
            if total != int(spec.get("bytes", -1)):
                raise ValueError("bundle payload chunks do not add up to its size")
        for key in manifest.get("cleanup_keys", []):
            if not isinstance(key, str) or not key.startswith(prefix):
                raise ValueError("bundle manifest cleanup_keys are outside the bundle namespace")

    @staticmethod
    def _keys_of(manifest: Mapping[str, Any], manifest_key: str) -> list[str]:
        specs = list(manifest["buffers"].values()) + (
            [manifest["meta"]] if "meta" in manifest else []
        )
        keys = [c["key"] for s in specs for c in s["chunks"]]
        return [*keys, *manifest.get("cleanup_keys", []), manifest_key]

    def put_bundle(
        self,
        meta: bytes | bytearray | memoryview,
        buffers: Mapping[str, Any],
        partition: str = "default",
        chunk_bytes: int | None = None,
        policy: BundleTransferPolicy | None = None,
        max_inflight_put: int | None = None,
        config: Any = None,
    ) -> RemoteBundleRef:
        """Store raw ``meta`` bytes plus named byte buffers."""
        _policy(policy, max_inflight_put)
        members = {}
        for name, value in buffers.items():
            _check_segment(name, "buffer name")
            arr = _byte_array(value, f"buffer {name!r}")
            members[name] = _Member(
                {"encoding": "bytes"},
                [(int(arr.ctypes.data), arr.nbytes)] if arr.nbytes else [],
                [arr],
            )
        return self._write_bundle(members, None, meta, partition, chunk_bytes, config)

    def remove_bundle(self, ref: RemoteBundleRef | Mapping[str, Any]) -> None:
        """Remove every object of a bundle."""
        manifest = self._manifests_of([ref])[0]
        key = ref.manifest_key if isinstance(ref, RemoteBundleRef) else str(ref.get("manifest_key"))
        self._transport.remove(self._keys_of(manifest, key), strict=True)
        self._forget(key)

    def put_structured_object(
        self,
        payload: StructuredObjectPayload,
        partition: str = "default",
        chunk_bytes: int | None = None,
        policy: BundleTransferPolicy | None = None,
        max_inflight_put: int | None = None,
        config: Any = None,
    ) -> RemoteBundleRef:
        """Store a structured object: JSON ``payload.metadata`` plus members."""
        p = _policy(policy, max_inflight_put)
        if not isinstance(payload.metadata, Mapping):
            raise TypeError("structured metadata must be a mapping")
        metadata = dict(payload.metadata)
        if STRUCTURED_FIELD_SPECS_KEY in metadata:
            raise ValueError(f"structured metadata key {STRUCTURED_FIELD_SPECS_KEY!r} is reserved")
        if not isinstance(metadata.get("layout", "structured"), str):
            raise ValueError("structured metadata layout must be a string")  # noqa: TRY004 - upstream raises ValueError
        metadata.setdefault("layout", "structured")
        members: dict[str, _Member] = {}
        for name, value in payload.buffers.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"invalid bundle buffer name: {name!r}")
            members[name] = _encode_member(name, value, p)
        if members:
            metadata[STRUCTURED_FIELD_SPECS_KEY] = {n: m.fspec for n, m in members.items()}
        try:
            json.dumps(metadata)
        except TypeError as exc:
            raise TypeError("structured metadata must be JSON-serializable") from exc
        return self._write_bundle(members, metadata, None, partition, chunk_bytes, config)

    def put_object(
        self,
        obj: Any,
        partition: str = "default",
        chunk_bytes: int | None = None,
        policy: BundleTransferPolicy | None = None,
        max_inflight_put: int | None = None,
        config: Any = None,
    ) -> RemoteBundleRef:
        """Store a mapping of members, or one tensor/array value."""
        payload = (
            StructuredObjectPayload({}, obj)
            if isinstance(obj, Mapping)
            else StructuredObjectPayload({"__mooncake_wrapped_object__": True}, {"value": obj})
        )
        return self.put_structured_object(
            payload, partition, chunk_bytes, policy, max_inflight_put, config
        )

    def get_object(self, ref: RemoteBundleRef | Mapping[str, Any]) -> Any:
        result = self.materialize(self.read_spec(ref))
        if result.metadata.get("__mooncake_wrapped_object__"):
            return result.objects["value"]
        return result.objects

    def read_spec(self, ref: RemoteBundleRef | Mapping[str, Any]) -> StructuredObjectReadSpec:
        return StructuredObjectReadSpec(ref=ref)

    def materialize(self, spec: StructuredObjectReadSpec) -> StructuredObjectResult:
        return self.materialize_into(spec, None)

    def materialize_into(
        self, spec: StructuredObjectReadSpec, destinations: Mapping[str, Any] | None
    ) -> StructuredObjectResult:
        """Read the selected members (rows per ``slice_member``) in one request."""
        if spec.member_names is not None and not spec.member_names:
            raise ValueError("structured read spec selected no members")
        manifest = self._manifests_of([spec.ref])[0]
        metadata = self._metadata_of(manifest)
        buffers = manifest["buffers"]
        names = list(buffers) if spec.member_names is None else list(spec.member_names)
        missing = [n for n in names if n not in buffers]
        if missing:
            raise KeyError(f"unknown bundle buffers: {missing}")
        fspecs = metadata.get(STRUCTURED_FIELD_SPECS_KEY, {})
        slices = dict(spec.member_slices)
        dests = destinations or {}
        pendings = []
        for name in names:
            fspec = fspecs.get(name, {"encoding": "bytes"})
            s = slices.get(name)
            rows = None
            if s is not None:
                if s.axis != 0:
                    raise ValueError("structured slicing currently supports axis=0 only")
                total = (
                    int((fspec.get("shape") or [0])[0]) if fspec.get("encoding") != "bytes" else 0
                )
                rows = _rows_of(s, total)
            pendings.append(
                _plan_member(self._transport, name, buffers[name], fspec, rows, dests.get(name))
            )
        values = _run(self._transport, pendings)
        return StructuredObjectResult(dict(metadata), dict(zip(names, values, strict=True)))

    def _metadata_of(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        if "metadata" in manifest:
            return dict(manifest["metadata"])
        meta = manifest.get("meta")
        if not meta or not int(meta["bytes"]):
            return {}
        raw = _run(self._transport, [_plan_bytes("meta", meta, None, None, False)])[0]
        try:
            value = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    @staticmethod
    def release_result(result: Any) -> None:
        """Release pool-backed buffers of a result (anything carrying a
        ``_mooncake_pool_owner``), walking dicts, lists and object arrays.
        Results of this implementation own ordinary memory, so this only
        releases owners a caller attached."""
        seen: set[int] = set()

        def visit(value: Any) -> None:
            owner = getattr(value, "_mooncake_pool_owner", None)
            if owner is not None:
                if id(owner) not in seen:
                    seen.add(id(owner))
                    owner.release()
                return
            if isinstance(value, Mapping):
                items: Iterable[Any] = value.values()
            elif isinstance(value, (list, tuple)):
                items = value
            elif isinstance(value, np.ndarray) and value.dtype == object:
                items = value.flat
            else:
                return
            if id(value) in seen:
                return
            seen.add(id(value))
            for item in items:
                visit(item)

        visit(result)

    # ------------------------------------------------------------ DataProto

    def put(
        self,
        data: Any,
        *,
        type: Literal["dataproto", "dict"] = "dataproto",
        namespace: str = "default",
        partition: str = "default",
        stage: str = "default",
        chunk_bytes: int | None = None,
        policy: BundleTransferPolicy | None = None,
        config: Any = None,
        field_schemas: Mapping[str, FieldSchema] | None = None,
    ) -> MooncakeDataProtoRef:
        """Store a DataProto-like object (``type="dataproto"``) or a flat dict
        (``type="dict"``: row-aligned values become fields, others meta_info)."""
        if type == "dataproto":
            stage_data = data
        elif type == "dict":
            stage_data = _flat_dict_to_envelope(data, field_schemas)
        else:
            raise ValueError(f"unsupported Mooncake payload type: {type!r}")
        return self._put_stage(
            None,
            stage_data,
            namespace,
            partition,
            stage,
            chunk_bytes,
            policy,
            False,
            field_schemas,
            config,
        )

    def get(
        self,
        ref: DataProtoRefLike,
        *,
        type: Literal["dataproto", "dict"] = "dataproto",
        fields: Sequence[str] | None = None,
        batch_fields: Sequence[str] | None = None,
        non_tensor_fields: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        data_cls: Any | None = None,
        destinations: Mapping[str, Any] | None = None,
        rows: slice | StructuredMemberSlice | Sequence[int] | None = None,
    ) -> Any:
        """Read a stored object back; ``type="dict"`` gives the flat dict."""
        if type not in ("dataproto", "dict"):
            raise ValueError(f"unsupported Mooncake payload type: {type!r}")
        result = self._get(
            ref,
            fields,
            batch_fields,
            non_tensor_fields,
            meta_info_keys,
            dict if type == "dict" else data_cls,
            destinations,
            rows,
            type == "dict",
        )
        return _envelope_to_flat_dict(result) if type == "dict" else result

    def put_dataproto(
        self,
        data: Any,
        *,
        namespace: str = "default",
        partition: str = "default",
        stage: str = "default",
        chunk_bytes: int | None = None,
        policy: BundleTransferPolicy | None = None,
        field_schemas: Mapping[str, FieldSchema] | None = None,
        config: Any = None,
    ) -> MooncakeDataProtoRef:
        """Store a DataProto-like object as the structured object of ``stage``."""
        return self.put(
            data,
            type="dataproto",
            namespace=namespace,
            partition=partition,
            stage=stage,
            chunk_bytes=chunk_bytes,
            policy=policy,
            config=config,
            field_schemas=field_schemas,
        )

    def append_dataproto_fields(
        self,
        ref: DataProtoRefLike,
        data: Any,
        *,
        stage: str,
        overwrite: bool = False,
        chunk_bytes: int | None = None,
        policy: BundleTransferPolicy | None = None,
        field_schemas: Mapping[str, FieldSchema] | None = None,
        config: Any = None,
    ) -> MooncakeDataProtoRef:
        """Add the fields of ``data`` as ``stage`` (existing fields are not
        rewritten; a name already present needs ``overwrite=True``, which
        replaces every field of that stage)."""
        r = _resolve_ref(ref)
        return self._put_stage(
            r,
            data,
            r.namespace,
            r.partition,
            stage,
            chunk_bytes,
            policy,
            overwrite,
            field_schemas,
            config,
        )

    def dataproto_manifest_view(self, ref: DataProtoRefLike) -> dict[str, Any]:
        """Fields, stages and member specs of a ref, read from its manifests."""
        r = _resolve_ref(ref)
        stages = list(r.stage_refs)
        manifests = dict(zip(stages, self._stage_manifests(r, stages), strict=True))
        metas = {s: self._metadata_of(m) for s, m in manifests.items()}
        fields: dict[str, dict[str, Any]] = {}
        for name, loc in r.field_index.items():
            specs = metas[loc.stage].get(STRUCTURED_FIELD_SPECS_KEY, {})
            spec = dict(specs.get(loc.member, {"encoding": "bytes"}))
            enc = r.encoded_non_tensor.get(name)
            if enc is not None:
                spec = {
                    "encoding": "structured_non_tensor",
                    "codec": enc["codec"],
                    "metadata": enc.get("metadata"),
                    "payload_members": dict(enc["payload_members"]),
                    "payload_specs": {
                        p: dict(specs.get(m, {"encoding": "bytes"}))
                        for p, m in enc["payload_members"].items()
                    },
                }
            fields[name] = {
                "section": loc.section,
                "stage": loc.stage,
                "member": loc.member,
                "spec": spec,
            }
        return {
            "namespace": r.namespace,
            "partition": r.partition,
            "batch_size": r.batch_size,
            "batch_fields": {n: f for n, f in fields.items() if f["section"] == "batch"},
            "non_tensor_fields": {
                n: f for n, f in fields.items() if f["section"] == "non_tensor_batch"
            },
            "meta_info_keys": list(r.meta_info),
            "stages": {
                s: {"manifest_key": sr.manifest_key, "dataproto": metas[s].get("dataproto", {})}
                for s, sr in r.stage_refs.items()
            },
        }

    def get_dataproto(
        self,
        ref: DataProtoRefLike,
        *,
        fields: Sequence[str] | None = None,
        batch_fields: Sequence[str] | None = None,
        non_tensor_fields: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        data_cls: Any | None = None,
        destinations: Mapping[str, Any] | None = None,
        rows: slice | StructuredMemberSlice | Sequence[int] | None = None,
    ) -> Any:
        """Read selected fields (all by default) and rows of a stored DataProto."""
        return self._get(
            ref,
            fields,
            batch_fields,
            non_tensor_fields,
            meta_info_keys,
            data_cls,
            destinations,
            rows,
            False,
        )

    def cleanup_dataproto(self, ref: DataProtoRefLike) -> None:
        """Remove every stage object of a ref (or exported handle)."""
        r = _resolve_ref(ref)
        seen: set[str] = set()
        stages: list[str] = []
        for s, sr in r.stage_refs.items():
            if sr.manifest_key not in seen:
                seen.add(sr.manifest_key)
                stages.append(s)
        manifests = self._stage_manifests(r, stages)
        keys: list[str] = []
        for stage, manifest in zip(stages, manifests, strict=True):
            keys.extend(self._keys_of(manifest, r.stage_refs[stage].manifest_key))
        self._transport.remove(keys, strict=True)
        for stage in stages:
            self._forget(r.stage_refs[stage].manifest_key)

    def _stage_manifests(
        self, r: MooncakeDataProtoRef, stages: Sequence[str]
    ) -> list[dict[str, Any]]:
        try:
            return self._manifests_of([r.stage_refs[s] for s in stages], "DataProto stage")
        except StructuredObjectMissingError as exc:
            names = ", ".join(repr(s) for s in stages)
            raise StructuredObjectMissingError(f"DataProto stages {names}: {exc}") from None

    def _put_stage(
        self,
        ref: MooncakeDataProtoRef | None,
        data: Any,
        namespace: str,
        partition: str,
        stage: str,
        chunk_bytes: int | None,
        policy: BundleTransferPolicy | None,
        overwrite: bool,
        field_schemas: Mapping[str, FieldSchema] | None,
        config: Any,
    ) -> MooncakeDataProtoRef:
        p = _policy(policy)
        _check_segment(stage, "stage")
        _check_segment(partition, "partition")
        batch, non_tensor, meta_info = _split_dataproto_like(data)
        _validate_schema_sections(batch, non_tensor, meta_info, field_schemas)
        overlap = sorted(set(batch) & set(non_tensor))
        if overlap:
            raise ValueError(
                f"DataProto batch and non_tensor_batch fields overlap: {overlap} "
                "(a field name may be used in one section only)"
            )
        batch_size = _batch_size(batch, non_tensor)
        if ref is not None:
            _check_stage_update(ref, stage, batch, non_tensor, batch_size, overwrite)
        members: dict[str, _Member] = {}
        index: dict[str, StructuredFieldLocation] = {}
        encoded_updates: dict[str, Any] = {}
        _encode_batch_fields(batch, stage, p, members, index)
        _encode_non_tensor_fields(
            non_tensor, stage, p, field_schemas, members, index, encoded_updates
        )
        group = ref._storage_group_id if ref is not None else _storage_group(config)
        if not members:
            base = ref or MooncakeDataProtoRef(
                batch_size, {}, {}, {}, namespace, partition, _storage_group_id=group
            )
            merged = {**base.meta_info, **meta_info}
            return MooncakeDataProtoRef(
                base.batch_size,
                dict(base.stage_refs),
                dict(base.field_index),
                merged,
                base.namespace,
                base.partition,
                base.global_indexes,
                dict(base.encoded_non_tensor),
                base._storage_group_id,
            )
        stage_meta = {
            "version": 1,
            "namespace": namespace,
            "partition": partition,
            "stage": stage,
            "batch_size": batch_size,
        }
        metadata: dict[str, Any] = {
            "layout": "dataproto_stage",
            "dataproto": stage_meta,
            STRUCTURED_FIELD_SPECS_KEY: {n: m.fspec for n, m in members.items()},
        }
        existing = ref.stage_refs.get(stage) if ref is not None else None
        if existing is not None and not overwrite:
            old = self._stage_manifests(ref, [stage])[0]  # type: ignore[arg-type]
            old_meta = self._metadata_of(old)
            clash = sorted(set(old["buffers"]) & set(members))
            if clash:
                raise ValueError(f"structured members already exist: {clash}")
            metadata[STRUCTURED_FIELD_SPECS_KEY] = {
                **old_meta.get(STRUCTURED_FIELD_SPECS_KEY, {}),
                **metadata[STRUCTURED_FIELD_SPECS_KEY],
            }
            stage_ref = self._write_bundle(
                members,
                metadata,
                None,
                partition,
                chunk_bytes,
                config,
                inherited=old["buffers"],
                cleanup_keys=[*old.get("cleanup_keys", []), existing.manifest_key],
            )
        else:
            stage_ref = self._write_bundle(members, metadata, None, partition, chunk_bytes, config)
            if existing is not None and existing.manifest_key != stage_ref.manifest_key:
                self.remove_bundle(existing)
        if ref is None:
            stage_refs = {stage: stage_ref}
            field_index = index
            merged_meta = dict(meta_info)
            encoded_all = encoded_updates
        else:
            stage_refs = {**ref.stage_refs, stage: stage_ref}
            field_index = {**ref.field_index, **index}
            merged_meta = {**ref.meta_info, **meta_info}
            encoded_all = {n: e for n, e in ref.encoded_non_tensor.items() if n not in index}
            encoded_all.update(encoded_updates)
        return MooncakeDataProtoRef(
            batch_size,
            stage_refs,
            field_index,
            merged_meta,
            namespace,
            partition,
            None if ref is None else ref.global_indexes,
            encoded_all,
            group,
        )

    def _get(
        self,
        ref: DataProtoRefLike,
        fields: Sequence[str] | None,
        batch_fields: Sequence[str] | None,
        non_tensor_fields: Sequence[str] | None,
        meta_info_keys: Sequence[str] | None,
        data_cls: Any | None,
        destinations: Mapping[str, Any] | None,
        rows: Any,
        flat: bool,
    ) -> Any:
        r = _resolve_ref(ref)
        sel = _rows_of(rows, r.batch_size)
        out_rows = r.batch_size if sel is None else sel.count
        batch_names, non_tensor_names = _select_fields(r, fields, batch_fields, non_tensor_fields)
        names = [*batch_names, *non_tensor_names]
        dests = destinations or {}
        unknown_dest = sorted(set(dests) - set(names))
        if unknown_dest:
            raise KeyError(f"destinations name fields that are not read: {unknown_dest}")
        stages = list(dict.fromkeys(r.field_index[n].stage for n in names))
        manifests = dict(zip(stages, self._stage_manifests(r, stages), strict=True))
        metas = {s: self._metadata_of(m) for s, m in manifests.items()}
        plans: dict[str, Any] = {}
        for name in names:
            loc = r.field_index[name]
            manifest, meta = manifests[loc.stage], metas[loc.stage]
            fspecs = meta.get(STRUCTURED_FIELD_SPECS_KEY, {})
            dest = dests.get(name)
            enc = r.encoded_non_tensor.get(name) if loc.section == "non_tensor_batch" else None
            if enc is None:
                if loc.member not in manifest["buffers"]:
                    raise StructuredObjectMissingError(
                        f"field {name!r}: member {loc.member!r} is not in its stage manifest"
                    )
                fspec = fspecs.get(loc.member, {"encoding": "bytes"})
                plans[name] = _plan_member(
                    self._transport,
                    loc.member,
                    manifest["buffers"][loc.member],
                    fspec,
                    sel,
                    dest,
                    label=f"field {name!r}",
                )
            else:
                if dest is not None:
                    raise ValueError(
                        f"field {name!r}: encoded non_tensor_batch fields do not support destinations"
                    )
                plans[name] = _EncodedRead(
                    self._transport, name, enc, manifest["buffers"], fspecs, sel, r.batch_size
                )
        # Phase 1: every plain member and the per-row parts of encoded fields.
        first = [
            g for p in plans.values() for g in (p.groups if isinstance(p, _Pending) else p.phase1())
        ]
        self._transport.read(first)
        second = [g for p in plans.values() if isinstance(p, _EncodedRead) for g in p.phase2()]
        self._transport.read(second)
        batch: dict[str, Any] = {}
        non_tensor: dict[str, Any] = {}
        for name in batch_names:
            batch[name] = plans[name].finish()
        for name in non_tensor_names:
            value = plans[name].finish()
            if isinstance(plans[name], _EncodedRead):
                value = value if flat else _object_array(value)
            non_tensor[name] = value
        del out_rows
        meta_info = (
            dict(r.meta_info)
            if meta_info_keys is None
            else {k: r.meta_info[k] for k in meta_info_keys if k in r.meta_info}
        )
        return _build_result(batch, non_tensor, meta_info, data_cls)


# ---------------------------------------------------------------- encoded reads


class _EncodedRead:
    """A ``non_tensor_batch`` column read: all payloads, or for selected rows
    the per-row parts first, then the data ranges those rows cover."""

    def __init__(
        self,
        transport: _Transport,
        name: str,
        enc: Mapping[str, Any],
        buffers: Mapping[str, Any],
        fspecs: Mapping[str, Any],
        rows: _Rows | None,
        total: int,
    ) -> None:
        self.transport = transport
        self.name = name
        self.enc = enc
        self.buffers = buffers
        self.fspecs = fspecs
        self.total = total
        self.rows = rows
        self.payload: dict[str, Any] = {}
        self._after: list[Callable[[], None]] = []
        self._second: list[_ReadGroup] = []
        members = enc["payload_members"]
        missing = [m for m in members.values() if m not in buffers]
        if missing:
            raise StructuredObjectMissingError(
                f"field {name!r}: payload members {missing} are not in its stage manifest"
            )
        self.whole = rows is None or _needs_whole(enc)

    def _setter(self, pname: str, finish: Callable[[], Any]) -> Callable[[], None]:
        def step() -> None:
            self.payload[pname] = finish()

        return step

    def _member(self, pname: str) -> tuple[str, Mapping[str, Any], Mapping[str, Any]]:
        member = self.enc["payload_members"][pname]
        return member, self.buffers[member], self.fspecs.get(member, {"encoding": "bytes"})

    def _label(self) -> str:
        return f"field {self.name!r}"

    def phase1(self) -> list[_ReadGroup]:
        groups: list[_ReadGroup] = []
        if self.whole:
            for pname in self.enc["payload_members"]:
                member, spec, fspec = self._member(pname)
                pend = _plan_member(
                    self.transport, member, spec, fspec, None, None, bytes_as_array=True
                )
                for g in pend.groups:
                    g.label = self._label()
                groups.extend(pend.groups)
                self._after.append(self._setter(pname, pend.finish))
            return groups
        assert self.rows is not None
        for pname, kind in _row_roles(self.enc):
            member, spec, fspec = self._member(pname)
            if kind == "row":
                pend = _plan_member(self.transport, member, spec, fspec, self.rows, None)
                for g in pend.groups:
                    g.label = self._label()
                groups.extend(pend.groups)
                self._after.append(self._setter(pname, pend.finish))
            elif kind == "offsets":
                pairs = [i for r in self.rows.indices for i in (r, r + 1)]
                sel = _Rows(len(pairs), _runs_of(pairs), tuple(pairs))
                pend = _plan_member(self.transport, member, spec, fspec, sel, None)
                for g in pend.groups:
                    g.label = self._label()
                groups.extend(pend.groups)
                self._after.append(self._setter(pname, pend.finish))
        return groups

    def phase2(self) -> list[_ReadGroup]:
        for step in self._after:
            step()
        self._after = []
        if self.whole:
            return []
        assert self.rows is not None
        groups: list[_ReadGroup] = []
        for pname, kind in _row_roles(self.enc):
            if kind != "data":
                continue
            offsets_name, unit = _data_unit(self.enc, pname, self.fspecs, self._member)
            pairs = np.asarray(self.payload[offsets_name], dtype=np.int64).reshape(-1, 2)
            counts = pairs[:, 1] - pairs[:, 0]
            new_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
            np.cumsum(counts, out=new_offsets[1:])
            self.payload[offsets_name] = new_offsets
            _member, spec, _fspec = self._member(pname)
            target = _empty_array((int(new_offsets[-1]) * unit,), np.dtype(np.uint8))
            frags: list[tuple[str, int, int, int]] = []
            # Coalesce rows whose data ranges touch.
            start = None
            for (b, e), dst in zip(pairs.tolist(), new_offsets[:-1].tolist(), strict=True):
                if e == b:
                    continue
                if start is not None and start[0] + start[1] == b and start[2] + start[1] == dst:
                    start[1] += e - b
                    continue
                if start is not None:
                    frags.extend(
                        _fragments(spec, start[0] * unit, start[1] * unit, start[2] * unit)
                    )
                start = [b, e - b, dst]
            if start is not None:
                frags.extend(_fragments(spec, start[0] * unit, start[1] * unit, start[2] * unit))
            groups.append(_ReadGroup(int(target.ctypes.data), target.nbytes, self._label(), frags))
            self.payload[pname] = target
        return groups

    def finish(self) -> list[Any]:
        for step in self._after:
            step()
        metadata = self.enc.get("metadata") or {}
        if self.whole:
            values = decode_encoded({**self.enc, "metadata": metadata}, self.payload, self.total)
            if self.rows is not None:
                values = [values[i] for i in self.rows.indices]
            return values
        assert self.rows is not None
        metadata = _select_row_metadata(self.enc, metadata, self.rows.indices)
        return decode_encoded({**self.enc, "metadata": metadata}, self.payload, self.rows.count)


def _needs_whole(enc: Mapping[str, Any]) -> bool:
    """Codecs whose rows are read by reading the column (media lists)."""
    codec = enc["codec"]
    if codec == "media_list_ragged":
        return True
    if codec == "structured_recursive":
        return any(
            leaf["codec"] == "media_list_ragged"
            for leaf in (enc.get("metadata") or {}).get("leaves", [])
        )
    return False


def _leaf_roles(codec: str, names: Mapping[str, str]) -> list[tuple[str, str]]:
    """(global payload name, role) of one leaf codec's payloads."""
    roles = []
    for local, global_name in names.items():
        if local == "offsets" and (codec in RAGGED_CODECS or codec in BYTES_CODECS):
            roles.append((global_name, "offsets"))
        elif local == "data" and (codec in RAGGED_CODECS or codec in BYTES_CODECS):
            roles.append((global_name, "data"))
        else:
            roles.append((global_name, "row"))
    return roles


def _row_roles(enc: Mapping[str, Any]) -> list[tuple[str, str]]:
    codec = enc["codec"]
    members = enc["payload_members"]
    meta = enc.get("metadata") or {}
    if codec == "ragged_tensor_dict":
        roles = [("null_mask", "row")]
        for key in meta.get("keys", []):
            roles.extend(
                _leaf_roles(
                    "ragged_tensor", {n: f"{key}.{n}" for n in _RAGGED_TENSOR_PAYLOAD_NAMES}
                )
            )
        return roles
    if codec == "structured_recursive":
        roles = []
        leaf_names: set[str] = set()
        for leaf in meta.get("leaves", []):
            local = {n: g for n, g in leaf["payload_members"].items() if n != "missing"}
            roles.extend(_leaf_roles(leaf["codec"], local))
            leaf_names.update(local.values())
        roles.extend((p, "row") for p in members if p not in leaf_names)
        return roles
    return _leaf_roles(codec, {p: p for p in members})


def _data_unit(
    enc: Mapping[str, Any],
    data_name: str,
    fspecs: Mapping[str, Any],
    member_of: Callable[[str], Any],
) -> tuple[str, int]:
    """The offsets payload of a data payload and the bytes of one offset unit."""
    offsets_name = data_name[: -len("data")] + "offsets"
    codec, meta = _codec_of(enc, data_name)
    if codec in BYTES_CODECS:
        return offsets_name, 1
    if codec == "ragged_tensor":
        return offsets_name, require_torch().empty(
            0, dtype=_torch_dtype(meta.get("dtype", "torch.float32"))
        ).element_size()
    return offsets_name, np.dtype(meta.get("dtype", "int64")).itemsize


def _codec_of(enc: Mapping[str, Any], pname: str) -> tuple[str, Mapping[str, Any]]:
    meta = enc.get("metadata") or {}
    if enc["codec"] == "ragged_tensor_dict":
        key = pname.split(".", 1)[0]
        return "ragged_tensor", (meta.get("key_codecs") or {}).get(key) or {}
    if enc["codec"] == "structured_recursive":
        for leaf in meta.get("leaves", []):
            if pname in leaf["payload_members"].values():
                return leaf["codec"], leaf.get("metadata") or {}
        raise ValueError(f"payload {pname!r} belongs to no leaf")
    return enc["codec"], meta


def _select_row_metadata(
    enc: Mapping[str, Any], meta: Mapping[str, Any], indices: Sequence[int]
) -> dict[str, Any]:
    out = dict(meta)
    if "media_encodings" in out and enc["codec"] in BYTES_CODECS:
        out["media_encodings"] = [out["media_encodings"][i] for i in indices]
    if out.get("ndarray_rows"):
        out["ndarray_rows"] = [out["ndarray_rows"][i] for i in indices]
    if enc["codec"] == "structured_recursive":
        leaves = []
        for leaf in out.get("leaves", []):
            leaf = dict(leaf)
            leaf["metadata"] = _select_row_metadata(
                {"codec": leaf["codec"]}, leaf.get("metadata") or {}, indices
            )
            leaves.append(leaf)
        out["leaves"] = leaves
    return out


def _object_array(values: Sequence[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


# ---------------------------------------------------------------- DataProto helpers


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


_ = (torch_module, _Missing)
