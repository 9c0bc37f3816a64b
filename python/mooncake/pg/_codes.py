"""Wire codes for dtypes and reduction ops shared with the Rust core."""

from __future__ import annotations

import torch
import torch.distributed as dist

# Reducible dtypes and their codes (see crates/pg/src/dtype.rs).
_REDUCIBLE: dict[torch.dtype, int] = {
    torch.uint8: 0,
    torch.int8: 1,
    torch.int16: 2,
    torch.int32: 4,
    torch.int64: 6,
    torch.bool: 8,
    torch.float16: 9,
    torch.bfloat16: 10,
    torch.float32: 11,
    torch.float64: 12,
}
for _name, _code in (("uint16", 3), ("uint32", 5), ("uint64", 7)):
    if hasattr(torch, _name):
        _REDUCIBLE[getattr(torch, _name)] = _code

RAW = 13
FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}

_OPS: dict[object, int] = {
    dist.ReduceOp.SUM: 0,
    dist.ReduceOp.PRODUCT: 1,
    dist.ReduceOp.MIN: 2,
    dist.ReduceOp.MAX: 3,
    dist.ReduceOp.AVG: 4,
    dist.ReduceOp.BAND: 5,
    dist.ReduceOp.BOR: 6,
    dist.ReduceOp.BXOR: 7,
}
_OP_NAMES = {0: "SUM", 1: "PRODUCT", 2: "MIN", 3: "MAX", 4: "AVG", 5: "BAND", 6: "BOR", 7: "BXOR"}


def dtype_code(dt: torch.dtype) -> int:
    """Code for data movement: reducible types keep their code, others are raw bytes."""
    return _REDUCIBLE.get(dt, RAW)


def op_code(op: object) -> int:
    """Code of a ``dist.ReduceOp``; raises ``ValueError`` for PREMUL_SUM and unknown ops."""
    for k, v in _OPS.items():
        try:
            if op == k:
                return v
        except TypeError:
            continue
    raise ValueError(f"mooncake: unsupported reduce op {op!r} (PREMUL_SUM is not supported)")


def reduction_codes(dt: torch.dtype, op: object) -> tuple[int, int]:
    """Validated ``(dtype_code, op_code)`` for a reduction; raises ``ValueError``."""
    oc = op_code(op)
    code = _REDUCIBLE.get(dt)
    if code is None:
        raise ValueError(f"mooncake: reductions are not supported for dtype {dt}")
    if oc == 4 and dt not in FLOATS:
        raise ValueError(f"mooncake: ReduceOp.AVG requires a floating-point dtype, got {dt}")
    if oc >= 5 and dt in FLOATS:
        raise ValueError(f"mooncake: ReduceOp.{_OP_NAMES[oc]} is not supported for dtype {dt}")
    return code, oc
