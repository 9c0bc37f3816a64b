"""A store client for the multi-host tests, run inside a host's network
namespace and driven over stdin/stdout by JSON lines (like
tests/helpers/store_client.py, which it complements with timed calls and a
background workload).

Each stdin line is ``{"op": NAME, ...}``; each reply is one line
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}``. The
process prints ``{"ready": true}`` first and exits on ``{"op": "exit"}`` or EOF.

Values are ``pattern(size, seed)`` (tests/helpers/common.py), so a reader can
check every byte without the bytes crossing the pipe. A read that returns
data of the right length but the wrong content is reported as ``WRONG``
(-99999): the tests assert that it never happens.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))

import numpy as np
from common import pattern_array
from json_child import serve
from mooncake.store import MooncakeDistributedStore
from replicate import replicate_config as _cfg

WRONG = -99999


# Puts a workload starts per second at most: the same load on a fast machine
# as on a slow one, so a run of several seconds never fills the segments
# (an eviction would take acknowledged keys the tests check for).
PUTS_PER_SECOND = 500


class Workload:
    """Puts (paced, at most ``rate`` a second) and reads in a loop on one
    thread, recording every call."""

    def __init__(
        self, store: Any, prefix: str, size: int, replica_num: int, rate: float = PUTS_PER_SECOND
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.size = size
        self.replica_num = replica_num
        self.rate = rate
        self.stop = threading.Event()
        self.acked: dict[str, int] = {}  # key -> seed of puts that returned 0
        self.calls: list[tuple[float, float, str, int]] = []  # (unix start, seconds, op, rc)
        self.wrong = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        src = np.empty(self.size, np.uint8)
        dst = np.empty(self.size, np.uint8)
        i = 0
        start = time.perf_counter()
        while not self.stop.is_set():
            ahead = start + i / self.rate - time.perf_counter()
            if ahead > 0 and self.stop.wait(ahead):
                break
            key = f"{self.prefix}/{i}"
            seed = i + 1
            src[:] = pattern_array(self.size, seed)
            t0 = time.time()
            p0 = time.perf_counter()
            rc = self.store.put_from(key, int(src.ctypes.data), self.size, _cfg(self.replica_num))
            self.calls.append((t0, time.perf_counter() - p0, "put", rc))
            if rc == 0:
                self.acked[key] = seed
            else:
                time.sleep(0.02)  # do not spin while the master is away
            # Read back a random earlier acknowledged key.
            if self.acked:
                j = int(np.random.randint(0, i + 1))
                rkey = f"{self.prefix}/{j}"
                if rkey in self.acked:
                    t0 = time.time()
                    p0 = time.perf_counter()
                    rc = self.store.get_into(rkey, int(dst.ctypes.data), self.size)
                    dur = time.perf_counter() - p0
                    if rc == self.size and not np.array_equal(
                        dst, pattern_array(self.size, self.acked[rkey])
                    ):
                        rc = WRONG
                        self.wrong += 1
                    self.calls.append((t0, dur, "get", rc))
            i += 1

    def summary(self) -> dict[str, Any]:
        calls = list(self.calls)
        by_rc: dict[str, int] = {}
        for _, _, op, rc in calls:
            k = f"{op}:{rc if rc <= 0 else 'ok'}"
            by_rc[k] = by_rc.get(k, 0) + 1
        return {
            "acked": self.acked,
            "calls": len(calls),
            "by_rc": by_rc,
            "max_call_s": max((c[1] for c in calls), default=0.0),
            "wrong": self.wrong,
            "calls_list": calls,
        }


class Client:
    def __init__(self) -> None:
        self.store: Any = MooncakeDistributedStore()
        self.bufs: dict[int, np.ndarray] = {}
        self.workload: Workload | None = None

    def _buf(self, size: int) -> np.ndarray:
        arr = self.bufs.get(size)
        if arr is None:
            arr = np.zeros(size, np.uint8)
            self.bufs[size] = arr
        return arr

    def op_setup(self, m: dict[str, Any]) -> Any:
        extra: dict[str, Any] = {}
        if "ssd_offload_path" in m:
            # A disk tier (SSD offload) in that directory.
            extra = {"enable_ssd_offload": True, "ssd_offload_path": str(m["ssd_offload_path"])}
        t0 = time.perf_counter()
        rc = self.store.setup(
            m["local_hostname"],
            m.get("metadata_server", "P2PHANDSHAKE"),
            int(m.get("global_segment_size", 64 << 20)),
            int(m.get("local_buffer_size", 16 << 20)),
            "tcp",
            "",
            m["master_server_addr"],
            **extra,
        )
        return {"rc": rc, "s": time.perf_counter() - t0}

    def op_hostname(self, m: dict[str, Any]) -> Any:
        return self.store.get_hostname()

    def _write_pattern(self, m: dict[str, Any], write: Any) -> dict[str, Any]:
        """``write(key, ptr, size, config)`` of ``pattern(size, seed)``: its
        return code and how long it took."""
        size, seed = int(m["size"]), int(m.get("seed", 0))
        arr = self._buf(size)
        arr[:] = pattern_array(size, seed)
        t0 = time.perf_counter()
        cfg = _cfg(int(m.get("replica_num", 1)), m.get("preferred", ""))
        rc = write(m["key"], int(arr.ctypes.data), size, cfg)
        return {"rc": rc, "s": time.perf_counter() - t0}

    def op_put(self, m: dict[str, Any]) -> Any:
        return {**self._write_pattern(m, self.store.put_from), "t": time.time()}

    def op_upsert(self, m: dict[str, Any]) -> Any:
        return self._write_pattern(m, self.store.upsert_from)

    def op_get(self, m: dict[str, Any]) -> Any:
        """``get_into`` + content check against ``pattern(size, seed)``."""
        size, seed = int(m["size"]), int(m.get("seed", 0))
        arr = self._buf(size)
        t0 = time.perf_counter()
        rc = self.store.get_into(m["key"], int(arr.ctypes.data), size)
        dur = time.perf_counter() - t0
        if rc == size and not np.array_equal(arr, pattern_array(size, seed)):
            rc = WRONG
        return {"rc": rc, "s": dur}

    def op_check_many(self, m: dict[str, Any]) -> Any:
        """Read every ``{key: seed}`` of ``size``; returns ``{key: rc}`` for those not OK."""
        size = int(m["size"])
        arr = self._buf(size)
        bad = {}
        for key, seed in m["keys"].items():
            rc = self.store.get_into(key, int(arr.ctypes.data), size)
            if rc == size and not np.array_equal(arr, pattern_array(size, int(seed))):
                rc = WRONG
            if rc != size:
                bad[key] = rc
        return bad

    def op_exist(self, m: dict[str, Any]) -> Any:
        return self.store.is_exist(m["key"])

    def op_remove(self, m: dict[str, Any]) -> Any:
        return self.store.remove(m["key"], bool(m.get("force", True)))

    def op_stats(self, m: dict[str, Any]) -> Any:
        return self.store.get_client_stats()

    def op_health(self, m: dict[str, Any]) -> Any:
        return self.store.health_check()

    def op_bench_get(self, m: dict[str, Any]) -> Any:
        """``n`` timed ``get_into`` of ``key``; returns the per-call seconds."""
        size, n = int(m["size"]), int(m["n"])
        arr = self._buf(size)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            rc = self.store.get_into(m["key"], int(arr.ctypes.data), size)
            times.append(time.perf_counter() - t0)
            if rc != size:
                return {"rc": rc, "times": times}
        return {"rc": size, "times": times}

    def op_workload_start(self, m: dict[str, Any]) -> Any:
        self.workload = Workload(
            self.store, m["prefix"], int(m["size"]), int(m.get("replica_num", 1))
        )
        self.workload.thread.start()
        return True

    def op_workload_stop(self, m: dict[str, Any]) -> Any:
        w = self.workload
        if w is None:
            return None
        w.stop.set()
        w.thread.join(timeout=float(m.get("join_timeout", 60)))
        out = w.summary()
        out["alive"] = w.thread.is_alive()
        if not m.get("with_calls"):
            out.pop("calls_list")
        return out

    def op_close(self, m: dict[str, Any]) -> Any:
        return self.store.close()


def main() -> None:
    c = Client()
    serve(c)
    c.store.close()


if __name__ == "__main__":
    main()
