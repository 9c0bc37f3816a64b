"""The DataProto API of :class:`MooncakeBundleTransfer`: a DataProto-like
batch is stored as one structured object per stage, read back by fields and
rows (every field of a call in one request; ragged fields take a second
request for their data ranges), extended by stage and cleaned up."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from mooncake.structured.bundle import (
    STRUCTURED_FIELD_SPECS_KEY,
    StructuredObjectTransfer,
    _check_segment,
)
from mooncake.structured.dataproto import (
    _batch_size,
    _build_result,
    _check_stage_update,
    _envelope_to_flat_dict,
    _flat_dict_to_envelope,
    _object_array,
    _select_fields,
    _split_dataproto_like,
    _storage_group,
    _validate_schema_sections,
)
from mooncake.structured.encoded_reads import _EncodedRead
from mooncake.structured.members import (
    _encode_batch_fields,
    _encode_non_tensor_fields,
    _Member,
)
from mooncake.structured.objects import (
    BundleTransferPolicy,
    FieldSchema,
    StructuredMemberSlice,
    _policy,
)
from mooncake.structured.plan import (
    _Pending,
    _plan_member,
    _rows_of,
)
from mooncake.structured.refs import (
    DataProtoRefLike,
    MooncakeDataProtoRef,
    StructuredFieldLocation,
    _resolve_ref,
)
from mooncake.structured.transport import StructuredObjectMissingError


class MooncakeBundleTransfer(StructuredObjectTransfer):
    """Structured objects and DataProto batches on a ``MooncakeDistributedStore``."""

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
