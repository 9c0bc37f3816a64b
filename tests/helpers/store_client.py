"""A store client driven over stdin/stdout by JSON lines (used by the test suite).

Protocol: the process prints ``{"ready": true}`` once imported. Then each stdin
line is a JSON object ``{"op": NAME, ...}``; each reply is one line
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}``.
``{"op": "exit"}`` closes the store and exits 0. EOF on stdin does the same.

Values are generated deterministically from ``(size, seed)`` so that writer and
reader processes never ship bulk bytes through the pipe.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
from common import pattern, pattern_array
from json_child import serve
from mooncake.store import MooncakeDistributedStore, ReplicateConfig


class Client:
    def __init__(self) -> None:
        self.store: Any = MooncakeDistributedStore()
        self.bufs: dict[int, np.ndarray] = {}

    def _buffer(self, size: int) -> np.ndarray:
        arr = self.bufs.get(size)
        if arr is None:
            arr = np.zeros(size, dtype=np.uint8)
            self.bufs[size] = arr
        return arr

    @staticmethod
    def _config(msg: dict[str, Any]) -> Any:
        cfg = ReplicateConfig()
        if "replica_num" in msg:
            cfg.replica_num = int(msg["replica_num"])
        if msg.get("preferred_segment"):
            cfg.preferred_segment = msg["preferred_segment"]
        return cfg

    # ---- ops
    def op_setup(self, msg: dict[str, Any]) -> Any:
        a = msg["args"]
        extra: dict[str, Any] = {}
        if "enable_ssd_offload" in a:
            extra["enable_ssd_offload"] = bool(a["enable_ssd_offload"])
            extra["ssd_offload_path"] = str(a.get("ssd_offload_path", ""))
        return self.store.setup(
            a["local_hostname"],
            a["metadata_server"],
            int(a["global_segment_size"]),
            int(a["local_buffer_size"]),
            a["protocol"],
            a["rdma_devices"],
            a["master_server_addr"],
            **extra,
        )

    def op_offload_reads(self, msg: dict[str, Any]) -> Any:
        return self.store.get_offload_rpc_read_count()

    def op_put_pattern_retry(self, msg: dict[str, Any]) -> Any:
        """put_pattern, retrying NO_AVAILABLE_HANDLE (-200) while eviction frees space."""
        import time

        size, seed = int(msg["size"]), int(msg.get("seed", 0))
        data = pattern(size, seed)
        deadline = time.monotonic() + float(msg.get("timeout", 10.0))
        while True:
            rc = self.store.put(msg["key"], data)
            if rc != -200 or time.monotonic() >= deadline:
                return rc
            time.sleep(0.005)

    def op_ping(self, msg: dict[str, Any]) -> Any:
        return "pong"

    def op_hostname(self, msg: dict[str, Any]) -> Any:
        return self.store.get_hostname()

    def op_health(self, msg: dict[str, Any]) -> Any:
        return self.store.health_check()

    def op_put_pattern(self, msg: dict[str, Any]) -> Any:
        size, seed = int(msg["size"]), int(msg.get("seed", 0))
        if size > 8 << 20 or msg.get("from_buffer"):
            arr = self._buffer(size)
            arr[:] = pattern_array(size, seed)
            return self.store.put_from(msg["key"], int(arr.ctypes.data), size, self._config(msg))
        return self.store.put(msg["key"], pattern(size, seed), self._config(msg))

    def op_put(self, msg: dict[str, Any]) -> Any:
        return self.store.put(msg["key"], bytes.fromhex(msg["hex"]), self._config(msg))

    def op_get(self, msg: dict[str, Any]) -> Any:
        return self.store.get(msg["key"]).hex()

    def op_check_pattern(self, msg: dict[str, Any]) -> Any:
        """get_into a zeroed buffer; report the return code and whether bytes match."""
        size = int(msg["size"])
        arr = self._buffer(size)
        arr[:] = 0
        n = self.store.get_into(msg["key"], int(arr.ctypes.data), size)
        ok = bool(n == size and np.array_equal(arr, pattern_array(size, int(msg.get("seed", 0)))))
        return {"n": n, "match": ok}

    @staticmethod
    def _scattered(sizes: list[int]) -> tuple[np.ndarray, list[int]]:
        """One buffer holding pieces of ``sizes`` with 64-byte gaps; their addresses."""
        arr = np.zeros(sum(sizes) + 64 * (len(sizes) + 1), np.uint8)
        ptrs, at = [], 64
        for n in sizes:
            ptrs.append(int(arr.ctypes.data) + at)
            at += n + 64
        return arr, ptrs

    def op_multi_put_pattern(self, msg: dict[str, Any]) -> Any:
        """batch_put_from_multi_buffers of one key: the pattern cut into ``sizes``."""
        sizes = [int(n) for n in msg["sizes"]]
        data = pattern_array(sum(sizes), int(msg.get("seed", 0)))
        arr, ptrs = self._scattered(sizes)
        at = 0
        for p, n in zip(ptrs, sizes, strict=True):
            off = p - int(arr.ctypes.data)
            arr[off : off + n] = data[at : at + n]
            at += n
        rcs = self.store.batch_put_from_multi_buffers(
            [msg["key"]], [ptrs], [sizes], self._config(msg)
        )
        return rcs[0]

    def op_multi_check_pattern(self, msg: dict[str, Any]) -> Any:
        """batch_get_into_multi_buffers of one key into ``sizes``; code and byte match."""
        sizes = [int(n) for n in msg["sizes"]]
        arr, ptrs = self._scattered(sizes)
        n = self.store.batch_get_into_multi_buffers([msg["key"]], [ptrs], [sizes])[0]
        got = np.concatenate(
            [
                arr[p - int(arr.ctypes.data) : p - int(arr.ctypes.data) + k]
                for p, k in zip(ptrs, sizes, strict=True)
            ]
        )
        want = pattern_array(sum(sizes), int(msg.get("seed", 0)))
        gaps_zero = int(arr.sum(dtype=np.uint64)) == int(got.sum(dtype=np.uint64))
        return {"n": n, "match": bool(np.array_equal(got, want) and gaps_zero)}

    def op_session_read_layers(self, msg: dict[str, Any]) -> Any:
        """Layer-wise reads of ``keys`` (each ``layers`` x ``page`` bytes,
        ``pattern_array(layers * page, seed + i)``) through one get session,
        one ``batch_get_into_multi_buffer_ranges`` per layer, into a pool of
        ``layers`` x ``slots`` pages at scattered slots; codes and byte match."""
        keys, layers, page = msg["keys"], int(msg["layers"]), int(msg["page"])
        seed, slots = int(msg.get("seed", 0)), [int(s) for s in msg["slots"]]
        n_slots = max(slots) + 1
        pool = np.zeros((layers, n_slots, page), np.uint8)
        base = int(pool.ctypes.data)
        start = self.store.batch_get_session_start(keys)
        codes = []
        for layer in range(layers):
            ptrs = [[base + (layer * n_slots + s) * page] for s in slots]
            codes.append(
                self.store.batch_get_into_multi_buffer_ranges(
                    keys, ptrs, [[page]] * len(keys), [[layer * page]] * len(keys)
                )
            )
        end = self.store.batch_get_session_end(keys)
        match = all(
            np.array_equal(pool[:, s, :].reshape(-1), pattern_array(layers * page, seed + i))
            for i, s in enumerate(slots)
        )
        return {"start": start, "codes": codes, "end": end, "match": bool(match)}

    def op_is_exist(self, msg: dict[str, Any]) -> Any:
        return self.store.is_exist(msg["key"])

    def op_remove(self, msg: dict[str, Any]) -> Any:
        return self.store.remove(msg["key"], bool(msg.get("force", False)))

    def op_stats(self, msg: dict[str, Any]) -> Any:
        fn = getattr(self.store, "get_client_stats", None)
        return None if fn is None else dict(fn())

    def op_close(self, msg: dict[str, Any]) -> Any:
        return self.store.close()

    def op_getenv(self, msg: dict[str, Any]) -> Any:
        return os.environ.get(msg["name"])

    def op_fd_count(self, msg: dict[str, Any]) -> Any:
        return len(os.listdir("/proc/self/fd"))

    def op_hog_fds(self, msg: dict[str, Any]) -> Any:
        """Open /dev/null until the descriptor limit is hit; keep them all."""
        self.hogged = getattr(self, "hogged", [])
        while True:
            try:
                self.hogged.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                return len(self.hogged)

    def op_release_fds(self, msg: dict[str, Any]) -> Any:
        for fd in getattr(self, "hogged", []):
            os.close(fd)
        self.hogged = []
        return 0


def main() -> int:
    nofile = os.environ.get("MC_TEST_NOFILE")
    if nofile:
        import resource

        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(nofile), hard))
    client = Client()
    serve(client)
    try:
        client.store.close()
    finally:
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
