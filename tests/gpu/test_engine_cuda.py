"""The transfer engine with CUDA device memory: registration, transfers in
every direction within one process and between processes of this host (CUDA
IPC, and staging through pinned host memory with TCP forced), and the
stream-ordered ``*_on_cuda`` calls. Needs a GPU; skipped otherwise."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cuda_env import SKIP_REASON

if SKIP_REASON is not None:
    pytest.skip(SKIP_REASON, allow_module_level=True)

import numpy as np
import torch
from mooncake.engine import TransferEngine

SIZES = [4096, 3 * (1 << 20) + 5]


def new_engine() -> Any:
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    return e


def name_of(e: Any) -> str:
    return f"127.0.0.1:{e.get_rpc_port()}"


def pattern(n: int, seed: int) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.int64) * 131 + seed).remainder(256).to(torch.uint8)


@pytest.fixture
def force_tcp() -> Iterator[Callable[[bool], None]]:
    old = os.environ.get("MC_FORCE_TCP")

    def set_it(on: bool) -> None:
        if on:
            os.environ["MC_FORCE_TCP"] = "1"
        else:
            os.environ.pop("MC_FORCE_TCP", None)

    yield set_it
    set_it(old is not None)


def test_device_memory_registers_like_host_memory() -> None:
    e = new_engine()
    t = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    u = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    assert e.register_memory(t.data_ptr(), t.numel()) == 0
    assert e.register_memory(t.data_ptr() + 4096, 4096) == -7
    assert e.unregister_memory(t.data_ptr()) == 0
    assert e.unregister_memory(t.data_ptr()) == -3
    ptrs = [t.data_ptr(), u.data_ptr()]
    assert e.batch_register_memory(ptrs, [t.numel(), u.numel()]) == 0
    assert e.batch_unregister_memory(ptrs) == 0


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("src_kind", ["cuda", "cpu"])
@pytest.mark.parametrize("dst_kind", ["cuda", "cpu"])
def test_every_direction_within_one_process(n: int, src_kind: str, dst_kind: str) -> None:
    a, b = new_engine(), new_engine()
    src = pattern(n, 3).to(src_kind)
    dst = torch.zeros(n, dtype=torch.uint8, device=dst_kind)
    if src_kind == "cpu":
        src = src.pin_memory() if n > 4096 else src
    torch.cuda.synchronize()
    assert a.register_memory(src.data_ptr(), n) == 0
    assert b.register_memory(dst.data_ptr(), n) == 0
    assert a.transfer_sync_write(name_of(b), src.data_ptr(), dst.data_ptr(), n) == 0
    assert torch.equal(dst.cpu(), src.cpu())
    dst.copy_(pattern(n, 9).to(dst_kind))
    torch.cuda.synchronize()
    assert a.transfer_sync_read(name_of(b), src.data_ptr(), dst.data_ptr(), n) == 0
    assert torch.equal(src.cpu(), pattern(n, 9))


def digest(t: torch.Tensor) -> str:
    torch.cuda.synchronize()
    return hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()


@pytest.mark.parametrize("tcp", [False, True], ids=["same-host", "tcp"])
def test_device_to_device_between_processes(
    tcp: bool, gpu_peer: Callable[..., Any], force_tcp: Callable[[bool], None]
) -> None:
    force_tcp(tcp)
    peer = gpu_peer(env={"MC_FORCE_TCP": "1"} if tcp else {})
    init = peer.call(op="init")
    assert init["rc"] == 0
    name = init["name"]
    e = new_engine()
    for n in SIZES + [64 << 20]:
        theirs = peer.call(op="cuda", size=n)["addr"]
        mine = pattern(n, 5).cuda()
        assert e.register_memory(mine.data_ptr(), n) == 0
        assert e.transfer_sync_write(name, mine.data_ptr(), theirs, n) == 0
        assert peer.call(op="digest", addr=theirs, len=n)["hex"] == digest(mine)
        peer.call(op="fill", addr=theirs, seed=77, len=n)
        assert e.transfer_sync_read(name, mine.data_ptr(), theirs, n) == 0
        assert peer.call(op="digest", addr=theirs, len=n)["hex"] == digest(mine)
        # Host memory of the peer to device memory here, and back.
        host = peer.call(op="host", size=n)["addr"]
        assert e.transfer_sync_read(name, mine.data_ptr(), host, n) == 0
        assert digest(mine) == hashlib.sha256(bytes(n)).hexdigest()
        assert e.unregister_memory(mine.data_ptr()) == 0


def test_on_cuda_calls_wait_for_their_stream() -> None:
    a, b = new_engine(), new_engine()
    n = 16 << 20
    src = torch.zeros(n, dtype=torch.uint8, device="cuda")
    dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    assert a.register_memory(src.data_ptr(), n) == 0
    assert b.register_memory(dst.data_ptr(), n) == 0
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)
        src.fill_(7)
    a.transfer_write_on_cuda(name_of(b), src.data_ptr(), dst.data_ptr(), n, stream.cuda_stream)
    torch.cuda.synchronize()
    assert int(dst.min()) == 7 and int(dst.max()) == 7
    with torch.cuda.stream(stream):
        dst.fill_(9)
    a.batch_transfer_read_on_cuda(
        name_of(b), [src.data_ptr()], [dst.data_ptr()], [n], stream.cuda_stream
    )
    torch.cuda.synchronize()
    assert int(src.min()) == 9 and int(src.max()) == 9


def test_host_buffers_are_unaffected() -> None:
    a, b = new_engine(), new_engine()
    src = np.arange(1 << 20, dtype=np.uint8)
    dst = np.zeros_like(src)
    assert a.register_memory(src.ctypes.data, src.nbytes) == 0
    assert b.register_memory(dst.ctypes.data, dst.nbytes) == 0
    assert a.transfer_sync_write(name_of(b), src.ctypes.data, dst.ctypes.data, src.nbytes) == 0
    assert np.array_equal(src, dst)
