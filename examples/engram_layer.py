"""An Engram-style layer on top of EngramStore.

Token n-grams (bigrams and trigrams) are hashed into per-head row ids with
a multiplicative-XOR hash into prime-sized tables; the rows are gathered
from the Mooncake store through ``EngramStore.lookup_into`` and the example
prints the output shape and the time per token.

Connection: ``MOONCAKE_CONFIG_PATH`` / ``MOONCAKE_MASTER`` (see
``mooncake.mooncake_config``); without either, a local ``mooncake_master``
is started for the run.

    python examples/engram_layer.py --heads 8 --dim 32 --tokens 4096
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from typing import Any

import numpy as np
from _launch import start_master, wait_port
from mooncake.mooncake_config import MooncakeConfig
from mooncake.store import EngramStore, EngramStoreConfig

MASK64 = (1 << 64) - 1


def next_prime(n: int) -> int:
    """The smallest prime >= n."""

    def is_prime(k: int) -> bool:
        if k < 2:
            return False
        i = 2
        while i * i <= k:
            if k % i == 0:
                return False
            i += 1
        return True

    while not is_prime(n):
        n += 1
    return n


def table_sizes(heads: int, base: int) -> list[int]:
    """Distinct prime table sizes around ``base``, one per head."""
    sizes: list[int] = []
    n = base
    for _ in range(heads):
        n = next_prime(n)
        sizes.append(n)
        n += 1
    return sizes


def head_multipliers(heads: int, seed: int = 0x9E3779B97F4A7C15) -> np.ndarray:
    """One odd 64-bit multiplier per head (splitmix-style sequence)."""
    out = []
    x = seed
    for _ in range(heads):
        x = (x + 0x9E3779B97F4A7C15) & MASK64
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        out.append((z ^ (z >> 31)) | 1)
    return np.array(out, dtype=np.uint64)


def ngram_row_ids(
    tokens: np.ndarray, sizes: list[int], mults: np.ndarray, orders: list[int]
) -> np.ndarray:
    """Row ids ``[B, L, H]`` for token ids ``[B, L]``.

    Head ``h`` hashes the n-gram of order ``orders[h]`` ending at each
    position (left-padded with token 0): ``acc = (acc * m_h) ^ token`` over
    the n-gram, then ``acc % N_h``.
    """
    b, length = tokens.shape
    t = tokens.astype(np.uint64)
    out = np.empty((b, length, len(sizes)), dtype=np.int64)
    with np.errstate(over="ignore"):
        for h, (n_h, order) in enumerate(zip(sizes, orders, strict=True)):
            acc = np.zeros((b, length), dtype=np.uint64)
            for k in range(order - 1, -1, -1):
                shifted = np.zeros_like(t)
                shifted[:, k:] = t[:, : length - k] if k else t
                acc = (acc * mults[h]) ^ shifted
            out[..., h] = (acc % np.uint64(n_h)).astype(np.int64)
    return out


def start_local_master() -> tuple[subprocess.Popen[bytes], str]:
    """Start a throwaway master on free loopback ports; (process, rpc address)."""
    proc, rpc, _http, _admin = start_master()
    try:
        wait_port(rpc)
    except RuntimeError:
        proc.kill()
        raise SystemExit("mooncake_master did not start") from None
    return proc, f"127.0.0.1:{rpc}"


def connect(cfg: MooncakeConfig) -> Any:
    """A set-up store client for ``cfg``."""
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup(*cfg.setup_args())
    if rc != 0:
        raise SystemExit(f"store setup failed: {rc}")
    return store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--table-size", type=int, default=50_000, help="approximate rows per head")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=1024, help="sequence length per batch row")
    ap.add_argument("--vocab", type=int, default=32_000)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()

    proc = None
    if os.getenv("MOONCAKE_CONFIG_PATH") or os.getenv("MOONCAKE_MASTER"):
        cfg = MooncakeConfig.load_from_env()
    else:
        proc, addr = start_local_master()
        cfg = MooncakeConfig(
            local_hostname="127.0.0.1",
            metadata_server="P2PHANDSHAKE",
            global_segment_size=256 << 20,
            local_buffer_size=64 << 20,
            protocol="tcp",
            device_name="",
            master_server_address=addr,
        )
    store = connect(cfg)
    try:
        sizes = table_sizes(args.heads, args.table_size)
        orders = [2 + (h % 2) for h in range(args.heads)]  # bigram / trigram heads
        mults = head_multipliers(args.heads)
        ecfg = EngramStoreConfig(table_vocab_sizes=sizes, embedding_dim=args.dim)
        engram = EngramStore(args.layer, ecfg, store)
        engram.remove_from_store(force=True)
        rng = np.random.default_rng(0)
        tables = [rng.standard_normal((n, args.dim), dtype=np.float32) for n in sizes]
        t0 = time.perf_counter()
        engram.populate(tables)
        mb = sum(t.nbytes for t in tables) / 1e6
        print(f"populated {args.heads} heads, {mb:.1f} MB in {time.perf_counter() - t0:.3f} s")

        tokens = rng.integers(0, args.vocab, (args.batch, args.tokens))
        ids = ngram_row_ids(tokens, sizes, mults, orders)
        out = np.empty((args.batch, args.tokens, args.heads, args.dim), np.float32)
        engram.lookup_into(ids, out)  # warm-up: caches the table locations
        t0 = time.perf_counter()
        for _ in range(args.iters):
            engram.lookup_into(ids, out)
        dt = (time.perf_counter() - t0) / args.iters
        ref = np.stack([tables[h][ids[..., h]] for h in range(args.heads)], axis=2)
        assert np.array_equal(out, ref)
        n_tok = args.batch * args.tokens
        print(f"output shape {out.shape} {out.dtype}")
        print(f"lookup {dt * 1e3:.3f} ms per call, {dt / n_tok * 1e9:.1f} ns per token")
        engram.remove_from_store(force=True)
    finally:
        store.close()
        if proc is not None:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
