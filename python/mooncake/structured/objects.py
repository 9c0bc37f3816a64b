"""The value types callers pass in and get back: write policy, field
schemas, structured payloads and results, read specs with row slices, and
caller memory given as a tensor-object buffer or a raw destination."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mooncake.structured.refs import RemoteBundleRef


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
