"""The call sequences of the real callers, reproduced literally and checked
byte for byte:

* vLLM's ``MooncakeConnectorWorker`` (prefill -> decode KV transfer):
  ``initialize(get_ip(), "P2PHANDSHAKE", "rdma", "")``, ``get_rpc_port()``,
  ``batch_register_memory(kv_data_ptrs, kv_data_lens)`` on both sides, then
  ``batch_transfer_sync_write(f"{remote_hostname}:{remote_port}", src_ptrs,
  dst_ptrs, lengths)`` from a pool of sender threads, contiguous blocks
  coalesced into one entry.
* SGLang's ``MooncakeTransferEngine``: ``initialize(hostname, "P2PHANDSHAKE",
  "rdma", device_name or "")`` on a helper thread, the session id
  ``f"{hostname}:{get_rpc_port()}"``, ``batch_register_memory`` of KV and aux
  buffers, ``transfer_sync_write`` and ``batch_transfer_sync_write`` from
  several threads at once, ``send_probe`` (0 alive, non-zero dead), the
  ``register_memory``/``unregister_memory`` pair, and ``get_engine()`` handed
  to ``MooncakeDistributedStore.setup(..., protocol="rdma", ..., engine)``.
"""

from __future__ import annotations

import signal
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from conftest import Peer
from mooncake.engine import TransferEngine

NUM_LAYERS = 4
NUM_BLOCKS = 64
BLOCK_LEN = 16 * 1024  # bytes of one block of one layer's K (or V) cache


def get_ip() -> str:
    """The host's outward address, as vLLM's get_ip() finds it (no packet
    is sent); loopback when the host has no route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def kv_caches(seed: int | None) -> list[np.ndarray]:
    """One K and one V tensor per layer, NUM_BLOCKS blocks each."""
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, 256, NUM_BLOCKS * BLOCK_LEN, dtype=np.uint8)
        if seed is not None
        else np.zeros(NUM_BLOCKS * BLOCK_LEN, np.uint8)
        for _ in range(2 * NUM_LAYERS)
    ]


def coalesce(src_blocks: list[int], dst_blocks: list[int]) -> list[tuple[int, int, int]]:
    """(src block, dst block, count) runs where both sides are contiguous."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src_blocks, dst_blocks, strict=True):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, d, 1))
    return runs


def test_vllm_mooncake_connector_sequence(peers: Any) -> None:
    # Decode worker (kv_consumer), in its own process.
    decode: Peer = peers()
    hostname = get_ip()
    r = decode.call_op(op="init", host=hostname, meta="P2PHANDSHAKE", protocol="rdma", name="")
    assert r["rc"] == 0
    remote_port = r["port"]
    decode_base = [
        decode.array(NUM_BLOCKS * BLOCK_LEN, register=False) for _ in range(2 * NUM_LAYERS)
    ]
    assert (
        decode.call(
            "batch_register_memory", decode_base, [NUM_BLOCKS * BLOCK_LEN] * len(decode_base)
        )
        == 0
    )

    # Prefill worker (kv_producer), this process.
    engine = TransferEngine()
    assert engine.initialize(hostname, "P2PHANDSHAKE", "rdma", "") == 0
    rpc_port = engine.get_rpc_port()
    assert 0 < rpc_port < 65536
    caches = kv_caches(seed=11)
    kv_data_ptrs = [c.ctypes.data for c in caches]
    kv_data_lens = [c.nbytes for c in caches]
    assert engine.batch_register_memory(kv_data_ptrs, kv_data_lens) == 0

    # Requests: prefill blocks -> decode blocks (some runs contiguous).
    rng = np.random.default_rng(5)
    requests = []
    free = list(range(NUM_BLOCKS))
    for _ in range(8):
        n = 8
        src = sorted(rng.choice(NUM_BLOCKS, n, replace=False).tolist())
        dst = free[:n]
        free = free[n:]
        requests.append((src, dst))
    remote_session = f"{hostname}:{remote_port}"

    def send_blocks(req: tuple[list[int], list[int]]) -> int:
        src_ptrs, dst_ptrs, lengths = [], [], []
        for layer in range(2 * NUM_LAYERS):
            for s, d, count in coalesce(*req):
                src_ptrs.append(kv_data_ptrs[layer] + s * BLOCK_LEN)
                dst_ptrs.append(decode_base[layer] + d * BLOCK_LEN)
                lengths.append(count * BLOCK_LEN)
        return int(engine.batch_transfer_sync_write(remote_session, src_ptrs, dst_ptrs, lengths))

    with ThreadPoolExecutor(max_workers=10) as pool:
        assert list(pool.map(send_blocks, requests)) == [0] * len(requests)

    for layer in range(2 * NUM_LAYERS):
        got = decode.read(decode_base[layer], NUM_BLOCKS * BLOCK_LEN)
        for src, dst in requests:
            for s, d in zip(src, dst, strict=True):
                want = caches[layer][s * BLOCK_LEN : (s + 1) * BLOCK_LEN].tobytes()
                assert got[d * BLOCK_LEN : (d + 1) * BLOCK_LEN] == want, (layer, s, d)
        # Blocks no request named stay untouched.
        used = {d for _, dst in requests for d in dst}
        for d in set(range(NUM_BLOCKS)) - used:
            assert got[d * BLOCK_LEN : (d + 1) * BLOCK_LEN] == bytes(BLOCK_LEN)


def test_sglang_mooncake_transfer_engine_sequence(peers: Any, shared_master: Any) -> None:
    from mooncake.store import MooncakeDistributedStore

    hostname = "127.0.0.1"
    # The decode side, in its own process, registers KV and aux buffers.
    decode: Peer = peers()
    dsession = decode.init("P2PHANDSHAKE", host=hostname, protocol="rdma")
    d_kv = [decode.array(NUM_BLOCKS * BLOCK_LEN, register=False) for _ in range(NUM_LAYERS)]
    d_aux = decode.array(64 * 1024, register=False)
    assert decode.call("batch_register_memory", d_kv, [NUM_BLOCKS * BLOCK_LEN] * NUM_LAYERS) == 0
    assert decode.call("batch_register_memory", [d_aux], [64 * 1024]) == 0

    # The prefill side: MooncakeTransferEngine.__init__ initializes on a
    # helper thread and builds its session id from get_rpc_port().
    engine = TransferEngine()
    rets: list[int] = []
    t = threading.Thread(
        target=lambda: rets.append(engine.initialize(hostname, "P2PHANDSHAKE", "rdma", ""))
    )
    t.start()
    t.join()
    assert rets == [0]
    session_id = f"{hostname}:{engine.get_rpc_port()}"
    kv = kv_caches(seed=3)[:NUM_LAYERS]
    aux = np.arange(64 * 1024, dtype=np.uint32).astype(np.uint8)
    assert engine.batch_register_memory([c.ctypes.data for c in kv], [c.nbytes for c in kv]) == 0
    assert engine.batch_register_memory([aux.ctypes.data], [aux.nbytes]) == 0

    # send_kvcache: per layer, one batch of the request's blocks; aux by
    # transfer_sync_write; several requests at once on worker threads.
    def send(req: int) -> list[int]:
        blocks = list(range(req * 8, req * 8 + 8))
        out = []
        for layer in range(NUM_LAYERS):
            src = [kv[layer].ctypes.data + b * BLOCK_LEN for b in blocks]
            dst = [d_kv[layer] + b * BLOCK_LEN for b in blocks]
            out.append(engine.batch_transfer_sync_write(dsession, src, dst, [BLOCK_LEN] * 8))
        out.append(
            engine.transfer_sync_write(
                dsession, aux.ctypes.data + req * 1024, d_aux + req * 1024, 1024
            )
        )
        return out

    with ThreadPoolExecutor(max_workers=4) as pool:
        for rcs in pool.map(send, range(8)):
            assert rcs == [0] * (NUM_LAYERS + 1)
    for layer in range(NUM_LAYERS):
        assert decode.read(d_kv[layer], NUM_BLOCKS * BLOCK_LEN) == kv[layer].tobytes()
    assert decode.read(d_aux, 8 * 1024) == aux[: 8 * 1024].tobytes()

    # The failed-session blacklist: probe says alive, then dead.
    assert engine.send_probe(dsession) == 0

    # register / deregister of a single buffer.
    extra = np.zeros(4096, np.uint8)
    assert engine.register_memory(extra.ctypes.data, extra.nbytes) == 0
    assert engine.unregister_memory(extra.ctypes.data) == 0

    # HiCache reuses the engine for its store (MooncakeStore.__init__ when
    # metadata_server is P2PHANDSHAKE and protocol is "rdma").
    store = MooncakeDistributedStore()
    transfer_engine = engine.get_engine()
    rc = store.setup(
        session_id,
        "P2PHANDSHAKE",
        32 << 20,
        16 << 20,
        "rdma",
        "",
        shared_master.rpc_addr,
        transfer_engine,
    )
    assert rc == 0
    key = "sglang_mooncake_store_warmup_key_engine"
    value = bytes(4 * 1024)
    assert store.put(key, value) == 0
    assert store.is_exist(key) == 1
    assert store.get(key) == value
    # One set of registered memory: the engine's KV buffers are already
    # registered for the store, and the store's registration is the engine's.
    assert store.register_buffer(kv[0].ctypes.data, kv[0].nbytes) != 0
    host = np.zeros(1 << 20, np.uint8)
    assert store.register_buffer(host.ctypes.data, host.nbytes) == 0
    assert engine.register_memory(host.ctypes.data, host.nbytes) == -7
    assert decode.call("transfer_sync_write", session_id, d_aux, host.ctypes.data, 16) == 0
    assert host[:16].tobytes() == aux[:16].tobytes()
    assert store.unregister_buffer(host.ctypes.data) == 0
    store.close()

    decode.proc.send_signal(signal.SIGKILL)
    decode.proc.wait(10)
    assert engine.send_probe(dsession) != 0
    assert engine.batch_unregister_memory([c.ctypes.data for c in kv]) == 0
