"""One client of a robustness run: random operations on a small key set,
each recorded as JSON lines in the history file.

usage: python workload.py CONFIG_JSON

CONFIG_JSON: ``{"client": n, "master": "host:port", "metadata": url,
"keys": k, "seconds": s, "seed": x, "history": path, "segment": bytes}``,
and optionally ``"hostname"``: the address the client is reached at
(default 127.0.0.1; a client in a network namespace gives its host's),
``"prefix"``: put before every key name (so runs on one cluster, one after
another, do not share keys), ``"tensors": true``: also run the tensor
calls on ``k`` keys of their own (a tensor object is not read as bytes),
and ``"dummy": "host:port"``: be a dummy client of the ``mooncake_client``
daemon at that address (``setup_dummy``; ``"master"``, ``"metadata"``,
``"hostname"`` and ``"segment"`` are then unused) instead of a client of
the master itself.

A dummy runs every operation below: the daemon serves them all. Its buffer
is shared memory from ``MooncakeHostMemAllocator`` (the only memory a
dummy can register). A call that answers RPC_FAIL (-900) tells a dummy
that its daemon died, or restarted and does not know it any more. The
dummy goes on with its operations (each answers RPC_FAIL at once) and
after each one tries a throwaway dummy on the same address (a
``setup_dummy`` that fails leaves the store it was called on not set up,
answering INVALID_PARAMS); once that attaches, a daemon serves again, and
the dummy calls ``setup_dummy`` again and registers its buffer again, as a
serving engine would. The call that first answered RPC_FAIL is
indeterminate (its daemon may have done it before it died); the calls
after it, until the dummy attached again, reached no daemon that knows the
dummy, and their RPC_FAIL is a definite failure.

The operations: ``put``, ``upsert``, ``remove``, ``get_into``, ``get``,
``batch_put_from``, ``batch_get_into``, ``batch_remove``, ``is_exist`` and
``batch_is_exist`` on the byte keys (half of the removes forced past read
leases); ``put_tensor``, ``upsert_tensor``, ``get_tensor``,
``remove`` and ``is_exist`` on the tensor keys. A batch is recorded as one
operation per key, each with the batch's interval and its own result.

Every written value is unique and self-describing: ``<client>:<seq>:`` then
bytes that depend on both, so a read names the write it saw (its id
``client * 10**9 + seq``) or, when the bytes do not match that write, is
recorded as a read of value id 0, which no write makes (torn). Codes that
say nothing was done are definite failures; a lost connection or a timeout
is indeterminate. ``get_into``'s code tells "not found" (an observation)
from a read that failed (none). ``get`` answers empty bytes for both, and
``get_tensor`` None for both, so such an answer is recorded as a failed
read (it observes nothing; no written value is empty).

Before each call the client writes a ``"pending"`` line per key (one write,
so a SIGKILL leaves it whole); the checker's merge (helpers/lincheck.py)
turns a pending line that no completion follows into a crashed operation.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from mooncake.store import MooncakeDistributedStore, MooncakeHostMemAllocator

# Codes after which the operation certainly did not take effect.
# REPLICA_IS_NOT_READY (-703) refuses a removal of a key whose first write
# is in flight, OBJECT_REPLICA_BUSY (-714) an upsert of such a key or of one
# whose replaced versions are all still being read: neither did anything.
DEFINITE = {-200, -600, -703, -704, -705, -706, -714, -1012}
NOT_FOUND = -704
# Recorded as the code of a read whose call reports none (`get` answering
# empty bytes, `get_tensor` None).
NO_CODE = -1
RPC_FAIL = -900
TORN = 0
# The registered buffer: BATCH read slots, then BATCH write slots, each
# larger than any value.
SLOT = 1024
BATCH = 3
BUFFER = 2 * BATCH * SLOT
# A dummy's memory pool and local buffer (a bytes value or a tensor is
# copied through the local buffer).
DUMMY_POOL = 16 << 20
DUMMY_LOCAL = 16 << 20
# Seconds a client waits after an operation that failed for want of the
# master or, for a dummy, of its daemon (not for a documented "not done"
# answer) before its next one.
BACKOFF = 0.02
# Operation kinds and their weights, per kind of key.
BYTE_OPS = {
    "put": 2,
    "upsert": 3,
    "remove": 1,
    "get_into": 4,
    "get": 2,
    "batch_put_from": 1,
    "batch_remove": 1,
    "batch_get_into": 2,
    "is_exist": 1,
    "batch_is_exist": 1,
}
TENSOR_OPS = {"put_tensor": 2, "upsert_tensor": 3, "remove": 1, "get_tensor": 4, "is_exist": 1}
# The share of operations on the tensor keys, when there are any.
TENSOR_SHARE = 0.3


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


def write_outcome(rc: int) -> Any:
    return {"ok": None} if rc == 0 else ("failed" if rc in DEFINITE else "unknown")


def read_outcome(n: int, raw: Callable[[], bytes]) -> Any:
    """A byte read's outcome: what it saw, "not found", or nothing (failed)."""
    if n > 0:
        return {"ok": decode(raw())}
    return {"ok": None} if n == NOT_FOUND else "failed"


def remove_outcome(rc: int) -> Any:
    if rc == 0:
        return {"ok": 1}
    return {"ok": None} if rc == NOT_FOUND else write_outcome(rc)


def exist_outcome(rc: int) -> Any:
    if rc in (0, 1):
        return {"ok": 1 if rc == 1 else None}
    return "failed" if rc in DEFINITE else "unknown"


class Client:
    """The store client of one workload process and its history file."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.id = int(cfg["client"])
        self.rng = random.Random(cfg["seed"])
        self.store = MooncakeDistributedStore()
        self.dummy: str | None = cfg.get("dummy")
        # A dummy whose daemon answered RPC_FAIL, until it attached again.
        self.lost = False
        if self.dummy:
            self.alloc = MooncakeHostMemAllocator()
            self.ptr = self.alloc.alloc(BUFFER)
            if not self.ptr:
                raise SystemExit("MooncakeHostMemAllocator.alloc failed")
            if not self.attach():
                raise SystemExit(f"setup_dummy or register_buffer failed ({self.dummy})")
        else:
            rc = self.store.setup(
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
            self.buf = ctypes.create_string_buffer(BUFFER)
            self.ptr = ctypes.addressof(self.buf)
            if self.store.register_buffer(self.ptr, BUFFER) != 0:
                raise SystemExit("register_buffer failed")
        prefix = cfg.get("prefix", "")
        n = int(cfg["keys"])
        self.byte_keys = [f"{prefix}rk{i}" for i in range(n)]
        self.tensor_keys = [f"{prefix}tk{i}" for i in range(n)] if cfg.get("tensors") else []
        self.seq = 0
        self.fd = os.open(cfg["history"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def attach(self) -> bool:
        """Attaches a dummy to its daemon (again) and registers its buffer
        there; whether both succeeded."""
        assert self.dummy is not None
        return (
            self.store.setup_dummy(DUMMY_POOL, DUMMY_LOCAL, self.dummy) == 0
            and self.store.register_buffer(self.ptr, BUFFER) == 0
        )

    def daemon_serves(self) -> bool:
        """Whether a daemon serves the dummy's address: a throwaway dummy
        attaches there."""
        assert self.dummy is not None
        probe = MooncakeDistributedStore()
        ok = probe.setup_dummy(0, 0, self.dummy) == 0
        probe.close()
        return ok

    def close(self) -> None:
        os.close(self.fd)
        self.store.unregister_buffer(self.ptr)
        self.store.close()
        if self.dummy:
            self.alloc.free(self.ptr)

    def next_vid(self) -> tuple[int, int]:
        self.seq += 1
        return self.seq, self.id * 10**9 + self.seq

    def read_slot(self, i: int) -> int:
        return self.ptr + i * SLOT

    def write_slot(self, i: int, data: bytes) -> int:
        at = self.ptr + (BATCH + i) * SLOT
        ctypes.memmove(at, data, len(data))
        return at

    def run_one(self) -> list[int]:
        """Runs one random operation and records it; returns its codes."""
        tensors = self.tensor_keys and self.rng.random() < TENSOR_SHARE
        ops = TENSOR_OPS if tensors else BYTE_OPS
        kind = self.rng.choices(list(ops), list(ops.values()))[0]
        keys = self.tensor_keys if tensors else self.byte_keys
        batch = kind.startswith("batch_")
        chosen = (
            self.rng.sample(keys, self.rng.randint(2, min(BATCH, len(keys))))
            if batch
            else [self.rng.choice(keys)]
        )
        calls: list[Any] = []
        seqs: list[int] = []
        values: list[bytes] = []
        for _ in chosen:
            seq, vid = self.next_vid()
            seqs.append(seq)
            if kind in ("put", "upsert", "batch_put_from", "put_tensor", "upsert_tensor"):
                model = "upsert" if kind.startswith("upsert") else "put"
                calls.append({model: vid})
                values.append(value(self.id, seq))
            elif kind in ("remove", "batch_remove"):
                calls.append("remove")
            elif kind in ("is_exist", "batch_is_exist"):
                calls.append("exists")
            else:
                calls.append("get")
        records = [
            {"client": self.id, "seq": seq, "key": key, "call": call}
            for seq, key, call in zip(seqs, chosen, calls, strict=True)
        ]
        invoke = time.monotonic_ns()
        for r in records:
            r["invoke"] = invoke
        os.write(
            self.fd, "".join(json.dumps({"pending": True, **r}) + "\n" for r in records).encode()
        )
        codes, outcomes = self.call(kind, chosen, values)
        complete = time.monotonic_ns()
        if self.lost:
            outcomes = [
                "failed" if rc == RPC_FAIL else o for rc, o in zip(codes, outcomes, strict=True)
            ]
        lines = []
        for r, code, outcome in zip(records, codes, outcomes, strict=True):
            r.update(complete=complete, outcome=outcome)
            if outcome in ("failed", "unknown"):
                r["code"] = code  # for the reader of a history
            lines.append(json.dumps(r) + "\n")
        os.write(self.fd, "".join(lines).encode())
        return codes

    def call(self, kind: str, keys: list[str], values: list[bytes]) -> tuple[list[int], list[Any]]:
        """Makes the call; per key its code and outcome."""
        s = self.store
        if kind in ("put", "upsert"):
            rc = (s.put if kind == "put" else s.upsert)(keys[0], values[0])
            return [rc], [write_outcome(rc)]
        if kind == "batch_put_from":
            ptrs = [self.write_slot(i, v) for i, v in enumerate(values)]
            rcs = list(s.batch_put_from(keys, ptrs, [len(v) for v in values]))
            return rcs, [write_outcome(rc) for rc in rcs]
        if kind in ("remove", "batch_remove"):
            # Half of them forced: a read's lease does not hold them back.
            force = self.rng.random() < 0.5
            rcs = (
                [s.remove(keys[0], force)]
                if kind == "remove"
                else list(s.batch_remove(keys, force))
            )
            return rcs, [remove_outcome(rc) for rc in rcs]
        if kind == "get":
            raw = bytes(s.get(keys[0]))
            return [len(raw) or NO_CODE], [{"ok": decode(raw)} if raw else "failed"]
        if kind == "get_into":
            n = s.get_into(keys[0], self.ptr, SLOT)
            return [n], [read_outcome(n, lambda: ctypes.string_at(self.ptr, n))]
        if kind == "batch_get_into":
            ptrs = [self.read_slot(i) for i in range(len(keys))]
            ns = list(s.batch_get_into(keys, ptrs, [SLOT] * len(keys)))
            outcomes = [
                read_outcome(n, lambda p=p, n=n: ctypes.string_at(p, n))
                for p, n in zip(ptrs, ns, strict=True)
            ]
            return ns, outcomes
        if kind == "is_exist":
            rc = s.is_exist(keys[0])
            return [rc], [exist_outcome(rc)]
        if kind == "batch_is_exist":
            rcs = list(s.batch_is_exist(keys))
            return rcs, [exist_outcome(rc) for rc in rcs]
        return self.tensor_call(kind, keys[0], values)

    def tensor_call(self, kind: str, key: str, values: list[bytes]) -> tuple[list[int], list[Any]]:
        import torch

        if kind == "get_tensor":
            t = self.store.get_tensor(key)
            if t is None:
                return [NO_CODE], ["failed"]
            return [0], [{"ok": decode(t.numpy().tobytes())}]
        fn = self.store.put_tensor if kind == "put_tensor" else self.store.upsert_tensor
        rc = fn(key, torch.frombuffer(bytearray(values[0]), dtype=torch.uint8))
        return [rc], [write_outcome(rc)]


def main() -> None:
    cfg: dict[str, Any] = json.loads(sys.argv[1])
    client = Client(cfg)
    if client.tensor_keys:
        import torch  # noqa: F401  (imported before the clock starts)
    deadline = time.monotonic() + float(cfg["seconds"])
    print(json.dumps({"ready": True}), flush=True)
    while time.monotonic() < deadline:
        codes = client.run_one()
        if client.dummy and RPC_FAIL in codes:
            client.lost = True
        if client.lost and client.daemon_serves():
            client.lost = not client.attach()
        if client.lost or any(rc < 0 and rc not in DEFINITE for rc in codes):
            # An unreachable master (a failover) or daemon is retried after a pause,
            # as a serving engine's next request would, not in a tight loop.
            time.sleep(BACKOFF)
    client.close()


if __name__ == "__main__":
    main()
