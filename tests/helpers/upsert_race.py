"""One side of an upsert/read race, run as its own process by the store suite.

``python upsert_race.py CONFIG_JSON`` where the config names the ``role``
(``reader`` or ``writer``), the ``method`` under test, the ``key`` (a batch
method uses ``key/0`` and ``key/1``), the value ``size``, the master
(``metadata_url``, ``rpc_addr``) and three files shared with the test:

- ``floor``: 8 bytes, the last version a writer saw acknowledged (0 before
  any); a reader reads it before each read, and that read must not return
  an older version;
- ``ready``: a directory where each reader drops a file once it read a
  value, and the writer waits for ``readers`` of them;
- ``stop``: created by the test when the writers are done.

Values are self-describing: every byte of version ``v`` is ``v % 251``, so
a value holding two versions is caught wherever it is torn. The process
prints one JSON line with what it saw and exits 0.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from mooncake.store import (
    TP,
    MooncakeDistributedStore,
    ReadTarget,
    TensorParallelism,
)

TENSOR_METHODS = {"upsert_tensor", "upsert_tensor_with_parallelism"}


def setup(cfg: dict[str, Any]) -> Any:
    s = MooncakeDistributedStore()
    rc = s.setup(
        "127.0.0.1",
        cfg["metadata_url"],
        int(cfg.get("segment", 64 << 20)),
        int(cfg.get("local_buffer", 64 << 20)),
        "tcp",
        "",
        cfg["rpc_addr"],
    )
    if rc != 0:
        raise SystemExit(f"setup returned {rc}")
    return s


class Floor:
    """The shared ``floor`` file: the newest acknowledged version."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "r+b")  # noqa: SIM115 - lives as long as the process
        self.m = mmap.mmap(self.f.fileno(), 8)

    def get(self) -> int:
        return int(struct.unpack_from("<Q", self.m, 0)[0])

    def raise_to(self, v: int) -> None:
        if v > self.get():
            struct.pack_into("<Q", self.m, 0, v)


def keys_of(cfg: dict[str, Any]) -> list[str]:
    if cfg["method"] == "batch_upsert_from":
        return [f"{cfg['key']}/0", f"{cfg['key']}/1"]
    return [cfg["key"]]


def version_of(arr: np.ndarray) -> int | None:
    """The version byte if every byte agrees, else None (torn)."""
    if arr.size == 0:
        return None
    first = int(arr[0])
    return first if bool(np.all(arr == first)) else None


class Writer:
    def __init__(self, store: Any, cfg: dict[str, Any]) -> None:
        self.s = store
        self.cfg = cfg
        self.size = int(cfg["size"])
        self.buf = np.zeros(self.size, np.uint8)
        if cfg["method"] in TENSOR_METHODS:
            import torch

            self.torch = torch

    def write(self, v: int) -> list[int]:
        m, size, keys = self.cfg["method"], self.size, keys_of(self.cfg)
        b = v % 251
        if m == "upsert":
            return [self.s.upsert(keys[0], bytes([b]) * size)]
        self.buf[:] = b
        p = int(self.buf.ctypes.data)
        if m == "upsert_from":
            return [self.s.upsert_from(keys[0], p, size)]
        if m == "batch_upsert_from":
            return list(self.s.batch_upsert_from(keys, [p, p], [size, size]))
        t = self.torch.full((size,), b, dtype=self.torch.uint8)
        if m == "upsert_tensor":
            return [self.s.upsert_tensor(keys[0], t)]
        if m == "upsert_tensor_with_parallelism":
            par = TensorParallelism([TP(0, 2, 0)])
            return [self.s.upsert_tensor_with_parallelism(keys[0], t, par)]
        raise SystemExit(f"unknown method {m}")


class Reader:
    def __init__(self, store: Any, cfg: dict[str, Any]) -> None:
        self.s = store
        self.cfg = cfg
        self.size = int(cfg["size"])
        self.keys = keys_of(cfg)
        self.bufs = [np.zeros(self.size, np.uint8) for _ in self.keys]

    def read(self) -> list[tuple[int, np.ndarray | None]]:
        """Per key: (code or size, the bytes read or None)."""
        m = self.cfg["method"]
        if m == "upsert":
            got = self.s.get(self.keys[0])
            return [(len(got), np.frombuffer(got, np.uint8)) if got else (-1, None)]
        if m in TENSOR_METHODS:
            if m == "upsert_tensor":
                t = self.s.get_tensor(self.keys[0])
            else:
                target = ReadTarget("as_stored", TensorParallelism([TP(0, 2, 0)]))
                t = self.s.get_tensor_with_parallelism(self.keys[0], target)
            if t is None:
                return [(-1, None)]
            arr = t.numpy().reshape(-1)
            return [(arr.size, arr)]
        ptrs = [int(b.ctypes.data) for b in self.bufs]
        for b in self.bufs:
            b[:] = 255  # never a version byte: a short copy shows
        if m == "upsert_from":
            rcs = [self.s.get_into(self.keys[0], ptrs[0], self.size)]
        else:
            rcs = list(self.s.batch_get_into(self.keys, ptrs, [self.size] * len(self.keys)))
        return [(rc, b if rc == self.size else None) for rc, b in zip(rcs, self.bufs, strict=True)]


def run_writer(store: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    ready = Path(cfg["ready"])
    deadline = time.monotonic() + 60
    while len(list(ready.iterdir())) < int(cfg["readers"]):
        if time.monotonic() > deadline:
            raise SystemExit("readers never became ready")
        time.sleep(0.01)
    floor = Floor(cfg["floor"])
    w = Writer(store, cfg)
    codes: dict[str, int] = {}
    stale_readback = 0
    first, step = int(cfg.get("first", 1)), int(cfg.get("step", 1))
    t0 = time.monotonic()
    n = 0
    for v in range(first, first + step * int(cfg["versions"]), step):
        rcs = w.write(v)
        for rc in rcs:
            codes[str(rc)] = codes.get(str(rc), 0) + 1
        if all(rc == 0 for rc in rcs):
            floor.raise_to(v % 251)
        n += 1
        if int(cfg.get("writers", 1)) == 1:
            # This writer's own next read sees what it just wrote.
            for _rc, arr in Reader(store, cfg).read():
                if arr is None or version_of(arr) != v % 251:
                    stale_readback += 1
    return {
        "codes": codes,
        "upserts": n,
        "seconds": time.monotonic() - t0,
        "stale_readback": stale_readback,
    }


def run_reader(store: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    floor = Floor(cfg["floor"])
    r = Reader(store, cfg)
    stop = Path(cfg["stop"])
    codes: dict[str, int] = {}
    torn = older_than_floor = went_back = reads = 0
    last = [0] * len(r.keys)
    seen: set[int] = set()
    announced = False
    while not stop.exists():
        low = floor.get()
        for i, (rc, arr) in enumerate(r.read()):
            reads += 1
            if arr is None:
                codes[str(rc)] = codes.get(str(rc), 0) + 1
                continue
            v = version_of(arr)
            if v is None:
                torn += 1
                continue
            seen.add(v)
            if v < low:
                older_than_floor += 1
            if v < last[i]:
                went_back += 1
            last[i] = v
        if not announced and seen:
            Path(cfg["ready"], f"{os.getpid()}").touch()
            announced = True
    return {
        "reads": reads,
        "codes": codes,
        "torn": torn,
        "older_than_floor": older_than_floor,
        "went_back": went_back,
        "versions_seen": len(seen),
        "last": last,
    }


def main() -> None:
    cfg = json.loads(sys.argv[1])
    store = setup(cfg)
    try:
        out = run_writer(store, cfg) if cfg["role"] == "writer" else run_reader(store, cfg)
    finally:
        store.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
