"""Helpers shared by the test suite and its child-process scripts (no pytest import)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np

_BLOCK = 1 << 20


def pattern_array(size: int, seed: int = 0) -> np.ndarray:
    """Deterministic pseudo-random uint8 array, identical in every process."""
    out = np.empty(size, np.uint8)
    idx = np.arange(min(size, _BLOCK), dtype=np.uint32)
    for off in range(0, size, _BLOCK):
        n = min(_BLOCK, size - off)
        salt = np.uint32((seed * 97 + (off // _BLOCK) * 131 + 13) & 0xFFFFFFFF)
        mixed = idx[:n] * np.uint32(2654435761) + salt
        out[off : off + n] = (mixed >> np.uint32(13)).astype(np.uint8)
    return out


def pattern(size: int, seed: int = 0) -> bytes:
    """``pattern_array(size, seed)`` as bytes."""
    return pattern_array(size, seed).tobytes()


def write_config(
    path: Path,
    local_hostname: str,
    metadata_server: str,
    master_server_address: str | None,
    **more: Any,
) -> Path:
    """Writes a Mooncake JSON config file to ``path``: the fields every config
    names (``master_server_address`` left out when None), then ``more``;
    returns ``path``."""
    fields = {"local_hostname": local_hostname, "metadata_server": metadata_server}
    if master_server_address is not None:
        fields["master_server_address"] = master_server_address
    path.write_text(json.dumps({**fields, **more}))
    return path


def sglang_warmup(store: Any) -> bytes:
    """SGLang's ``MooncakeStore.warmup()``: a 4 KiB value put under a fresh
    warm-up key must exist and read back unchanged; returns that value."""
    warmup_key = "sglang_mooncake_store_warmup_key" + uuid.uuid4().hex
    warmup_value = bytes(4 * 1024)
    assert store.put(warmup_key, warmup_value) == 0
    assert store.is_exist(warmup_key) == 1
    assert store.get(warmup_key) == warmup_value
    return warmup_value
