"""Bundles and structured objects on a store.

A structured object is stored as one store object per member (split into
chunks of ``chunk_bytes``) and one JSON manifest that lists them; the
manifest and every member go to the store in one batched write, so a reader
that finds the manifest finds every member. Manifests are cached per
transfer object (most recent 512).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from mooncake.structured.members import (
    _encode_member,
    _Member,
)
from mooncake.structured.memory import (
    TENSOR_HEADER_BYTES,
    _byte_array,
)
from mooncake.structured.objects import (
    BundleTransferPolicy,
    StructuredObjectPayload,
    StructuredObjectReadSpec,
    StructuredObjectResult,
    _policy,
)
from mooncake.structured.plan import (
    _plan_bytes,
    _plan_member,
    _rows_of,
    _run,
)
from mooncake.structured.refs import RemoteBundleRef
from mooncake.structured.transport import (
    StructuredObjectMissingError,
    _Obj,
    _Transport,
)

DEFAULT_BUNDLE_CHUNK_BYTES = 64 * 1024**2
STRUCTURED_FIELD_SPECS_KEY = "__mooncake_structured_fields__"
_MANIFEST_CACHE = 512


class BundleStore(Protocol):
    def put(self, key: str, value: Any, config: Any = None) -> int: ...

    def get(self, key: str) -> bytes: ...

    def remove(self, key: str, force: bool = False) -> int: ...


def _check_segment(value: Any, what: str) -> None:
    if not isinstance(value, str) or not value or "/" in value or any(ord(c) < 32 for c in value):
        raise ValueError(f"invalid bundle {what}: {value!r}")


def _chunk_bytes(value: int) -> int:
    if not isinstance(value, int) or value <= 0:
        raise ValueError("chunk_bytes must be positive")
    return value


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


class StructuredObjectTransfer:
    """Bundles and structured objects on a store: manifests, batched writes
    and one-request reads of selected members."""

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
