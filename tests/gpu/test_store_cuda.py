"""The store with CUDA memory: device pointers in the zero-copy calls,
CUDA tensors in the tensor calls (upstream's CUDA local copy paths), and
``get_tensor_into_cuda`` / ``batch_get_tensor_into_cuda`` of a dummy
client. Needs a GPU; skipped otherwise."""

from __future__ import annotations

from typing import Any

import pytest
from cuda_env import SKIP_REASON

if SKIP_REASON is not None:
    pytest.skip(SKIP_REASON, allow_module_level=True)

import torch


def test_cuda_local_copy_paths(store: Any, key: Any) -> None:
    """Upstream's test_cuda_local_copy_paths, on this build."""
    t = torch.arange(16, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    assert store.put_tensor(key("p"), t) == 0
    assert store.upsert_tensor(key("u"), t) == 0
    assert torch.equal(store.get_tensor(key("p")), t.cpu())
    assert torch.equal(store.get_tensor(key("u")), t.cpu())
    batch = [
        torch.arange(16, dtype=torch.float32, device="cuda").reshape(4, 4),
        torch.arange(24, dtype=torch.int64, device="cuda").reshape(2, 3, 4),
    ]
    keys = [key("b0"), key("b1")]
    assert store.batch_put_tensor(keys, batch) == [0, 0]
    for k, want in zip(keys, batch, strict=True):
        assert torch.equal(store.get_tensor(k), want.cpu())
    raw = bytes(range(32))
    assert store.put(key("raw"), raw) == 0
    dst = torch.empty(len(raw), dtype=torch.uint8, device="cuda")
    assert store.get_into(key("raw"), dst.data_ptr(), len(raw)) == len(raw)
    assert torch.equal(dst, torch.tensor(list(raw), dtype=torch.uint8, device="cuda"))


def _zero_copy_round_trip(s: Any, key: Any) -> None:
    n = 3 << 20
    src = (torch.arange(n, dtype=torch.int64) % 251).to(torch.uint8).cuda()
    torch.cuda.synchronize()
    assert s.put_from(key("d"), src.data_ptr(), n) == 0
    out = torch.zeros(n, dtype=torch.uint8, device="cuda")
    assert s.get_into(key("d"), out.data_ptr(), n) == n
    assert torch.equal(out, src)
    outs = [torch.zeros(n, dtype=torch.uint8, device="cuda") for _ in range(2)]
    host = torch.zeros(n, dtype=torch.uint8)
    assert s.batch_put_from([key("e"), key("f")], [src.data_ptr()] * 2, [n, n]) == [0, 0]
    got = s.batch_get_into(
        [key("e"), key("f"), key("d")],
        [outs[0].data_ptr(), outs[1].data_ptr(), host.data_ptr()],
        [n, n, n],
    )
    assert got == [n, n, n]
    assert all(torch.equal(o, src) for o in outs) and torch.equal(host, src.cpu())
    # A missing key leaves its device buffer untouched.
    fresh = torch.full((16,), 5, dtype=torch.uint8, device="cuda")
    assert s.get_into(key("missing"), fresh.data_ptr(), 16) < 0
    assert int(fresh.min()) == 5


def test_device_pointers_in_zero_copy_calls(store: Any, key: Any) -> None:
    _zero_copy_round_trip(store, key)


def test_device_pointers_in_zero_copy_calls_of_a_dummy(dummy: Any, key: Any) -> None:
    _zero_copy_round_trip(dummy, key)


def test_register_buffer_accepts_device_memory(store: Any) -> None:
    t = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    assert store.register_buffer(t.data_ptr(), t.numel()) == 0
    assert store.unregister_buffer(t.data_ptr()) == 0


def test_get_tensor_into_cuda_on_a_dummy(dummy: Any, store: Any, key: Any) -> None:
    a = torch.randn(64, 32)
    b = torch.arange(10, dtype=torch.int64)
    assert dummy.put_tensor(key("a"), a) == 0
    assert dummy.put_tensor(key("b"), b) == 0
    da = torch.zeros(64, 32, device="cuda")
    assert dummy.get_tensor_into_cuda(key("a"), da) == a.numel() * 4
    assert torch.equal(da.cpu(), a)
    db = torch.zeros(10, dtype=torch.int64, device="cuda")
    da.zero_()
    assert dummy.batch_get_tensor_into_cuda([key("a"), key("b")], [da, db]) == [a.numel() * 4, 80]
    assert torch.equal(da.cpu(), a) and torch.equal(db.cpu(), b)
    # Upstream's -600 cases: shape or dtype mismatch, a host tensor, a
    # missing key, lists of different lengths, a client that is no dummy.
    assert dummy.get_tensor_into_cuda(key("a"), torch.zeros(32, 64, device="cuda")) == -600
    assert dummy.get_tensor_into_cuda(key("a"), torch.zeros(64, 32, device="cuda").half()) == -600
    assert dummy.get_tensor_into_cuda(key("a"), torch.zeros(64, 32)) == -600
    assert dummy.get_tensor_into_cuda(key("nope"), da) == -600
    assert dummy.batch_get_tensor_into_cuda([key("a")], [da, db]) == [-600]
    assert store.get_tensor_into_cuda(key("a"), da) == -600
    empty = torch.zeros(0, dtype=torch.int64, device="cuda")
    assert dummy.get_tensor_into_cuda(key("b"), empty) == -600
    assert dummy.put_tensor(key("z"), torch.zeros(0, dtype=torch.int64)) == 0
    assert dummy.get_tensor_into_cuda(key("z"), empty) == 0


def test_put_tensor_waits_for_the_current_stream(dummy: Any, key: Any) -> None:
    """Upstream's readiness case: work queued on a producer stream that the
    current stream waits for is in the stored bytes."""
    n = 16 << 20
    t = torch.full((n,), 0x31, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    producer = torch.cuda.Stream()
    with torch.cuda.stream(producer):
        torch.cuda._sleep(100_000_000)
        t.fill_(0xA7)
    torch.cuda.current_stream().wait_stream(producer)
    assert dummy.put_tensor(key("r"), t) == 0
    got = dummy.get_tensor(key("r"))
    assert got is not None and int(got.min()) == 0xA7 and int(got.max()) == 0xA7


def test_get_tensor_into_a_cuda_buffer(store: Any, key: Any) -> None:
    t = torch.randn(8, 8)
    assert store.put_tensor(key("t"), t) == 0
    buf = torch.zeros(304 + t.numel() * 4 + 64, dtype=torch.uint8, device="cuda")
    v = store.get_tensor_into(key("t"), buf.data_ptr(), buf.numel())
    assert v is not None and v.device.type == "cuda"
    assert v.data_ptr() == buf.data_ptr() + 304 and torch.equal(v.cpu(), t)
    buf.zero_()
    got = store.batch_get_tensor_into([key("t")], [buf.data_ptr()], [buf.numel()])
    assert torch.equal(got[0].cpu(), t)
    assert store.get_tensor_into(key("missing"), buf.data_ptr(), buf.numel()) is None


def test_multi_buffer_calls_with_device_buffers(store: Any, key: Any) -> None:
    parts = [torch.full((1000,), i, dtype=torch.uint8, device="cuda") for i in (1, 2)]
    torch.cuda.synchronize()
    ptrs = [[p.data_ptr() for p in parts]]
    assert store.batch_put_from_multi_buffers([key("m")], ptrs, [[1000, 1000]]) == [0]
    outs = [torch.zeros(1000, dtype=torch.uint8, device="cuda") for _ in range(2)]
    got = store.batch_get_into_multi_buffers(
        [key("m")], [[o.data_ptr() for o in outs]], [[1000, 1000]]
    )
    assert got == [2000]
    assert torch.equal(outs[0], parts[0]) and torch.equal(outs[1], parts[1])


def test_get_into_ranges_refuses_device_buffers(store: Any, key: Any) -> None:
    buf = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    assert store.register_buffer(buf.data_ptr(), 4096) == 0
    assert store.put(key("r"), b"x" * 100) == 0
    got = store.get_into_ranges([buf.data_ptr()], [[key("r")]], [[[0]]], [[[0]]], [[[100]]])
    assert got == [[[-600]]]
    assert int(buf.max()) == 0
