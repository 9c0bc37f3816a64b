"""Without a CUDA driver (CI machines): every CUDA entry point returns
upstream's code or raises saying no CUDA driver was found, and host memory
moves as before. Skipped where CUDA is usable (the other modules run)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from cuda_env import HAS_CUDA
from mooncake import engine as me
from mooncake.engine import TransferEngine

pytestmark = pytest.mark.skipif(HAS_CUDA, reason="CUDA is usable here: the CUDA modules run")

NO_DRIVER = "no CUDA driver was found"


@pytest.fixture
def eng() -> Any:
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    return e


def test_engine_cuda_forms_raise_saying_no_driver_was_found(eng: Any) -> None:
    buf = np.zeros(4096, np.uint8)
    assert eng.register_memory(buf.ctypes.data, 4096) == 0
    name = f"127.0.0.1:{eng.get_rpc_port()}"
    a = buf.ctypes.data
    for method, args in [
        ("transfer_write_on_cuda", (name, a, a, 16)),
        ("transfer_read_on_cuda", (name, a, a, 16, 0)),
        ("batch_transfer_write_on_cuda", (name, [a], [a], [16])),
        ("batch_transfer_read_on_cuda", (name, [a], [a], [16], 0, "")),
    ]:
        with pytest.raises(RuntimeError, match=NO_DRIVER):
            getattr(eng, method)(*args)


def test_engine_refuses_cuda_locations_with_upstreams_code(
    eng: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mooncake.engine")
    other = np.zeros(8192, np.uint8)
    a = other.ctypes.data
    assert eng.register_memory(a, 4096, "cuda:0") == -1
    assert any(NO_DRIVER in r.getMessage() for r in caplog.records)
    assert eng.batch_register_memory([a, a + 4096], [4096, 4096], "cuda:1") == -1
    # Host memory at a host location is unchanged.
    assert eng.register_memory(a, 4096, "cpu:0") == 0
    assert eng.unregister_memory(a) == 0
    assert me.SUPPORT_CUDA is False


def test_host_memory_still_moves(eng: Any) -> None:
    peer = TransferEngine()
    assert peer.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    src = np.arange(1 << 20, dtype=np.uint8)
    dst = np.zeros_like(src)
    assert eng.register_memory(src.ctypes.data, src.nbytes) == 0
    assert peer.register_memory(dst.ctypes.data, dst.nbytes) == 0
    name = f"127.0.0.1:{peer.get_rpc_port()}"
    assert eng.transfer_sync_write(name, src.ctypes.data, dst.ctypes.data, src.nbytes) == 0
    assert np.array_equal(src, dst)


def test_store_cuda_reads_return_upstreams_code(
    store: Any, key: Any, caplog: pytest.LogCaptureFixture
) -> None:
    torch = pytest.importorskip("torch")
    caplog.set_level(logging.INFO, logger="mooncake.store")
    t = torch.zeros(4)
    assert store.put_tensor(key("t"), torch.ones(4)) == 0
    assert store.get_tensor_into_cuda(key("t"), t) == -600
    assert any(NO_DRIVER in r.getMessage() for r in caplog.records)
    assert store.batch_get_tensor_into_cuda([key("t"), key("u")], [t, t]) == [-600, -600]
    assert store.batch_get_tensor_into_cuda([key("t")], [t, t]) == [-600]
    assert store.batch_get_tensor_into_cuda([], []) == []
    assert torch.equal(t, torch.zeros(4)), "nothing written"


def test_store_zero_copy_with_host_pointers_is_unchanged(store: Any, key: Any) -> None:
    src = np.arange(4096, dtype=np.uint8)
    out = np.zeros_like(src)
    assert store.put_from(key("a"), src.ctypes.data, src.nbytes) == 0
    assert store.get_into(key("a"), out.ctypes.data, out.nbytes) == src.nbytes
    assert np.array_equal(src, out)
    outs = [np.zeros_like(src), np.zeros_like(src)]
    assert store.batch_put_from([key("b"), key("c")], [src.ctypes.data] * 2, [4096, 4096]) == [0, 0]
    got = store.batch_get_into([key("b"), key("c")], [o.ctypes.data for o in outs], [4096, 4096])
    assert got == [4096, 4096] and all(np.array_equal(o, src) for o in outs)
