#!/usr/bin/env python3
"""SGLang's HiCache Mooncake backend, unchanged, on this project and on the
upstream wheel, in one run.

    bash benchmarks/sglang_env.sh .venv/bin/python /tmp/sglang-ours
    bash benchmarks/sglang_env.sh /work/venv-upstream/bin/python /tmp/sglang-upstream
    python benchmarks/sglang_hicache_bench.py --sglang-path /tmp/sglang-ours \
        --upstream-sglang-path /tmp/sglang-upstream --runs 3

SGLang's ``MooncakeStore`` (``sglang.srt.mem_cache.storage.mooncake_store``)
is used as SGLang's HiCache uses it: configured from the environment at its
defaults (``MOONCAKE_MASTER`` set, ``MOONCAKE_PROTOCOL=tcp``, everything
else as SGLang leaves it: a 4 GB segment per process, ``P2PHANDSHAKE``
metadata, ``localhost``), with a host KV pool registered through
``register_mem_pool_host`` and pages moved with ``batch_set_v1`` and
``batch_get_v1`` (zero copy from and into the pool; each page is a K and a
V object of ``--page-kib`` KiB, 64 by default). The host pool is a stand-in
with the attributes the backend reads (``kv_buffer``, ``page_size``,
``get_page_buffer_meta``, ``get_ksize_per_token``, page-first layout); no
model runs.

Per side: a master; a writer process that stores ``--pages`` pages per
round (one ``batch_set_v1`` call; fresh keys each round) for ``--rounds``
rounds and then times ``batch_exists`` of one page ``--iters`` times; a
reader process (another engine, with its own segment; ours with
``MC_FORCE_TCP=1``, so its reads go over TCP as upstream's do) that times
``batch_exists`` of one page ``--iters`` times and then reads each round's
pages with ``batch_get_v1``. Figures: batch set and batch get MB/s (1e6
B/s of page bytes, the median over the rounds) and the one-page existence
check's p50 and p99 in ms, writer and reader.

SGLang is not a dependency of this project: ``--sglang-path`` names a
directory holding it and what its storage backend imports
(``benchmarks/sglang_env.sh`` fills one), put first on each side's
``sys.path``; the upstream side runs under the upstream venv's interpreter
and takes ``--upstream-sglang-path`` (default: ``--sglang-path``), filled
for that interpreter's Python.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    KiB,
    comparison_parser,
    find_sides,
    print_footer,
    print_table_head,
    run_sides,
    running_master,
    side_rows,
    stop_child,
    upstream_env,
    write_json,
)

HERE = Path(__file__).resolve()
PAGE_TOKENS = 64


class HostPool:
    """The parts of SGLang's MHA host KV pool (page-first layout) that its
    Mooncake backend reads: one K and one V buffer of ``page_bytes`` per
    page, in one registered tensor."""

    def __init__(self, torch: Any, pages: int, page_bytes: int) -> None:
        self.page_size = PAGE_TOKENS
        self.layout = "page_first"
        self.page_bytes = page_bytes
        self.pages = pages
        self.kv_buffer = torch.zeros((2, pages, page_bytes), dtype=torch.uint8)

    def get_ksize_per_token(self) -> int:
        return self.page_bytes // self.page_size

    def get_page_buffer_meta(self, indices: Any) -> tuple[list[int], list[int]]:
        base = self.kv_buffer.data_ptr()
        ptrs: list[int] = []
        sizes: list[int] = []
        for i in range(0, len(indices), self.page_size):
            p = int(indices[i]) // self.page_size
            ptrs += [base + p * self.page_bytes, base + (self.pages + p) * self.page_bytes]
            sizes += [self.page_bytes, self.page_bytes]
        return ptrs, sizes


def open_store(cfg: dict[str, Any]) -> tuple[Any, HostPool, Any]:
    """SGLang's ``MooncakeStore`` configured from the environment, with a
    host pool of ``cfg["pages"]`` pages registered; (store, pool, torch)."""
    sys.path.insert(0, cfg["sglang_path"])
    import torch
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    storage = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=None,
    )  # fmt: skip
    store = MooncakeStore(storage)
    pool = HostPool(torch, cfg["pages"], cfg["page_kib"] * KiB)
    pool.kv_buffer[0].fill_(7)
    pool.kv_buffer[1].fill_(9)
    store.register_mem_pool_host(pool)
    return store, pool, torch


def page_keys(rnd: int, pages: int) -> list[str]:
    return [f"hicache-r{rnd}-p{p}" for p in range(pages)]


def exists_lat(store: Any, keys: list[str], iters: int) -> list[float]:
    """Seconds of ``iters`` one-page ``batch_exists`` calls, cycling over ``keys``."""
    lat = []
    for i in range(iters):
        k = [keys[i % len(keys)]]
        t = time.perf_counter()
        n = store.batch_exists(k)
        lat.append(time.perf_counter() - t)
        if n != 1:
            raise RuntimeError(f"batch_exists({k}) answered {n}")
    return lat


def writer_main(cfg: dict[str, Any]) -> int:
    """Store the rounds, time the existence checks, print them, then hold
    the segment until stdin closes."""
    store, pool, torch = open_store(cfg)
    idx = torch.arange(cfg["pages"] * PAGE_TOKENS, dtype=torch.int64)
    page_bytes = 2 * pool.page_bytes * cfg["pages"]
    set_s = []
    for r in range(cfg["rounds"]):
        t = time.perf_counter()
        ok = store.batch_set_v1(page_keys(r, cfg["pages"]), idx)
        set_s.append(time.perf_counter() - t)
        if not all(ok):
            raise RuntimeError(f"batch_set_v1 round {r}: {ok.count(False)} pages failed")
    lat = exists_lat(store, page_keys(0, cfg["pages"]), cfg["iters"])
    print(json.dumps({"set_mbs": page_bytes / statistics.median(set_s) / 1e6, "exist": lat}))
    sys.stdout.flush()
    sys.stdin.read()
    return 0


def reader_main(cfg: dict[str, Any]) -> int:
    """Time the existence checks and the rounds' batch reads; print them."""
    store, pool, torch = open_store(cfg)
    pages = cfg["pages"]
    idx = torch.arange(pages * PAGE_TOKENS, dtype=torch.int64)
    lat = exists_lat(store, page_keys(0, pages), cfg["iters"])
    get_s = []
    for r in range(cfg["rounds"]):
        pool.kv_buffer.zero_()
        t = time.perf_counter()
        ok = store.batch_get_v1(page_keys(r, pages), idx)
        get_s.append(time.perf_counter() - t)
        if not all(ok):
            raise RuntimeError(f"batch_get_v1 round {r}: {ok.count(False)} pages failed")
        if not (bool((pool.kv_buffer[0] == 7).all()) and bool((pool.kv_buffer[1] == 9).all())):
            raise RuntimeError(f"batch_get_v1 round {r} read wrong bytes")
    page_bytes = 2 * pool.page_bytes * pages
    print(json.dumps({"get_mbs": page_bytes / statistics.median(get_s) / 1e6, "exist": lat}))
    return 0


def pct(lat: list[float], q: float) -> float:
    s = sorted(lat)
    return s[min(len(s) - 1, int(q * len(s)))] * 1e3


def side_main(args: Any) -> int:
    cfg = {
        "sglang_path": args.sglang_path,
        "pages": args.pages,
        "page_kib": args.page_kib,
        "rounds": args.rounds,
        "iters": args.iters,
    }
    with running_master(args.master_bin) as (rpc, _meta):
        env = dict(os.environ, MOONCAKE_MASTER=rpc, MOONCAKE_PROTOCOL="tcp")
        cmd = [sys.executable, str(HERE)]
        writer = subprocess.Popen(
            [*cmd, "--writer", json.dumps(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        try:
            line = writer.stdout.readline() if writer.stdout else ""
            if not line.startswith("{"):
                raise RuntimeError("the writer failed")
            w = json.loads(line)
            r = subprocess.run(
                [*cmd, "--reader", json.dumps(cfg)],
                capture_output=True, text=True, timeout=900, check=False,
                env=dict(env, MC_FORCE_TCP="1"),
            )  # fmt: skip
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
            if r.returncode != 0 or not lines:
                raise RuntimeError(f"the reader failed: {r.stderr[-2000:]}")
            rd = json.loads(lines[-1])
        finally:
            if writer.stdin is not None:
                writer.stdin.close()
            stop_child(writer)
    row = {
        "set_mbs": w["set_mbs"],
        "get_mbs": rd["get_mbs"],
        "exist_w": (pct(w["exist"], 0.5), pct(w["exist"], 0.99)),
        "exist_r": (pct(rd["exist"], 0.5), pct(rd["exist"], 0.99)),
    }
    print(json.dumps({"rows": [row]}))
    return 0


def main() -> int:
    ap = comparison_parser(__doc__, side_options=("--writer", "--reader"))
    ap.add_argument("--sglang-path", help="a directory holding SGLang (required)")
    ap.add_argument("--upstream-sglang-path", help="the same for the upstream interpreter")
    ap.add_argument("--pages", type=int, default=200)
    ap.add_argument("--page-kib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=1, help="runs of both sides, one after the other")
    args = ap.parse_args()
    for cfg, role in ((args.writer, writer_main), (args.reader, reader_main)):
        if cfg:
            return role(json.loads(cfg))
    if args.side:
        return side_main(args)
    if not args.sglang_path:
        ap.error("--sglang-path is required")
    t0 = time.monotonic()
    sides = find_sides(args.only, args.upstream_python)
    runs: list[dict[str, Any]] = []
    loads: list[str] = []
    for _ in range(args.runs):
        res: dict[str, Any] = {}

        def run(name: str, python: str, master: str) -> Any:
            path = args.sglang_path
            if name == "upstream":
                path = args.upstream_sglang_path or path
            extra = ["--sglang-path", path, "--pages", str(args.pages),
                     "--page-kib", str(args.page_kib), "--rounds", str(args.rounds),
                     "--iters", str(args.iters)]  # fmt: skip
            env = upstream_env() if name == "upstream" else None
            return side_rows(HERE, name, python, master, extra, 1800, env)

        run_sides(sides, run, res, loads)
        runs.append(res)
    hdr = (f"{'side':9s} {'set MB/s':>9s} {'get MB/s':>9s} | {'exist p50 w/r ms':>17s} "
           f"{'exist p99 w/r ms':>17s}")  # fmt: skip
    print(f"SGLang HiCache MooncakeStore, {args.pages} pages of 2 x {args.page_kib} KiB, TCP")
    for i, res in enumerate(runs):
        print(f"## run {i + 1}")
        print_table_head(res, hdr)
        for name, rows in res.items():
            if isinstance(rows, str):
                continue
            r = rows[0]
            ew, er = r["exist_w"], r["exist_r"]
            print(f"{name:9s} {r['set_mbs']:9.0f} {r['get_mbs']:9.0f} | "
                  f"{ew[0]:8.3f}/{er[0]:<8.3f} {ew[1]:8.3f}/{er[1]:<8.3f}")  # fmt: skip
        o, u = res.get("ours"), res.get("upstream")
        if isinstance(o, list) and isinstance(u, list):
            a, b = o[0], u[0]
            print(f"{'ours/up':9s} {a['set_mbs'] / b['set_mbs']:9.2f} {a['get_mbs'] / b['get_mbs']:9.2f} | "
                  f"{a['exist_w'][0] / b['exist_w'][0]:8.2f}/{a['exist_r'][0] / b['exist_r'][0]:<8.2f} "
                  f"{a['exist_w'][1] / b['exist_w'][1]:8.2f}/{a['exist_r'][1] / b['exist_r'][1]:<8.2f}")  # fmt: skip
    print_footer(t0, loads=loads)
    write_json(args.json, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
