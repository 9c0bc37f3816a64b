"""Transfers between this process (the initiator) and a target process, over
P2PHANDSHAKE and the HTTP metadata server, on one host and with TCP forced.
Every figure that moved is compared byte for byte."""

from __future__ import annotations

import os
import random
import string
import time
from typing import Any

import numpy as np
import pytest
from conftest import Peer, engine_lines, init_local, init_peer
from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

MiB = 1 << 20


def registered(engine: Any, size: int, fill: int | None = None) -> np.ndarray:
    a = np.zeros(size, dtype=np.uint8) if fill is None else np.full(size, fill, np.uint8)
    assert engine.register_memory(a.ctypes.data, a.nbytes) == 0
    return a


def test_random_strings_1000_rounds(peers: Any, meta: str, path: dict[str, str]) -> None:
    """Upstream's own engine test: the target allocates a managed buffer; the
    initiator writes random strings of 16-256 B and reads each back."""
    target: Peer = peers(path)
    tname = init_peer(target, meta)
    remote = target.managed(1 << 20)
    assert remote != 0
    engine = TransferEngine()
    init_local(engine, meta)
    local = engine.allocate_managed_buffer(1 << 20)
    assert local != 0
    rng = random.Random(30)
    for i in range(1000):
        n = rng.randint(16, 256)
        s = "".join(rng.choices(string.ascii_letters + string.digits, k=n)).encode()
        off = rng.randrange(0, (1 << 20) - 256)
        assert engine.write_bytes_to_buffer(local, s, n) == 0
        assert engine.transfer_sync_write(tname, local, remote + off, n) == 0, i
        assert engine.write_bytes_to_buffer(local, b"\0" * n, n) == 0
        assert engine.transfer_sync_read(tname, local, remote + off, n) == 0, i
        assert engine.read_bytes_from_buffer(local, n) == s, i
    assert target.read(remote + off, n) == s
    assert engine.free_managed_buffer(local, 1 << 20) == 0


def test_every_transfer_form_moves_exact_bytes(peers: Any, meta: str, path: dict[str, str]) -> None:
    target: Peer = peers(path)
    tname = init_peer(target, meta)
    size = 8 * MiB
    remote = target.array(size)
    engine = TransferEngine()
    init_local(engine, meta)
    src = registered(engine, size)
    src[:] = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    dst = registered(engine, size)
    base, rbase = src.ctypes.data, remote

    # single sync forms (positional and keyword)
    assert engine.transfer_sync_write(tname, base, rbase, 4096) == 0
    assert target.read(rbase, 4096) == src[:4096].tobytes()
    assert (
        engine.transfer_sync_read(
            target_hostname=tname,
            buffer=dst.ctypes.data,
            peer_buffer_address=rbase,
            length=4096,
            transport_hint="",
        )
        == 0
    )
    assert dst[:4096].tobytes() == src[:4096].tobytes()

    # batch sync write of 64 scattered blocks, then read them back in reverse
    blk = 64 * 1024
    order = list(range(64))
    random.Random(2).shuffle(order)
    srcs = [base + i * blk for i in range(64)]
    dsts = [rbase + order[i] * blk for i in range(64)]
    assert engine.batch_transfer_sync_write(tname, srcs, dsts, [blk] * 64) == 0
    remote_bytes = target.read(rbase, 64 * blk)
    for i in range(64):
        j = order[i]
        assert remote_bytes[j * blk : (j + 1) * blk] == src[i * blk : (i + 1) * blk].tobytes()
    dst[:] = 0
    outs = [dst.ctypes.data + i * blk for i in range(64)]
    assert (
        engine.batch_transfer_sync_read(
            target_hostname=tname, buffers=outs, peer_buffer_addresses=dsts, lengths=[blk] * 64
        )
        == 0
    )
    assert dst[: 64 * blk].tobytes() == src[: 64 * blk].tobytes()

    # one large transfer (split over parallel connections on TCP)
    assert engine.transfer_sync_write(tname, base, rbase, size) == 0
    dst[:] = 0
    assert engine.transfer_sync(tname, dst.ctypes.data, rbase, size, TransferOpcode.Read) == 0
    assert np.array_equal(dst, src)

    # transfer_sync / batch_transfer_sync with opcode and notify
    note = TransferNotify("kv-done", "req-7")
    assert engine.transfer_sync(tname, base + 100, rbase, 100, TransferOpcode.Write, note) == 0
    assert target.read(rbase, 100) == src[100:200].tobytes()
    assert (
        engine.batch_transfer_sync(
            tname,
            [base, base + 10],
            [rbase + 1000, rbase + 2000],
            [10, 10],
            TransferOpcode.WRITE,
            notify=TransferNotify("batch", "two"),
        )
        == 0
    )
    assert target.read(rbase + 1000, 10) == src[:10].tobytes()
    assert target.read(rbase + 2000, 10) == src[10:20].tobytes()
    assert target.notifies() == [["kv-done", "req-7"], ["batch", "two"]]
    assert target.notifies() == []

    # async forms
    target.fill(rbase, bytes(256))
    b1 = engine.batch_transfer_async_write(tname, [base], [rbase], [128])
    b2 = engine.batch_transfer_async(
        tname, [base + 128], [rbase + 128], [128], TransferOpcode.Write
    )
    assert b1 > 0 and b2 > 0 and b1 != b2
    assert engine.get_batch_transfer_status([b1, b2]) == 0
    assert target.read(rbase, 256) == src[:256].tobytes()
    dst[:256] = 0
    b3 = engine.batch_transfer_async_read(tname, [dst.ctypes.data], [rbase], [256])
    assert engine.get_batch_transfer_status([b3]) == 0
    assert dst[:256].tobytes() == src[:256].tobytes()
    sid = engine.transfer_submit_write(tname, base + 4096, rbase, 4096)
    assert sid > 0
    deadline = time.monotonic() + 30
    status = 0
    while status == 0 and time.monotonic() < deadline:
        status = engine.transfer_check_status(sid)
    assert status == 1
    assert target.read(rbase, 4096) == src[4096:8192].tobytes()

    # the target's first buffer, from either side
    assert engine.get_first_buffer_address(tname) == rbase
    assert target.call("get_first_buffer_address", target.name) == rbase
    assert engine.send_probe(tname) == 0


def test_same_host_transfers_do_not_use_tcp(
    peers: Any, monkeypatch: pytest.MonkeyPatch, engine_log: pytest.LogCaptureFixture
) -> None:
    """Between processes of one host the bytes move by cross-process copy;
    with MC_FORCE_TCP set (even to "") the target's TCP server carries them.
    Told apart by the target's Unix socket: with TCP forced it has none."""
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    target = peers()
    tname = target.init("P2PHANDSHAKE")
    remote = target.array(1 << 20)
    engine = TransferEngine()
    init_local(engine, "P2PHANDSHAKE")
    src = registered(engine, 1 << 20, fill=7)
    before = _tcp_conns_to(target.port)
    assert engine.transfer_sync_write(tname, src.ctypes.data, remote, 1 << 20) == 0
    assert target.read(remote, 16) == bytes([7] * 16)
    # Only the describe connection of the first contact (pooled, one).
    assert _tcp_conns_to(target.port) - before <= 1
    assert not any("refused cross-process" in m for m in engine_lines(engine_log))

    monkeypatch.setenv("MC_FORCE_TCP", "")
    tcp_target = peers({"MC_FORCE_TCP": ""})
    tname2 = tcp_target.init("P2PHANDSHAKE")
    remote2 = tcp_target.array(1 << 20)
    e2 = TransferEngine()
    init_local(e2, "P2PHANDSHAKE")
    src2 = registered(e2, 1 << 20, fill=9)
    assert e2.transfer_sync_write(tname2, src2.ctypes.data, remote2, 1 << 20) == 0
    assert tcp_target.read(remote2, 16) == bytes([9] * 16)
    assert _tcp_conns_to(tcp_target.port) >= 1


def _tcp_conns_to(port: int) -> int:
    """Established TCP connections of this process to ``port`` (from /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                rport = int(cols[2].split(":")[1], 16)
                if rport == port and cols[3] == "01" and cols[9] in inodes:
                    n += 1
    return n


def test_vm_denied_falls_back_to_tcp_once(peers: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the kernel refuses the cross-process copy (as under a ptrace
    policy: here the initiator is not dumpable and the target, when root,
    runs as nobody), transfers fall back to TCP and say so once."""
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    target = peers({"ENGINE_PEER_NOBODY": "1"})
    tname = target.init("P2PHANDSHAKE")
    remote = target.array(1 << 16)
    init = peers({"ENGINE_PEER_NODUMP": "1"})
    init.init("P2PHANDSHAKE")
    local = init.array(1 << 16)
    init.fill(local, bytes([5]) * (1 << 16))
    for _ in range(3):
        assert init.call("transfer_sync_write", tname, local, remote, 1 << 16) == 0
    assert target.read(remote, 1 << 16) == bytes([5]) * (1 << 16)
    init.fill(local, bytes(1 << 16))
    assert init.call("transfer_sync_read", tname, local, remote, 1 << 16) == 0
    assert init.read(local, 1 << 16) == bytes([5]) * (1 << 16)
    lines = [m for m in init.logs() if "refused cross-process copies" in m]
    assert len(lines) == 1, lines


def test_rdma_protocol_runs_over_our_transports_with_one_warning(
    peers: Any, engine_log: pytest.LogCaptureFixture
) -> None:
    target = peers()
    tname = target.init("P2PHANDSHAKE", protocol="rdma")
    remote = target.array(4096)
    engine = TransferEngine()
    init_local(engine, "P2PHANDSHAKE", protocol="rdma")
    src = registered(engine, 4096, fill=3)
    assert engine.transfer_sync_write(tname, src.ctypes.data, remote, 4096) == 0
    assert target.read(remote, 4096) == bytes([3] * 4096)
    warnings = [m for m in engine_lines(engine_log) if 'protocol "rdma"' in m]
    assert len(warnings) <= 1
    assert any('protocol "rdma"' in m for m in target.logs())


def test_cluster_token_guards_engine_connections(peers: Any) -> None:
    """With MC_AUTH_TOKEN, engines authenticate as the store's connections
    do: same token works, a missing or different token fails with -1."""
    target = peers({"MC_AUTH_TOKEN": "secret-a", "MC_FORCE_TCP": "1"})
    tname = target.init("P2PHANDSHAKE")
    remote = target.array(4096)
    for token, want in (("secret-a", 0), ("secret-b", -1), (None, -1)):
        env = {"MC_FORCE_TCP": "1"}
        if token:
            env["MC_AUTH_TOKEN"] = token
        init = peers(env)
        init.init("P2PHANDSHAKE")
        local = init.array(4096)
        init.fill(local, b"x" * 16)
        assert init.call("transfer_sync_write", tname, local, remote, 16) == want, token
    assert target.read(remote, 16) == b"x" * 16
