"""Whether this machine can run the CUDA tests, and why not.

``SKIP_REASON`` is ``None`` when a CUDA driver loads and torch sees a CUDA
device; otherwise it says what is missing, starting with "no CUDA driver was
found" when ``libcuda.so.1`` cannot be loaded (the case of CI machines).
"""

from __future__ import annotations

import ctypes
from typing import Any


def _reason() -> str | None:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return f"no CUDA driver was found (libcuda.so.1: {e})"
    try:
        import torch
    except ImportError:
        return "a CUDA driver is present but torch is not installed"
    if not torch.cuda.is_available():
        return "a CUDA driver is present but torch sees no CUDA device"
    return None


SKIP_REASON: str | None = _reason()
HAS_CUDA: bool = SKIP_REASON is None


def torch_mod() -> Any:
    import torch

    return torch
