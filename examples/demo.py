"""Demo workload: a master plus two client processes.

Starts ``mooncake_master`` (embedded HTTP metadata server on), then
  * a writer process that owns a 256 MiB segment and stores objects, and
  * a reader process (no segment of its own) that reads them back, first
    through the same-host mapped path, then with TCP forced,
and prints what moved over which path and how fast.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from _launch import start_master, wait_port

N_OBJECTS = 32
OBJ_SIZE = 4 << 20


def role(name: str, master: str, meta: str) -> None:
    import numpy as np
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    seg = 256 << 20 if name == "writer" else 0
    rc = store.setup("127.0.0.1", meta, seg, 16 << 20, "tcp", "", master)
    if rc != 0:
        raise SystemExit(f"{name}: setup failed: {rc}")
    if name == "writer":
        data = np.random.default_rng(0).integers(0, 255, OBJ_SIZE, dtype=np.uint8)
        for i in range(N_OBJECTS):
            data[:8] = i
            assert store.put_from(f"demo/{i}", data.ctypes.data, data.nbytes) == 0
        print(
            f"writer {store.get_hostname()}: stored {N_OBJECTS} x {OBJ_SIZE >> 20} MiB", flush=True
        )
        print("READY", flush=True)
        sys.stdin.readline()  # stay alive (the segment lives in this process) until told
        store.close()
        return
    buf = np.empty(OBJ_SIZE, dtype=np.uint8)
    t0 = time.perf_counter()
    for _ in range(3):
        for i in range(N_OBJECTS):
            n = store.get_into(f"demo/{i}", buf.ctypes.data, buf.nbytes)
            assert n == OBJ_SIZE and buf[0] == i, (n, buf[0], i)
    dt = time.perf_counter() - t0
    gbs = 3 * N_OBJECTS * OBJ_SIZE / dt / 1e9
    stats = store.get_client_stats()
    path = "tcp" if os.environ.get("MC_FORCE_TCP") == "1" else "same-host"
    print(
        f"reader ({path}): {3 * N_OBJECTS} get_into of {OBJ_SIZE >> 20} MiB in {dt:.3f}s = {gbs:.2f} GB/s; "
        f"same_host={stats['bytes_read_same_host'] >> 20} MiB tcp={stats['bytes_read_tcp'] >> 20} MiB",
        flush=True,
    )
    store.close()


def main() -> None:
    if len(sys.argv) == 4:
        role(sys.argv[1], sys.argv[2], sys.argv[3])
        return
    master, rpc, http, admin = start_master(quiet=False)
    try:
        wait_port(rpc)
        maddr, meta = f"127.0.0.1:{rpc}", f"http://127.0.0.1:{http}/metadata"
        print(
            f"master up: rpc {maddr}, metadata {meta}, admin http://127.0.0.1:{admin}", flush=True
        )
        writer = subprocess.Popen(
            [sys.executable, __file__, "writer", maddr, meta],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout is not None and writer.stdin is not None
        for line in writer.stdout:
            print(line, end="")
            if line.strip() == "READY":
                break
        for env in ({}, {"MC_FORCE_TCP": "1"}):
            subprocess.run(
                [sys.executable, __file__, "reader", maddr, meta],
                env={**os.environ, **env},
                check=True,
                timeout=120,
            )
        writer.stdin.write("\n")
        writer.stdin.flush()
        writer.wait(timeout=30)
        print("demo OK", flush=True)
    finally:
        master.terminate()
        master.wait(timeout=10)


if __name__ == "__main__":
    main()
