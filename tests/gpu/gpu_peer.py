"""A transfer-engine peer with CUDA buffers, driven over stdin/stdout (one
JSON request per line, one JSON reply per line).

  init      protocol                 -> rc, name
  cuda      size, [register]         -> addr (a zeroed CUDA byte tensor)
  host      size                     -> addr (a zeroed registered host buffer)
  fill      addr, seed, len          -> ok (a byte pattern, on the device)
  digest    addr, len                -> hex (sha256 of the bytes)
  exit
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import numpy as np
import torch
from mooncake.engine import TransferEngine


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 131 + seed) & 0xFF for i in range(min(n, 1 << 16))) * (n // (1 << 16) + 1)


def main() -> int:
    engine = TransferEngine()
    tensors: dict[int, Any] = {}
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        try:
            if op == "init":
                rc = engine.initialize("127.0.0.1", "P2PHANDSHAKE", req.get("protocol", "tcp"), "")
                reply: dict[str, Any] = {"rc": rc, "name": f"127.0.0.1:{engine.get_rpc_port()}"}
            elif op == "cuda":
                t = torch.zeros(req["size"], dtype=torch.uint8, device="cuda")
                torch.cuda.synchronize()
                tensors[t.data_ptr()] = t
                rc = (
                    engine.register_memory(t.data_ptr(), req["size"])
                    if req.get("register", 1)
                    else 0
                )
                reply = {"addr": t.data_ptr(), "rc": rc}
            elif op == "host":
                a = np.zeros(req["size"], np.uint8)
                tensors[a.ctypes.data] = a
                reply = {
                    "addr": a.ctypes.data,
                    "rc": engine.register_memory(a.ctypes.data, a.nbytes),
                }
            elif op == "fill":
                data = pattern(req["len"], req["seed"])[: req["len"]]
                src = torch.frombuffer(bytearray(data), dtype=torch.uint8)
                dst = _view(tensors, req["addr"], req["len"])
                dst.copy_(src)
                torch.cuda.synchronize()
                reply = {"ok": True}
            elif op == "digest":
                v = _view(tensors, req["addr"], req["len"])
                torch.cuda.synchronize()
                raw = v.cpu().numpy().tobytes() if hasattr(v, "cpu") else bytes(v)
                reply = {"hex": hashlib.sha256(raw).hexdigest()}
            elif op == "exit":
                return 0
            else:
                reply = {"error": f"unknown op {op}"}
        except Exception as e:  # noqa: BLE001 - reported to the test
            reply = {"error": repr(e)}
        print(json.dumps(reply), flush=True)
    return 0


def _view(tensors: dict[int, Any], addr: int, n: int) -> Any:
    for base, t in tensors.items():
        size = t.numel() if hasattr(t, "numel") else t.nbytes
        if base <= addr and addr + n <= base + size:
            off = addr - base
            if isinstance(t, np.ndarray):
                return torch.from_numpy(t[off : off + n])
            return t[off : off + n]
    raise ValueError(f"{addr:#x}+{n} is in no buffer of this peer")


if __name__ == "__main__":
    sys.exit(main())
