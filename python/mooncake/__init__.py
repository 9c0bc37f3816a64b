"""Mooncake (Rust implementation): ``mooncake.store``, ``mooncake.engine``,
``mooncake.pg`` and ``mooncake.structured_object_store``.

``BufferPool`` and ``RegisteredBufferPool`` are available here too (as in
upstream); they load the store extension on first access.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BufferPool", "RegisteredBufferPool"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from mooncake import buffer_pool

        return getattr(buffer_pool, name)
    raise AttributeError(f"module 'mooncake' has no attribute {name!r}")
