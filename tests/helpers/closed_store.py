"""Call every Tier 1 method on a never-set-up or a closed store; print JSON results.

usage: closed_store.py never|closed [METADATA_URL MASTER_ADDR]

Runs in its own process because upstream 0.3.13 segfaults here; the test then
sees a non-zero exit status instead of losing the whole pytest session.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from mooncake.store import MooncakeDistributedStore


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        return {"bytes": v.hex()}
    if v is None or isinstance(v, (int, str, float, bool)):
        return v
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    return {"repr": type(v).__name__}


def main() -> int:
    mode = sys.argv[1]
    s = MooncakeDistributedStore()
    if mode == "closed":
        rc = s.setup("127.0.0.1", sys.argv[2], 16 << 20, 16 << 20, "tcp", "", sys.argv[3])
        assert rc == 0, rc
        assert s.put("pre", b"x") == 0
        assert s.close() == 0
    buf = np.zeros(4096, np.uint8)
    p = int(buf.ctypes.data)
    calls: dict[str, Callable[[], Any]] = {
        "put": lambda: s.put("k", b"v"),
        "put_parts": lambda: s.put_parts("k", b"a", b"b"),
        "put_batch": lambda: s.put_batch(["a", "b"], [b"1", b"2"]),
        "upsert": lambda: s.upsert("k", b"v"),
        "get": lambda: s.get("pre"),
        "get_batch": lambda: s.get_batch(["a", "b"]),
        "get_buffer": lambda: s.get_buffer("pre"),
        "batch_get_buffer": lambda: s.batch_get_buffer(["a", "b"]),
        "get_size": lambda: s.get_size("pre"),
        "is_exist": lambda: s.is_exist("pre"),
        "batch_is_exist": lambda: s.batch_is_exist(["a", "b"]),
        "remove": lambda: s.remove("pre"),
        "batch_remove": lambda: s.batch_remove(["a", "b"]),
        "remove_by_regex": lambda: s.remove_by_regex("a"),
        "remove_all": lambda: s.remove_all(),
        "register_buffer": lambda: s.register_buffer(p, 4096),
        "unregister_buffer": lambda: s.unregister_buffer(p),
        "put_from": lambda: s.put_from("k", p, 16),
        "get_into": lambda: s.get_into("pre", p, 4096),
        "batch_put_from": lambda: s.batch_put_from(["a", "b"], [p, p], [8, 8]),
        "batch_get_into": lambda: s.batch_get_into(["a", "b"], [p, p], [8, 8]),
        "upsert_from": lambda: s.upsert_from("k", p, 16),
        "get_into_ranges": lambda: s.get_into_ranges(
            [p], [["a", "b"]], [[[0], [8, 16]]], [[[0], [0, 0]]], [[[4], [4, 4]]]
        ),
        "get_hostname": lambda: s.get_hostname(),
        "health_check": lambda: s.health_check(),
        "close": lambda: s.close(),
    }
    out: dict[str, Any] = {}
    for name, fn in calls.items():
        try:
            out[name] = _jsonable(fn())
        except Exception as e:  # noqa: BLE001 - recorded, the test decides
            out[name] = {"exception": f"{type(e).__name__}: {e}"}
        print(json.dumps({name: out[name]}), file=sys.stderr, flush=True)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
