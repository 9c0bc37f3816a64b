"""Bad input: each case returns upstream's failure value, logs one clear line
on the ``mooncake.engine`` logger, and writes nothing out of bounds."""

from __future__ import annotations

import signal
import socket
import threading
import time
from typing import Any, NamedTuple

import numpy as np
import pytest
from conftest import Peer, engine_lines, init_local
from mooncake.engine import TransferEngine, TransferOpcode

P2P = "P2PHANDSHAKE"


def one_line(log: pytest.LogCaptureFixture, *words: str) -> str:
    """The log has exactly one new line, and it contains ``words``."""
    lines = engine_lines(log)
    assert len(lines) == 1, lines
    for w in words:
        assert w in lines[0], lines[0]
    log.clear()
    return lines[0]


def registered_engine(nbytes: int, fill: int = 0) -> tuple[TransferEngine, np.ndarray]:
    """An initialized engine and its registered ``nbytes`` buffer, every byte ``fill``."""
    engine = TransferEngine()
    init_local(engine, P2P)
    buf = np.full(nbytes, fill, np.uint8)
    assert engine.register_memory(buf.ctypes.data, nbytes) == 0
    return engine, buf


def silent_listener() -> socket.socket:
    """A loopback socket that accepts connections and never answers."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    return silent


class Pair(NamedTuple):
    """An initiator engine and a target peer: the engine's registered 64 KiB
    buffer and its address, the target's name, and the address of the
    target's registered 64 KiB in the middle of a 192 KiB array."""

    engine: TransferEngine
    buf: np.ndarray
    target: Peer
    tname: str
    remote: int
    addr: int


def make_pair(peers: Any, env: dict[str, str] | None = None) -> Pair:
    """A ``Pair`` whose target peer is started with ``env``."""
    target: Peer = peers(env)
    tname = target.init(P2P)
    whole = target.array(3 << 16, register=False)
    remote = whole + (1 << 16)
    assert target.call("register_memory", remote, 1 << 16) == 0
    engine, buf = registered_engine(1 << 16, 0xAB)
    return Pair(engine, buf, target, tname, remote, buf.ctypes.data)


@pytest.fixture
def pair(peers: Any) -> Pair:
    """``make_pair(peers)``."""
    return make_pair(peers)


def test_calls_before_initialize(engine_log: pytest.LogCaptureFixture) -> None:
    e = TransferEngine()
    buf = np.zeros(4096, np.uint8)
    assert e.transfer_sync_write("127.0.0.1:1", buf.ctypes.data, 0, 16) == -1
    one_line(engine_log, "transfer_sync_write", "not initialized")
    assert e.batch_transfer_sync_read("127.0.0.1:1", [buf.ctypes.data], [0], [16]) == -1
    one_line(engine_log, "batch_transfer_sync_read", "not initialized")
    assert e.batch_transfer_async_write("127.0.0.1:1", [buf.ctypes.data], [0], [16]) == 0
    one_line(engine_log, "batch_transfer_async_write", "not initialized")
    assert e.get_rpc_port() == -1
    one_line(engine_log, "get_rpc_port", "not initialized")
    assert e.send_probe("127.0.0.1:1") == -1
    one_line(engine_log, "send_probe", "not initialized")
    assert bytes(buf[:16]) == bytes(16)


def test_initialize_twice(engine_log: pytest.LogCaptureFixture) -> None:
    e = TransferEngine()
    assert e.initialize("127.0.0.1", P2P, "tcp", "") == 0
    port = e.get_rpc_port()
    assert e.initialize("127.0.0.1", P2P, "tcp", "") == -1
    one_line(engine_log, "initialize", "already initialized")
    assert e.get_rpc_port() == port


def test_local_port_already_in_use(
    engine_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With legacy port binding the port in local_hostname is the RPC port."""
    monkeypatch.setenv("MC_LEGACY_RPC_PORT_BINDING", "1")
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        e = TransferEngine()
        assert e.initialize(f"127.0.0.1:{port}", "etcd://127.0.0.1:1", "tcp", "") == -1
        one_line(engine_log, "initialize", f":{port}", "in use")
        # The engine stays usable: a free port then works.
        monkeypatch.delenv("MC_LEGACY_RPC_PORT_BINDING")
        assert e.initialize("127.0.0.1", P2P, "tcp", "") == 0
    finally:
        holder.close()


def test_bad_metadata_and_hostnames(engine_log: pytest.LogCaptureFixture) -> None:
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "redis://127.0.0.1:1", "tcp", "") == -1
    one_line(engine_log, "initialize", "redis")
    assert e.initialize("127.0.0.1:notaport", P2P, "tcp", "") == -1
    one_line(engine_log, "initialize", "invalid port")
    assert e.initialize("127.0.0.1", "http://127.0.0.1:1/metadata", "tcp", "") == -1
    one_line(engine_log, "initialize", "metadata")


def test_unknown_and_unreachable_targets(pair: Any, engine_log: pytest.LogCaptureFixture) -> None:
    engine, _, _, _, _, addr = pair
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    cases = [
        ("no-port-name", "host:rpc_port"),
        ("no.such.host.invalid:5000", "does not resolve"),
        (f"127.0.0.1:{dead_port}", "cannot connect"),
    ]
    for name, why in cases:
        t0 = time.monotonic()
        assert engine.transfer_sync_write(name, addr, 0x1000, 16) == -1
        assert time.monotonic() - t0 < 10
        one_line(engine_log, "transfer_sync_write", why)
        assert engine.batch_transfer_async_read(name, [addr], [0x1000], [16]) == 0
        one_line(engine_log, "batch_transfer_async_read", why)
        assert engine.transfer_submit_write(name, addr, 0x1000, 16) == 0
        one_line(engine_log, "transfer_submit_write", why)
    assert engine.send_probe(f"127.0.0.1:{dead_port}") == -102
    one_line(engine_log, "send_probe")
    assert engine.get_first_buffer_address(f"127.0.0.1:{dead_port}") == 0
    one_line(engine_log, "get_first_buffer_address")


def test_unknown_target_on_the_metadata_server(
    shared_master: Any, engine_log: pytest.LogCaptureFixture
) -> None:
    e = TransferEngine()
    assert e.initialize("127.0.0.1:33001", shared_master.metadata_url, "tcp", "") == 0
    buf = np.zeros(64, np.uint8)
    assert e.register_memory(buf.ctypes.data, 64) == 0
    assert e.transfer_sync_write("127.0.0.1:1", buf.ctypes.data, 0, 16) == -1
    one_line(engine_log, "transfer_sync_write", "no engine of this name")


def test_a_silent_target_times_out(
    engine_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target that accepts and never answers: the call returns -1 within
    MC_TRANSFER_TIMEOUT, not a hang."""
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "2")
    silent = silent_listener()
    e, buf = registered_engine(64)
    t0 = time.monotonic()
    assert (
        e.transfer_sync_write(f"127.0.0.1:{silent.getsockname()[1]}", buf.ctypes.data, 0, 16) == -1
    )
    assert time.monotonic() - t0 < 10
    one_line(engine_log, "transfer_sync_write")
    silent.close()


@pytest.mark.parametrize("tcp", [False, True], ids=["same-host", "tcp"])
def test_peer_ranges_outside_registered_memory(
    peers: Any, engine_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tcp: bool
) -> None:
    """Outside every region, or running past a region's end (even into
    memory right after it): -1, the target logs why, and no byte outside the
    region changes. Reads of such ranges return nothing."""
    if tcp:
        monkeypatch.setenv("MC_FORCE_TCP", "1")
    else:
        monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    engine, buf, target, tname, remote, addr = make_pair(
        peers, {"MC_FORCE_TCP": "1"} if tcp else {}
    )
    whole = remote - (1 << 16)
    engine_log.clear()
    bad = [
        (remote + (1 << 16) - 8, 16),  # runs past the end
        (remote - 8, 16),  # starts before the region
        (whole + 5, 1),  # outside every region
        (8, 8),  # nowhere
    ]
    for peer_addr, n in bad:
        assert engine.transfer_sync_write(tname, addr, peer_addr, n) == -1
        one_line(engine_log, "transfer_sync_write", "refused", tname)
        assert (
            engine.batch_transfer_sync_write(tname, [addr, addr], [remote, peer_addr], [8, n]) == -1
        )
        one_line(engine_log, "batch_transfer_sync_write", "refused")
        assert engine.transfer_sync_read(tname, addr, peer_addr, n) == -1
        one_line(engine_log, "transfer_sync_read", "refused")
    assert target.read(whole, 3 << 16) == bytes(3 << 16)
    assert bytes(buf) == bytes([0xAB]) * (1 << 16)
    logs = target.logs()
    assert sum("refused a write" in m for m in logs) == 8, logs
    assert sum("refused a read" in m for m in logs) == 4, logs
    # The connection stays usable after refusals.
    assert engine.transfer_sync_write(tname, addr, remote, 1 << 16) == 0
    assert target.read(remote, 4) == b"\xab" * 4


def test_local_buffers_must_be_registered(pair: Any, engine_log: pytest.LogCaptureFixture) -> None:
    engine, buf, target, tname, remote, _ = pair
    other = np.zeros(4096, np.uint8)
    assert engine.transfer_sync_write(tname, other.ctypes.data, remote, 16) == -1
    one_line(engine_log, "transfer_sync_write", "local buffer", "outside")
    end = buf.ctypes.data + buf.nbytes
    assert engine.transfer_sync_read(tname, end - 8, remote, 16) == -1
    one_line(engine_log, "transfer_sync_read", "runs past the end")
    assert target.read(remote, 16) == bytes(16)


def test_lengths_that_overflow_and_empty_batches(
    pair: Any, engine_log: pytest.LogCaptureFixture
) -> None:
    engine, _, target, tname, remote, a = pair
    big = 1 << 63
    assert engine.batch_transfer_sync_write(tname, [a, a], [remote, remote], [big, big]) == -1
    one_line(engine_log, "batch_transfer_sync_write", "2**64")
    assert engine.batch_transfer_async_read(tname, [a, a], [remote, remote], [big, big]) == 0
    one_line(engine_log, "batch_transfer_async_read", "2**64")
    assert engine.transfer_sync_write(tname, a, (1 << 64) - 8, 16) == -1
    one_line(engine_log, "transfer_sync_write", "address space")
    # Empty batches and zero-length items succeed and move nothing.
    assert engine.batch_transfer_sync_write(tname, [], [], []) == 0
    assert engine.batch_transfer_sync_read(tname, [], [], []) == 0
    assert engine.transfer_sync_write(tname, a, remote, 0) == 0
    assert engine.batch_transfer_sync_write(tname, [a, a], [remote, 8], [0, 0]) == 0
    assert engine_lines(engine_log) == []
    assert target.read(remote, 16) == bytes(16)


def test_list_length_mismatch_in_every_batch_form(
    pair: Any, engine_log: pytest.LogCaptureFixture
) -> None:
    engine, _, target, tname, remote, a = pair
    sync_forms = [
        ("batch_transfer_sync_write", ()),
        ("batch_transfer_sync_read", ()),
        ("batch_transfer_sync", (TransferOpcode.Write,)),
    ]
    async_forms = [
        ("batch_transfer_async_write", ()),
        ("batch_transfer_async_read", ()),
        ("batch_transfer_async", (TransferOpcode.Read,)),
    ]
    shapes = [([a], [], [16]), ([a, a], [remote], [16, 16]), ([a], [remote], [])]
    for lists in shapes:
        for name, extra in sync_forms:
            assert getattr(engine, name)(tname, *lists, *extra) == -1
            one_line(engine_log, name, "different lengths")
        for name, extra in async_forms:
            assert getattr(engine, name)(tname, *lists, *extra) == 0
            one_line(engine_log, name, "different lengths")
    assert engine.batch_register_memory([a], []) == -1
    one_line(engine_log, "batch_register_memory", "different lengths")
    for name in ("batch_transfer_write_on_cuda", "batch_transfer_read_on_cuda"):
        with pytest.raises(RuntimeError, match="different lengths"):
            getattr(engine, name)(tname, [a], [], [16])
        one_line(engine_log, name, "different lengths")
    assert target.read(remote, 16) == bytes(16)


def test_registration_codes(engine_log: pytest.LogCaptureFixture) -> None:
    """-1 zero length or unmapped memory, -7 overlap, -3 unknown address;
    regions that touch are fine."""
    e = TransferEngine()
    buf = np.zeros(3 * 4096, np.uint8)
    a = buf.ctypes.data
    assert e.register_memory(a, 4096) == 0
    assert e.register_memory(a + 4096, 4096) == 0  # touches
    assert e.register_memory(a + 100, 10) == -7
    one_line(engine_log, "register_memory", "overlaps")
    assert e.register_memory(a + 8192, 0) == -1
    one_line(engine_log, "register_memory", "zero-length")
    assert e.register_memory(4096, 4096) == -1
    one_line(engine_log, "register_memory", "not mapped")
    assert e.batch_register_memory([a + 8192, a + 100], [4096, 4096]) == -7
    one_line(engine_log, "batch_register_memory", "overlaps")
    assert e.unregister_memory(a + 1) == -3
    one_line(engine_log, "unregister_memory", "no registered region")
    assert e.batch_unregister_memory([a, a + 1, a + 4096]) == -3
    one_line(engine_log, "batch_unregister_memory", "no registered region")
    assert e.unregister_memory(a) == -3  # the batch unregistered it
    one_line(engine_log, "unregister_memory")
    assert e.free_managed_buffer(a + 8192, 4096) == -3
    one_line(engine_log, "free_managed_buffer", "not a managed buffer")
    assert e.write_bytes_to_buffer(a, b"abc", 3) == -1
    one_line(engine_log, "write_bytes_to_buffer", "outside")
    with pytest.raises(ValueError, match="outside"):
        e.read_bytes_from_buffer(a, 3)
    one_line(engine_log, "read_bytes_from_buffer")
    assert bytes(buf[:3]) == bytes(3)


def test_unregister_memory_in_use(
    engine_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory a transfer is still using cannot be unregistered (-4); once
    the transfer ends, it can. The transfer here waits on a target that
    accepted the connection and never answers."""
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "3")
    silent = silent_listener()
    e, buf = registered_engine(4096)
    a = buf.ctypes.data
    result: list[int] = []
    t = threading.Thread(
        target=lambda: result.append(
            e.transfer_sync_write(f"127.0.0.1:{silent.getsockname()[1]}", a, 0, 16)
        )
    )
    t.start()
    conn, _ = silent.accept()  # the transfer is in flight, its buffer pinned
    assert e.unregister_memory(a) == -4
    one_line(engine_log, "unregister_memory", "in use")
    t.join(30)
    assert result == [-1]
    engine_log.clear()
    assert e.unregister_memory(a) == 0
    conn.close()
    silent.close()


def test_target_dies_mid_batch(
    peers: Any, monkeypatch: pytest.MonkeyPatch, engine_log: pytest.LogCaptureFixture
) -> None:
    """Batches keep running while the target is killed: the one in flight
    (and every later one) fails with -1, an async batch reports -1, and no
    call hangs."""
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    target: Peer = peers({"MC_FORCE_TCP": "1"})
    tname = target.init(P2P)
    size = 64 << 20
    remote = target.array(size)
    e, buf = registered_engine(size, 1)
    a = buf.ctypes.data
    blk = 1 << 20
    srcs = [a + i * blk for i in range(64)]
    dsts = [remote + i * blk for i in range(64)]
    rcs: list[int] = []
    started = threading.Event()

    def loop() -> None:
        while True:
            rc = e.batch_transfer_sync_write(tname, srcs, dsts, [blk] * 64)
            rcs.append(rc)
            started.set()
            if rc != 0 or len(rcs) > 10000:
                return

    engine_log.clear()
    t = threading.Thread(target=loop)
    t.start()
    assert started.wait(60)
    target.proc.send_signal(signal.SIGKILL)
    t.join(60)
    assert not t.is_alive()
    assert rcs[0] == 0 and rcs[-1] == -1
    one_line(engine_log, "batch_transfer_sync_write", tname)
    bid = e.batch_transfer_async_write(tname, srcs, dsts, [blk] * 64)
    if bid != 0:
        assert e.get_batch_transfer_status([bid]) == -1
