"""Memory the structured store writes from and reads into: byte views of
caller buffers, fresh result memory (the client's result pool or huge-page
mappings for large results), and the fields of the 304-byte tensor-object
header."""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from mooncake import _native
from mooncake.structured.common import require_torch

TENSOR_HEADER_BYTES = 304


def _prod(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


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


def _header_shape(header: bytes | bytearray) -> list[int]:
    ndim = int(np.frombuffer(header, "<i4", 1, 12)[0])
    return [int(d) for d in np.frombuffer(header, "<i8", 8, 104)[:ndim]]


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
