"""Stored tensor objects built in memory, for the tensor tests."""

from __future__ import annotations

from typing import Any

from helpers.tensor_format import HEADER


def obj_buffer(t: Any) -> Any:
    """A uint8 torch tensor holding ``t`` as the store keeps it: the
    304-byte header, then the data (imports torch)."""
    import torch
    from mooncake.store import _serialize_tensor

    header, _ptr, n, owner = _serialize_tensor(t)
    buf = torch.empty(HEADER + n, dtype=torch.uint8)
    buf[:HEADER] = torch.frombuffer(bytearray(header), dtype=torch.uint8)
    buf[HEADER:] = owner.reshape(-1).view(torch.uint8)
    return buf
