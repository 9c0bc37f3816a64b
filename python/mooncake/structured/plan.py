"""Read plans for members: which rows are selected, which byte fragments of
which chunks land where, and the value each member read produces once its
fragments are in memory."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mooncake.structured.common import (
    _torch_dtype,
    require_torch,
)
from mooncake.structured.memory import (
    TENSOR_HEADER_BYTES,
    _empty_array,
    _empty_tensor,
    _header_shape,
    _prod,
)
from mooncake.structured.objects import (
    StructuredMemberSlice,
    _RawDestinationBuffer,
    _TensorObjectBufferPayload,
)
from mooncake.structured.transport import (
    _ReadGroup,
    _Transport,
)


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


class _Pending:
    """A planned member read: groups to run, then ``finish()`` for the value."""

    def __init__(self, groups: list[_ReadGroup], finish: Callable[[], Any]) -> None:
        self.groups = groups
        self.finish = finish


def _dest_ptr(label: str, dest: Any, nbytes: int) -> tuple[int, int, bool]:
    if dest.size < nbytes:
        raise ValueError(f"{label}: destination has {dest.size} bytes, needs at least {nbytes}")
    return dest.ptr, dest.size, bool(getattr(dest, "pre_registered", False))


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
