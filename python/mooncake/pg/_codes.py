"""Dtype and reduce-op wire codes, read from the Rust core.

The table lives once, in ``crates/pg/src/dtype.rs``; ``mooncake._native``
exports it as ``(name, code)`` pairs keyed by torch's own attribute names.
Which dtype/op pairs reduce is decided by the core too: an unsupported pair
raises ``ValueError`` from the native submit, before any communication.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mooncake import _native

#: Code of every dtype that is moved but never reduced (f8, complex, ...).
RAW: int = dict(_native.pg_dtype_codes())["raw"]

_DTYPES: dict[torch.dtype, int] = {
    getattr(torch, name): code
    for name, code in _native.pg_dtype_codes()
    if name != "raw" and isinstance(getattr(torch, name, None), torch.dtype)
}

_OPS: list[tuple[object, int]] = [
    (getattr(dist.ReduceOp, name), code)
    for name, code in _native.pg_reduce_op_codes()
    if hasattr(dist.ReduceOp, name)
]


def dtype_code(dt: torch.dtype) -> int:
    """The code of ``dt``; dtypes the core cannot reduce travel as raw bytes."""
    return _DTYPES.get(dt, RAW)


def op_code(op: object) -> int:
    """Code of a ``dist.ReduceOp``; raises ``ValueError`` for PREMUL_SUM and unknown ops."""
    for k, v in _OPS:
        try:
            if op == k:
                return v
        except TypeError:
            continue
    raise ValueError(f"mooncake: unsupported reduce op {op!r} (PREMUL_SUM is not supported)")


def reduction_codes(dt: torch.dtype, op: object) -> tuple[int, int]:
    """``(dtype code, op code)`` of a reduction (the core validates the pair)."""
    return dtype_code(dt), op_code(op)
