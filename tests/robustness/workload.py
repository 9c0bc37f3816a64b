"""One client of a robustness run: random operations on a small key set,
each recorded as one JSON line (the checker's ``Op``) in the history file.

usage: python workload.py CONFIG_JSON

CONFIG_JSON: ``{"client": n, "master": "host:port", "metadata": url,
"keys": k, "seconds": s, "seed": x, "history": path, "segment": bytes}``,
and optionally ``"hostname"``: the address the client is reached at
(default 127.0.0.1; a client in a network namespace gives its host's), and
``"prefix"``: put before every key name (so runs on one cluster, one after
another, do not share keys).

Every written value is unique and self-describing: ``<client>:<seq>:`` then
bytes that depend on both, so a read names the write it saw (its id
``client * 10**9 + seq``) or, when the bytes do not match that write, is
recorded as a read of value id 0, which no write makes (torn). Codes that
say nothing was done are definite failures; a lost connection or a timeout
is indeterminate. Reads go through ``get_into``, whose code tells "not
found" (an observation) from a read that failed (none: ``get`` answers
empty bytes for both).
"""

from __future__ import annotations

import ctypes
import json
import random
import sys
import time
from typing import Any

from mooncake.store import MooncakeDistributedStore

# Codes after which the operation certainly did not take effect.
DEFINITE = {-200, -600, -704, -705, -706, -1012}
NOT_FOUND = -704
TORN = 0
READ_BUFFER = 4096
# Seconds a client waits after an operation that failed for want of the
# master (not for a documented "not done" answer) before its next one.
BACKOFF = 0.02


def value(client: int, seq: int) -> bytes:
    head = f"{client}:{seq}:".encode()
    body = bytes((client * 131 + seq * 7 + i) % 251 for i in range(64 + seq % 512))
    return head + body


def decode(raw: bytes) -> int:
    """The id of the write that made ``raw``, or TORN."""
    try:
        client_s, seq_s, _ = raw.split(b":", 2)
        client, seq = int(client_s), int(seq_s)
    except ValueError:
        return TORN
    return client * 10**9 + seq if raw == value(client, seq) else TORN


def main() -> None:
    cfg: dict[str, Any] = json.loads(sys.argv[1])
    client = int(cfg["client"])
    rng = random.Random(cfg["seed"])
    store = MooncakeDistributedStore()
    rc = store.setup(
        str(cfg.get("hostname", "127.0.0.1")),
        cfg["metadata"],
        int(cfg.get("segment", 0)),
        16 << 20,
        "tcp",
        "",
        cfg["master"],
    )
    if rc != 0:
        raise SystemExit(f"setup failed: {rc}")
    buf = ctypes.create_string_buffer(READ_BUFFER)
    ptr = ctypes.addressof(buf)
    if store.register_buffer(ptr, READ_BUFFER) != 0:
        raise SystemExit("register_buffer failed")
    keys = [f"{cfg.get('prefix', '')}rk{i}" for i in range(int(cfg["keys"]))]
    deadline = time.monotonic() + float(cfg["seconds"])
    seq = 0
    with open(cfg["history"], "w") as out:
        print(json.dumps({"ready": True}), flush=True)
        while time.monotonic() < deadline:
            key = rng.choice(keys)
            kind = rng.choices(["put", "upsert", "remove", "get"], [2, 3, 1, 6])[0]
            seq += 1
            vid = client * 10**9 + seq
            invoke = time.monotonic_ns()
            outcome: Any
            if kind == "get":
                n = code = store.get_into(key, ptr, READ_BUFFER)
                call: Any = "get"
                if n > 0:
                    outcome = {"ok": decode(ctypes.string_at(ptr, n))}
                elif n == NOT_FOUND:
                    outcome = {"ok": None}
                else:
                    outcome = "failed"  # a failed read observed nothing
            elif kind == "remove":
                rc = code = store.remove(key)
                call = "remove"
                if rc == 0:
                    outcome = {"ok": 1}
                elif rc == -704:
                    outcome = {"ok": None}
                else:
                    outcome = "failed" if rc in DEFINITE else "unknown"
            else:
                fn = store.put if kind == "put" else store.upsert
                rc = code = fn(key, value(client, seq))
                call = {kind: vid}
                outcome = {"ok": None} if rc == 0 else ("failed" if rc in DEFINITE else "unknown")
            complete = time.monotonic_ns()
            op: dict[str, Any] = {
                "client": client,
                "key": key,
                "call": call,
                "invoke": invoke,
                "complete": complete,
                "outcome": outcome,
            }
            if outcome in ("failed", "unknown"):
                op["code"] = code  # for the reader of a history
            out.write(json.dumps(op) + "\n")
            if outcome in ("failed", "unknown") and code not in DEFINITE:
                # An unreachable master (a failover) is retried after a pause,
                # as a serving engine's next request would, not in a tight loop.
                time.sleep(BACKOFF)
    store.unregister_buffer(ptr)
    store.close()


if __name__ == "__main__":
    main()
