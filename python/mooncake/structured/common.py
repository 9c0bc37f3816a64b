"""Names every structured module shares: optional torch access, the
``MISSING`` sentinel, the codec families and the default dtypes of ragged
columns.

torch is never imported to test a value: a process that never imported
torch holds no tensors, so :func:`is_tensor` is false there without the
import cost. :func:`require_torch` imports it where a tensor must be built.
"""

from __future__ import annotations

import sys
from typing import Any

_TYPED_RAGGED_DEFAULT_DTYPE = "int64"
_RAGGED_TENSOR_DEFAULT_DTYPE = "torch.float32"
_RAGGED_TENSOR_PAYLOAD_NAMES = frozenset({"data", "offsets", "shapes", "ndims", "nulls"})
BYTES_CODECS = frozenset(
    {"media_bytes", "bytes_ragged", "utf8_ragged", "msgpack_ragged", "json_ragged"}
)
RAGGED_CODECS = frozenset({"ragged_tensor", "typed_ragged"})


def torch_module() -> Any:
    """``torch`` when it is already imported, else None (values of a process
    that never imported torch cannot be tensors)."""
    return sys.modules.get("torch")


def require_torch() -> Any:
    import torch

    return torch


def is_tensor(value: Any) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(value, torch.Tensor)


def _torch_dtype(name: str) -> Any:
    torch = require_torch()
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype: {name}")  # noqa: TRY004
    return dtype


class _Missing:
    """A dict key absent from a row (not the same as a ``None`` value)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<MISSING>"

    def __reduce__(self) -> str:
        return "MISSING"


MISSING = _Missing()
