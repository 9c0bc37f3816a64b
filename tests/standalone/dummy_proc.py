"""A dummy client in its own process, driven by JSON lines on stdin (one
request, one JSON answer line on stdout). Used by the standalone suite for
several dummies at once and for dummies that die.

usage: python dummy_proc.py HOST:PORT
"""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))

from helpers.common import pattern_array
from mooncake.store import MooncakeDistributedStore, MooncakeHostMemAllocator

ADDRESS = sys.argv[1]
store = MooncakeDistributedStore()
alloc = MooncakeHostMemAllocator()
buffers: dict[str, tuple[int, int]] = {}


def view(ptr: int, size: int) -> Any:
    import numpy as np

    return np.frombuffer((ctypes.c_uint8 * size).from_address(ptr), dtype=np.uint8)


def op_setup(mem_pool_size: int, local_buffer_size: int) -> int:
    return int(store.setup_dummy(mem_pool_size, local_buffer_size, ADDRESS))


def op_buffer(name: str, size: int, register: bool = True) -> int:
    ptr = alloc.alloc(size)
    assert ptr, "alloc failed"
    buffers[name] = (ptr, size)
    return int(store.register_buffer(ptr, size)) if register else 0


def op_rounds(prefix: str, n: int, size: int, seed: int) -> int:
    """n put/get round trips of distinct keys through buffer 'io'; the count verified."""
    ptr, cap = buffers["io"]
    assert 2 * size <= cap
    src, dst = view(ptr, size), view(ptr + size, size)
    good = 0
    for i in range(n):
        src[:] = pattern_array(size, seed + i)
        k = f"{prefix}/{i}"
        if store.put_from(k, ptr, size) != 0:
            continue
        dst[:] = 0
        if store.get_into(k, ptr + size, size) == size and (dst == src).all():
            good += 1
    return good


def op_put_session(keys: list[str], sizes: list[int]) -> list[int]:
    return [int(r) for r in store.batch_put_session_start(keys, sizes)]


def op_get_session(keys: list[str]) -> list[int]:
    return [int(r) for r in store.batch_get_session_start(keys)]


def op_put(key: str, size: int, seed: int) -> int:
    return int(store.put(key, pattern_array(size, seed).tobytes()))


def op_stats() -> dict[str, int]:
    return {k: int(v) for k, v in store.get_client_stats().items()}


def op_close() -> int:
    return int(store.close())


OPS = {name[3:]: fn for name, fn in globals().items() if name.startswith("op_")}

for line in sys.stdin:
    req = json.loads(line)
    name = req.pop("op")
    try:
        out = {"result": OPS[name](**req)}
    except Exception as e:  # noqa: BLE001  (reported to the test, which fails on it)
        out = {"error": f"{type(e).__name__}: {e}"}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
