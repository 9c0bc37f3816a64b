"""Leases of registered scratch memory from a store's local buffer.

``BufferPool(store, max_bytes=0, min_size_class=64 KiB, max_size_class=None,
alignment=8 MiB, block_on_exhaustion=True, default_timeout=None,
max_regions=None, prewarm_size=None, prewarm_count=0)``; ``acquire(size,
block=None, timeout=None)`` / ``buffer(...)`` return a lease with ``ptr``,
``size``, ``buffer`` (a memoryview) and ``release()``. ``RegisteredBufferPool``
is the same class.
"""

from __future__ import annotations

from mooncake.store import BufferPool, RegisteredBufferPool

__all__ = ["BufferPool", "RegisteredBufferPool"]
