"""Byte compatibility with upstream Mooncake 0.3.13: object format and key names.

``crates/tensor/tests/data/upstream_golden.json`` holds the raw objects the
upstream wheel stored for a fixed script (``benchmarks/upstream_tensor_golden.py``).
Copying them byte for byte into our store must make them readable through
every tensor read path, and running the same script against our store must
store exactly the same keys and bytes.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from conftest import stored_keys
from mooncake.store import DP, EP, PP, TP, ParallelAxis, ReadTarget, TensorParallelism

torch = pytest.importorskip("torch")

GOLDEN = Path(__file__).resolve().parents[2] / "crates/tensor/tests/data/upstream_golden.json"


def golden() -> dict[str, bytes]:
    data = json.loads(GOLDEN.read_text())
    return {k: bytes.fromhex(v) for k, v in data["objects"].items()}


def P(*axes):
    return TensorParallelism(list(axes))


def test_upstream_objects_read_back(tstore, key):
    prefix = key("up") + "/"
    for k, v in golden().items():
        assert tstore.put(prefix + k, v) == 0, k
    g = lambda name: prefix + name
    full = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    assert torch.equal(tstore.get_tensor(g("T")), torch.arange(12.0).reshape(3, 4))
    z = tstore.get_tensor(g("Z"))
    assert z.shape == () and z.item() == 3.5
    assert torch.equal(
        tstore.get_tensor(g("BF")), torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    )
    assert torch.equal(tstore.get_tensor(g("BOOL")), torch.tensor([True, False, True]))
    f8 = tstore.get_tensor(g("F8"))
    assert f8.dtype == torch.float8_e4m3fn and torch.equal(
        f8.float(), torch.arange(6.0).reshape(2, 3)
    )
    u16 = tstore.get_tensor(g("U16"))
    assert u16.dtype == torch.uint16 and u16.to(torch.int32).tolist() == list(range(6))
    assert torch.equal(tstore.get_tensor_with_parallelism(g("A"), ReadTarget(mode="full")), full)
    assert torch.equal(tstore.get_tensor_with_tp(g("A"), 1, 4), full[1:2])
    assert torch.equal(tstore.get_tensor_with_tp(g("G"), 0, 2), full[:, 0:3])
    assert torch.equal(tstore.get_tensor_with_parallelism(g("G"), ReadTarget(mode="full")), full)
    got = tstore.get_tensor_with_parallelism(g("B"), ReadTarget("shard", P(DP(1, 2), TP(1, 3, 1))))
    assert torch.equal(got, full[:, 2:4])
    got = tstore.get_tensor_with_parallelism(g("C"), ReadTarget("shard", P(EP(1, 2, 7))))
    assert torch.equal(got, full)
    got = tstore.get_tensor_with_parallelism(g("D"), ReadTarget("shard", P(PP(0, 4, 2), DP(1, 2))))
    assert torch.equal(got, full)
    got = tstore.get_tensor_with_parallelism(g("W"), ReadTarget("shard", P(TP(1, 2, 1))))
    assert torch.equal(got, full[:, 3:6])
    assert torch.equal(tstore.get_tensor_with_parallelism(g("X"), ReadTarget(mode="full")), full)
    got = tstore.get_tensor_with_parallelism(
        g("K2"), ReadTarget("as_stored", P(DP(0, 2), TP(1, 2, 1)))
    )
    assert torch.equal(got, full[:, 3:6])
    buf = torch.zeros(4096, dtype=torch.uint8)
    out = tstore.get_tensor_into(g("T"), buf.data_ptr(), 4096)
    assert torch.equal(out, torch.arange(12.0).reshape(3, 4))
    assert bytes(buf[:352].numpy()) == golden()["T"]


def upstream_axis(kind, rank, size, split_dim=None, expert_id=None, stage_id=None):
    """An axis built the way upstream callers must: no-arg constructor + attributes."""
    a = ParallelAxis()
    a.kind, a.rank, a.size = kind, rank, size
    a.split_dim, a.expert_id, a.stage_id = split_dim, expert_id, stage_id
    return a


def test_our_writes_store_upstream_bytes(tstore, key, shared_master):
    """The golden script's writes, through our Python surface, store identical objects."""
    prefix = key("ours") + "/"
    s = tstore
    full = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    g = lambda name: prefix + name
    par = lambda *a: P(*a)
    ax = upstream_axis
    assert s.put_tensor(g("T"), torch.arange(12, dtype=torch.float32).reshape(3, 4)) == 0
    assert s.put_tensor(g("Z"), torch.tensor(3.5)) == 0
    assert s.put_tensor(g("BF"), torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)) == 0
    assert s.put_tensor(g("BOOL"), torch.tensor([True, False, True])) == 0
    f8 = torch.arange(6, dtype=torch.float32).reshape(2, 3).to(torch.float8_e4m3fn)
    assert s.put_tensor(g("F8"), f8) == 0
    assert s.put_tensor(g("U16"), torch.arange(6, dtype=torch.int32).to(torch.uint16)) == 0
    assert s.put_tensor_with_parallelism(g("A"), full[2:4], par(ax("tp", 1, 2, 0))) == 0
    assert s.put_tensor_with_parallelism(g("A"), full[0:2], par(ax("tp", 0, 2, 0))) == 0
    assert s.put_tensor_with_parallelism(g("B"), full, par(ax("tp", 1, 3, 1), ax("dp", 1, 2))) == 0
    assert s.put_tensor_with_parallelism(g("C"), full, par(ax("ep", 1, 2, expert_id=7))) == 0
    pp_dp = par(ax("pp", 0, 4, stage_id=2), ax("dp", 1, 2))
    assert s.put_tensor_with_parallelism(g("D"), full, pp_dp) == 0
    wp = types.SimpleNamespace(rank=1, size=2, split_dim=1)
    assert s.put_tensor_with_parallelism(g("W"), full, writer_partition=wp) == 0
    assert s.put_tensor_with_tp(g("G"), full, 1, 3, 1) == 0
    assert s.put_tensor_with_tp(g("H"), full) == 0
    from mooncake.store import _serialize_tensor

    header, _ptr, n, owner = _serialize_tensor(full)
    buf = torch.empty(304 + n, dtype=torch.uint8)
    buf[:304] = torch.frombuffer(bytearray(header), dtype=torch.uint8)
    buf[304:] = owner.reshape(-1).view(torch.uint8)
    tp_par = par(ax("tp", 1, 2, 0))
    assert s.put_tensor_with_parallelism_from(g("X"), buf.data_ptr(), buf.numel(), tp_par) == 0
    assert s.put_tensor_with_parallelism(g("K2"), full, par(ax("dp", 0, 2), ax("tp", 1, 2, 1))) == 0
    want = golden()
    ours = [k[len(prefix) :] for k in stored_keys(shared_master, prefix)]
    # every upstream object with upstream's bytes; a set with more than a
    # single TP axis also gets a parallelism manifest whose layout record
    # follows upstream's 96 bytes (upstream readers ignore the rest)
    assert set(want) <= set(ours)
    assert all(k.endswith("__parallelism_manifest") for k in set(ours) - set(want))
    for k, v in want.items():
        got = s.get(prefix + k)
        if len(got) != len(v):
            assert k.endswith("__parallelism_manifest") and got[96:100] == b"LAYT", k
        assert got[: len(v)] == v, k
