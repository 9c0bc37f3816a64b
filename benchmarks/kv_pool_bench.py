#!/usr/bin/env python3
"""KV-cache pool benchmark: the access pattern of an inference engine's L3 KV cache.

    python benchmarks/kv_pool_bench.py              # both sides (ours + upstream wheel)
    python benchmarks/kv_pool_bench.py --quick
    python benchmarks/kv_pool_bench.py --only ours

An engine registers its host KV pools once (a K pool and a V pool, 2 GiB in
all), then backs pages up to the store and prefetches them back at page
granularity. Pages sit at scattered indices of the pools; each page is two
keys (K and V). Per batch of up to 128 pages (256 keys):

  backup-cold  ``batch_is_exist`` of the batch's keys, then ``batch_put_from``
             of the missing ones, straight from the pool pages, by a client
             whose segment was just set up (never-written pages)
  backup-warm  the same after ``remove_all``: the freed space is reused
  read-self  ``batch_get_into`` into other scattered pages of the same pools
             (the values live in this process's own segment)
  read-peer  ``batch_get_into`` from a second process into its own registered
             pools (same host)

Every read is verified byte for byte against the source pages. Each side
(ours, and upstream's wheel from ``/work/venv-upstream``) starts its own master;
the table gives GB/s (1e9 B/s of page bytes, K and V counted) and ours/upstream.
The side machinery (masters, venvs, table) is shared with ``store_bench.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import store_bench as sb

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
POOL = 1 * GiB  # per pool (K and V): 2 GiB registered in all
BATCH_PAGES = 128
SEGMENT = 1 * GiB  # each backup pass writes at most 400 MiB
HERE = Path(__file__).resolve()


def page_counts(quick: bool) -> dict[int, int]:
    """Pages backed up per measurement, by page size."""
    return {64 * KiB: 200, 1 * MiB: 96 if quick else 200}


class Pools:
    """A K pool and a V pool, filled (every page committed) and registered once."""

    def __init__(self, store: Any, seed: int) -> None:
        import numpy as np

        self.np = np
        self.store = store
        self.k = np.empty(POOL, np.uint8)
        self.v = np.empty(POOL, np.uint8)
        rng = np.random.default_rng(seed)
        block = rng.integers(0, 256, 8 * MiB, np.uint8)
        for pool in (self.k, self.v):
            for off in range(0, POOL, block.nbytes):
                pool[off : off + block.nbytes] = block
        self.kp, self.vp = int(self.k.ctypes.data), int(self.v.ctypes.data)
        self.register(store)

    def register(self, store: Any) -> None:
        for ptr in (self.kp, self.vp):
            rc = store.register_buffer(ptr, POOL)
            if rc != 0:
                raise RuntimeError(f"register_buffer returned {rc}")

    def unregister(self, store: Any) -> None:
        for ptr in (self.kp, self.vp):
            store.unregister_buffer(ptr)

    def stamp(self, page: int, pages: list[int], tag: int) -> None:
        """Give each chosen page distinct leading bytes, so a misplaced read shows."""
        np = self.np
        for i, p in enumerate(pages):
            for pool, salt in ((self.k, 0), (self.v, 1)):
                pool[p * page : p * page + 16] = np.frombuffer(
                    (tag * 1_000_003 + i * 2 + salt).to_bytes(16, "little"), np.uint8
                )

    def same(self, page: int, a: list[int], b: list[int]) -> bool:
        """Pages ``a[i]`` and ``b[i]`` hold equal bytes in both pools."""
        for pa, pb in zip(a, b):
            for pool in (self.k, self.v):
                if not self.np.array_equal(
                    pool[pa * page : (pa + 1) * page], pool[pb * page : (pb + 1) * page]
                ):
                    return False
        return True


def keys_ptrs(pools: Pools, prefix: str, page: int, pages: list[int], slots: list[int]):
    keys, ptrs = [], []
    for p, s in zip(pages, slots):
        keys += [f"{prefix}:{p}:k", f"{prefix}:{p}:v"]
        ptrs += [pools.kp + s * page, pools.vp + s * page]
    return keys, ptrs


def batches(n: int) -> list[tuple[int, int]]:
    return [(a, min(n, a + BATCH_PAGES)) for a in range(0, n, BATCH_PAGES)]


def backup(store: Any, pools: Pools, prefix: str, page: int, pages: list[int]) -> float:
    t0 = time.perf_counter()
    for a, b in batches(len(pages)):
        keys, ptrs = keys_ptrs(pools, prefix, page, pages[a:b], pages[a:b])
        exist = store.batch_is_exist(keys)
        todo = [i for i, e in enumerate(exist) if e != 1]
        rcs = store.batch_put_from(
            [keys[i] for i in todo], [ptrs[i] for i in todo], [page] * len(todo)
        )
        sb.check_all(list(rcs), 0, "batch_put_from")
    return time.perf_counter() - t0


def prefetch(
    store: Any, pools: Pools, prefix: str, page: int, pages: list[int], slots: list[int]
) -> float:
    t0 = time.perf_counter()
    for a, b in batches(len(pages)):
        keys, ptrs = keys_ptrs(pools, prefix, page, pages[a:b], slots[a:b])
        rcs = store.batch_get_into(keys, ptrs, [page] * len(keys))
        sb.check_all(list(rcs), page, "batch_get_into")
    return time.perf_counter() - t0


def scatter(np: Any, page: int, n: int, seed: int) -> tuple[list[int], list[int]]:
    """``n`` source pages and ``n`` distinct destination pages at scattered indices."""
    chosen = np.random.default_rng(seed).choice(POOL // page, 2 * n, replace=False)
    return [int(x) for x in chosen[:n]], [int(x) for x in chosen[n:]]


# ------------------------------------------------------------------ peer reader child


def peer_main(args: argparse.Namespace) -> int:
    store = sb.new_store(args.rpc, args.meta, 0, 64 * MiB)
    pools = Pools(store, seed=99)
    import numpy as np

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["op"] == "exit":
            break
        page, pages = msg["page"], msg["pages"]
        _, slots = scatter(np, page, len(pages), msg["seed"] + 1)
        secs = [prefetch(store, pools, msg["prefix"], page, pages, slots) for _ in range(3)]
        # The writer stamped page p with its position i; rebuild that to verify.
        ok = all(
            int.from_bytes(pools.k[s * page : s * page + 16].tobytes(), "little")
            == msg["tag"] * 1_000_003 + i * 2
            for i, s in enumerate(slots)
        )
        print(json.dumps({"secs": sorted(secs)[1], "ok": ok}), flush=True)
    store.close()
    return 0


# ------------------------------------------------------------------ one side


def side_main(args: argparse.Namespace) -> int:
    import numpy as np

    reps = 3 if args.quick else 5
    rows: list[dict[str, Any]] = []

    def add(op: str, page: int, gbs: float) -> None:
        rows.append(
            {
                "scenario": "kvpool",
                "op": op,
                "size": sb.size_label(page),
                "value": gbs,
                "unit": "GB/s",
            }
        )
        print(f"  kvpool {op:10s} {sb.size_label(page):>6s} {gbs:8.3f} GB/s", file=sys.stderr)

    with sb.running_master(args.master_bin) as (rpc, meta):
        pools: Pools | None = None
        peer = subprocess.Popen(
            [sys.executable, str(HERE), "--peer", "--rpc", rpc, "--meta", meta],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert peer.stdin is not None and peer.stdout is not None
        if "ready" not in json.loads(peer.stdout.readline() or "{}"):
            raise RuntimeError("peer reader did not start")
        try:
            for page, n in page_counts(args.quick).items():
                src, dst = scatter(np, page, n, seed=page)
                tag = page // KiB
                nbytes = 2 * n * page
                cold, warm, rself, rpeer = [], [], [], []
                for rep in range(reps):
                    # A fresh client per pass: its segment has never been written, as
                    # when an engine starts filling its cache.
                    store = sb.new_store(rpc, meta, SEGMENT, 64 * MiB)
                    if pools is None:
                        pools = Pools(store, seed=7)
                    else:
                        pools.register(store)
                    pools.stamp(page, src, tag)
                    prefix = f"kv{page}"
                    backup(store, pools, "warm", page, src[:2])  # connections
                    cold.append(backup(store, pools, prefix, page, src))
                    rself.append(prefetch(store, pools, prefix, page, src, dst))
                    if not pools.same(page, src, dst):
                        raise RuntimeError("read-self: bytes differ from the backed-up pages")
                    msg = {"op": "read", "prefix": prefix, "page": page, "pages": src}
                    peer.stdin.write(json.dumps(dict(msg, seed=page, tag=tag)) + "\n")
                    peer.stdin.flush()
                    r = json.loads(peer.stdout.readline() or "{}")
                    if not r.get("ok"):
                        raise RuntimeError(f"read-peer failed: {r}")
                    rpeer.append(r["secs"])
                    # Steady state: the freed space is reused by the next backup.
                    store.remove_all(True)
                    warm.append(backup(store, pools, prefix + "w", page, src))
                    store.remove_all(True)
                    pools.unregister(store)
                    store.close()
                add("backup-cold", page, nbytes / sb.median(cold) / 1e9)
                add("backup-warm", page, nbytes / sb.median(warm) / 1e9)
                add("read-self", page, nbytes / sb.median(rself) / 1e9)
                add("read-peer", page, nbytes / sb.median(rpeer) / 1e9)
        finally:
            peer.stdin.write(json.dumps({"op": "exit"}) + "\n")
            peer.stdin.flush()
            peer.wait(timeout=30)
    print(json.dumps({"rows": rows}), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=["ours", "upstream"])
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--upstream-python", default=str(sb.UPSTREAM_VENV / "bin" / "python"))
    ap.add_argument("--side", help=argparse.SUPPRESS)
    ap.add_argument("--master-bin", help=argparse.SUPPRESS)
    ap.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rpc", help=argparse.SUPPRESS)
    ap.add_argument("--meta", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        return peer_main(args)
    if args.side:
        return side_main(args)
    return sb.compare(HERE, args)


if __name__ == "__main__":
    sys.exit(main())
