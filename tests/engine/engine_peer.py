"""A transfer-engine peer process for the engine suite, driven over stdin/stdout.

Each request is one JSON line; each reply is one JSON line. The process owns a
``mooncake.engine.TransferEngine`` and numpy buffers (or managed buffers) that
it registers, so tests can make a real second process the target (or the
initiator) of transfers and inspect its memory afterwards.

Requests (``op`` and its fields) and replies:
  init        host, meta, protocol           -> rc, name, port
  array       size, [register]               -> addr (a numpy buffer, zeroed)
  managed     size                           -> addr (allocate_managed_buffer)
  fill        addr, hex                      -> ok (writes bytes at addr)
  read        addr, len                      -> hex (bytes at addr)
  call        method, args                   -> result (any engine method)
  notifies                                   -> list of [name, msg]
  exit                                       -> (process exits)
Buffers made by ``array`` stay alive until exit. Log records of the
``mooncake.engine`` logger are collected; ``logs`` returns and clears them.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import sys
from typing import Any

import numpy as np
from mooncake.engine import TransferEngine, TransferOpcode

records: list[str] = []


class _Collect(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        records.append(record.getMessage())


logging.getLogger("mooncake.engine").addHandler(_Collect())
logging.getLogger("mooncake.engine").setLevel(logging.INFO)


def drop_privileges() -> None:
    """Make cross-process copies with this process fail as a ptrace policy
    would: ENGINE_PEER_NODUMP=1 makes it non-dumpable (a peer of the same
    user without CAP_SYS_PTRACE may not touch it), ENGINE_PEER_NOBODY=1 drops
    root to the nobody user (which may not touch root's processes)."""
    if os.environ.get("ENGINE_PEER_NODUMP") == "1":
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE, 0
    if os.environ.get("ENGINE_PEER_NOBODY") == "1" and os.geteuid() == 0:
        os.setgid(65534)
        os.setuid(65534)


def main() -> int:
    drop_privileges()
    engine = TransferEngine()
    arrays: list[np.ndarray] = []
    out = sys.stdout
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        reply: dict[str, Any] = {}
        if op == "init":
            rc = engine.initialize(req["host"], req["meta"], req["protocol"], "")
            reply = {"rc": rc}
            if rc == 0:
                port = engine.get_rpc_port()
                reply["port"] = port
                reply["name"] = req.get("name") or f"{req['host']}:{port}"
        elif op == "array":
            a = np.zeros(req["size"], dtype=np.uint8)
            arrays.append(a)
            addr = int(a.ctypes.data)
            if req.get("register", True):
                reply["rc"] = engine.register_memory(addr, a.nbytes)
            reply["addr"] = addr
        elif op == "managed":
            reply["addr"] = engine.allocate_managed_buffer(req["size"])
        elif op == "fill":
            data = bytes.fromhex(req["hex"])
            ctypes.memmove(req["addr"], data, len(data))
            reply["ok"] = True
        elif op == "read":
            reply["hex"] = ctypes.string_at(req["addr"], req["len"]).hex()
        elif op == "call":
            args = [
                TransferOpcode.Read
                if a == "@Read"
                else TransferOpcode.Write
                if a == "@Write"
                else a
                for a in req["args"]
            ]
            reply["result"] = getattr(engine, req["method"])(*args)
        elif op == "notifies":
            reply["notifies"] = [[n.name, n.msg] for n in engine.get_notifies()]
        elif op == "logs":
            reply["logs"] = list(records)
            records.clear()
        elif op == "exit":
            return 0
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
