"""Reads of codec-encoded ``non_tensor_batch`` columns.

All rows read every payload. Selected rows read in two phases: first the
per-row parts (null masks, shapes, offset pairs of the selected rows), then
the data ranges those offsets cover; media-list columns are read whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mooncake.structured.common import (
    _RAGGED_TENSOR_PAYLOAD_NAMES,
    BYTES_CODECS,
    RAGGED_CODECS,
    _torch_dtype,
    require_torch,
)
from mooncake.structured.decode import decode_encoded
from mooncake.structured.memory import _empty_array
from mooncake.structured.plan import (
    _fragments,
    _plan_member,
    _Rows,
    _runs_of,
)
from mooncake.structured.transport import (
    StructuredObjectMissingError,
    _ReadGroup,
    _Transport,
)


@dataclass(eq=False)
class _EncodedRead:
    """A ``non_tensor_batch`` column read: all payloads, or for selected rows
    the per-row parts first, then the data ranges those rows cover."""

    transport: _Transport
    name: str
    enc: Mapping[str, Any]
    buffers: Mapping[str, Any]
    fspecs: Mapping[str, Any]
    rows: _Rows | None
    total: int
    payload: dict[str, Any] = field(default_factory=dict, init=False)
    _after: list[Callable[[], None]] = field(default_factory=list, init=False)
    _second: list[_ReadGroup] = field(default_factory=list, init=False)
    whole: bool = field(init=False)

    def __post_init__(self) -> None:
        members = self.enc["payload_members"]
        missing = [m for m in members.values() if m not in self.buffers]
        if missing:
            raise StructuredObjectMissingError(
                f"field {self.name!r}: payload members {missing} are not in its stage manifest"
            )
        self.whole = self.rows is None or _needs_whole(self.enc)

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
