"""The torch dtypes a stored tensor may have."""

from __future__ import annotations

from typing import Any


def tensor_dtypes() -> list[Any]:
    """Every torch dtype the stored tensor format carries (imports torch, so
    call it after the caller's ``importorskip``)."""
    import torch

    return [
        torch.float32,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.uint16,
        torch.int32,
        torch.uint32,
        torch.int64,
        torch.uint64,
        torch.bool,
        torch.float16,
        torch.bfloat16,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    ]
