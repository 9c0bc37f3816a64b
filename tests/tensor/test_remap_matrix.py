"""Every cell of the source-layout to target-layout matrix, checked against torch slicing.

A stored set is a set of boxes of the global tensor (its layout axes, TP and
EP with a split dim, say which); scope axes (DP, PP) only say which stored set
an object belongs to. Every target, for 1-D, 2-D and 3-D tensors of every
stored dtype, must read back exactly the torch slice of the original tensor
(compared byte for byte), or fail naming the key when no stored set covers it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import rpcs
from helpers.tensor_dtypes import tensor_dtypes
from helpers.tensor_layouts import Spec, box, sample, writer_input, writers
from mooncake.store import DP, EP, PP, TP, ParallelAxis, ReadTarget, TensorParallelism

torch = pytest.importorskip("torch")

SHAPES = {1: (32,), 2: (16, 8), 3: (8, 4, 8)}


def sources(ndim: int) -> dict[str, list[Spec]]:
    last = ndim - 1
    out: dict[str, list[Spec]] = {
        "TP": [("tp", 4, 0)],
        "EP": [("ep", 4, 0)],
        "PP": [("pp", 1, 2, 1)],
        "DP": [("dp", 2)],
        "PP,TP": [("pp", 1, 2, 1), ("tp", 4, 0)],
        "DP,TP": [("dp", 2), ("tp", 2, 0)],
        "DP,PP,TP": [("dp", 2), ("pp", 1, 2, 1), ("tp", 4, last)],
    }
    if ndim >= 2:
        out["DP,PP,EP,TP"] = [("dp", 2), ("pp", 1, 2, 1), ("ep", 2, 0), ("tp", 2, 1)]
        out["EP,TP"] = [("ep", 4, 0), ("tp", 2, 1)]
    return out


def targets(ndim: int) -> dict[str, ReadTarget]:
    last = ndim - 1

    def shard(*axes: ParallelAxis) -> ReadTarget:
        return ReadTarget("shard", TensorParallelism(list(axes)))

    out = {
        "TP": shard(TP(1, 2, last)),
        "EP": shard(EP(1, 2, expert_id=1, split_dim=0)),
        "PP": shard(PP(1, 2, stage_id=1)),
        "DP": shard(DP(1, 2)),
        "PP,TP": shard(PP(1, 2, 1), TP(3, 4, 0)),
        "DP,TP": shard(DP(0, 2), TP(1, 4, last)),
        "DP,PP,TP": shard(DP(1, 2), PP(1, 2, 1), TP(0, 2, 0)),
        "full": ReadTarget("full"),
    }
    if ndim >= 2:
        out["DP,PP,EP,TP"] = shard(DP(0, 2), PP(1, 2, 1), EP(1, 4, 1, split_dim=0), TP(1, 2, 1))
        out["EP,TP"] = shard(EP(0, 2, 0, split_dim=0), TP(1, 4, 1))
    return out


def as_bytes(t: Any) -> bytes:
    return bytes(t.contiguous().view(torch.uint8).reshape(-1).tolist()) if t.numel() else b""


def store_layout(store: Any, key: str, t: Any, layout: list[Spec]) -> list[list[ParallelAxis]]:
    ws = writers(layout)
    for axes in ws:
        rc = store.put_tensor_with_parallelism(key, writer_input(t, axes), TensorParallelism(axes))
        assert rc == 0, (key, axes, rc)
    return ws


def put_row_shards(store: Any, key: str, t: Any, n: int) -> None:
    """Store ``t`` as ``n`` TP shards along dim 0, each writer putting its own rows."""
    rows = t.shape[0] // n
    for r in range(n):
        shard = t[r * rows : (r + 1) * rows]
        assert store.put_tensor_with_parallelism(key, shard, TensorParallelism([TP(r, n, 0)])) == 0


def expected(t: Any, target: ReadTarget) -> Any:
    if target.mode == "full" or target.parallelism is None:
        return t
    return box(t, target.parallelism.axes)


@pytest.mark.parametrize("ndim", [1, 2, 3])
@pytest.mark.parametrize("dtype", tensor_dtypes(), ids=str)
def test_every_cell(tstore, key, ndim, dtype):
    shape = SHAPES[ndim]
    t = sample(shape, dtype, seed=ndim)
    tgts = targets(ndim)
    failures = []
    cells = 0
    for src_name, layout in sources(ndim).items():
        k = key(f"m{ndim}_{src_name.replace(',', '_')}")
        ws = store_layout(tstore, k, t, layout)
        cases = dict(tgts)
        cases["as_stored"] = ReadTarget("as_stored", TensorParallelism(ws[-1]))
        for tgt_name, target in cases.items():
            want = box(t, ws[-1]) if tgt_name == "as_stored" else expected(t, target)
            got = tstore.get_tensor_with_parallelism(k, target)
            cells += 1
            if got is None:
                failures.append(f"{src_name} -> {tgt_name}: None")
            elif got.dtype != dtype or tuple(got.shape) != tuple(want.shape):
                failures.append(f"{src_name} -> {tgt_name}: {got.dtype} {tuple(got.shape)}")
            elif as_bytes(got) != as_bytes(want):
                failures.append(f"{src_name} -> {tgt_name}: wrong bytes")
    assert not failures, f"{len(failures)} of {cells} cells wrong: {failures}"


def test_batch_and_into_forms_match_single_reads(tstore, key):
    """One batched call for every target of every source, then the same into buffers."""
    t = sample(SHAPES[2], torch.bfloat16, seed=5)
    keys, tgts, wants = [], [], []
    for src_name, layout in sources(2).items():
        k = key(f"b_{src_name.replace(',', '_')}")
        store_layout(tstore, k, t, layout)
        for target in targets(2).values():
            keys.append(k)
            tgts.append(target)
            wants.append(expected(t, target))
    r0 = rpcs(tstore)
    got = tstore.batch_get_tensor_with_parallelism(keys, tgts)
    assert [as_bytes(g) for g in got] == [as_bytes(w) for w in wants]
    # one lookup per probe round for the whole batch, whatever its length
    assert rpcs(tstore) - r0 <= 3, (rpcs(tstore) - r0, len(keys))
    size = 304 + t.numel() * 2
    bufs = [torch.zeros(size, dtype=torch.uint8) for _ in keys]
    got = tstore.batch_get_tensor_with_parallelism_into(
        keys, [b.data_ptr() for b in bufs], [size] * len(keys), tgts
    )
    assert [as_bytes(g) for g in got] == [as_bytes(w) for w in wants]
    for g, b in zip(got, bufs, strict=True):
        assert g.data_ptr() == b.data_ptr() + 304
    one = tstore.get_tensor_with_parallelism_into(keys[0], bufs[0].data_ptr(), size, tgts[0])
    assert as_bytes(one) == as_bytes(wants[0])


def test_wrong_split_dim_reads_the_requested_box(tstore, key):
    """A set stored as TP=4 on dim 0 read as TP(1, 2, 1) is the 64x24 slice, not a stored shard."""
    t = torch.arange(64 * 48, dtype=torch.float32).reshape(64, 48)
    k = key("wrong")
    put_row_shards(tstore, k, t, 4)
    got = tstore.get_tensor_with_parallelism(k, ReadTarget("shard", [TP(1, 2, 1)]))
    assert got.shape == (64, 24)
    assert torch.equal(got, t[:, 24:48])
    # the legacy wrapper keeps taking the split dim from storage
    assert torch.equal(tstore.get_tensor_with_tp(k, 1, 2, 1), t[32:64])


def test_partial_set_serves_only_what_it_covers(tstore, key, logs):
    t = torch.arange(16 * 8, dtype=torch.int32).reshape(16, 8)
    k = key("partial")
    for r in (0, 1, 3):
        assert (
            tstore.put_tensor_with_parallelism(k, t, TensorParallelism([DP(0, 1), TP(r, 4, 0)]))
            == 0
        )
    got = tstore.get_tensor_with_parallelism(k, ReadTarget("shard", [TP(0, 2, 0)]))
    assert torch.equal(got, t[:8])
    assert tstore.get_tensor_with_parallelism(k, ReadTarget("shard", [TP(1, 2, 0)])) is None
    rec = logs.expect("get_tensor_with_parallelism", k, f"{k}__dp_0of1__tp_2of4_sd0", "missing")
    assert "full" not in rec.getMessage()
    assert tstore.get_tensor_with_parallelism(k, ReadTarget("full")) is None
    logs.expect("get_tensor_with_parallelism", k, "missing")


def test_full_object_beside_shards_is_preferred(tstore, key):
    """A shard read that one stored object covers reads that object only."""
    t = torch.arange(16 * 8, dtype=torch.float32).reshape(16, 8)
    k = key("both")
    assert tstore.put_tensor(k, t) == 0
    for r in range(4):
        assert (
            tstore.put_tensor_with_parallelism(k, t, TensorParallelism([DP(0, 1), TP(r, 4, 1)]))
            == 0
        )
    # break the shard set: a read that used it would fail
    assert tstore.remove(f"{k}__dp_0of1__tp_1of4_sd1", True) == 0
    got = tstore.get_tensor_with_parallelism(k, ReadTarget("shard", [TP(1, 2, 1)]))
    assert torch.equal(got, t[:, 4:8])


def test_bad_targets_fail_with_reason_and_write_nothing(tstore, key, logs):
    t = torch.arange(16 * 8, dtype=torch.float32).reshape(16, 8)
    k = key("bad")
    put_row_shards(tstore, k, t, 2)
    size = 304 + t.numel() * 4
    buf = torch.full((size,), 0xAB, dtype=torch.uint8)
    # a split the extent does not divide
    target = ReadTarget("shard", [TP(0, 3, 0)])
    assert tstore.get_tensor_with_parallelism_into(k, buf.data_ptr(), size, target) is None
    logs.expect("get_tensor_with_parallelism_into", k, "3 equal parts")
    assert bool((buf == 0xAB).all())
    # a split dim the tensor does not have
    assert tstore.get_tensor_with_parallelism(k, ReadTarget("shard", [TP(0, 2, 2)])) is None
    logs.expect("get_tensor_with_parallelism", k, "split_dim 2")
    # an expert the stored set does not hold (an EP axis without split dim)
    k2 = key("expert")
    assert (
        tstore.put_tensor_with_parallelism(k2, t, TensorParallelism([EP(0, 2, expert_id=3)])) == 0
    )
    target = ReadTarget("full", [EP(0, 2, expert_id=4)])
    assert tstore.get_tensor_with_parallelism_into(k2, buf.data_ptr(), size, target) is None
    logs.expect("get_tensor_with_parallelism_into", k2, "expert 3, not 4")
    assert bool((buf == 0xAB).all())
    assert torch.equal(tstore.get_tensor_with_parallelism(k2, ReadTarget("full", [EP(0, 2, 3)])), t)
    # a pipeline re-partitioned to other stages reads the same tensor
    k4 = key("stage")
    assert (
        tstore.put_tensor_with_parallelism(k4, t, TensorParallelism([PP(0, 2, 0), TP(0, 2, 0)]))
        == 0
    )
    assert (
        tstore.put_tensor_with_parallelism(k4, t, TensorParallelism([PP(0, 2, 0), TP(1, 2, 0)]))
        == 0
    )
    got = tstore.get_tensor_with_parallelism(k4, ReadTarget("shard", [PP(3, 4, 3), TP(1, 2, 1)]))
    assert torch.equal(got, t[:, 4:8])
    # sets that disagree on the global shape
    k3 = key("shapes")
    assert tstore.put_tensor(k3, torch.zeros(4, 8)) == 0
    for r in range(2):
        assert (
            tstore.put_tensor_with_parallelism(k3, t, TensorParallelism([DP(0, 1), TP(r, 2, 0)]))
            == 0
        )
    assert (
        tstore.get_tensor_with_parallelism_into(k3, buf.data_ptr(), size, ReadTarget("full"))
        is None
    )
    logs.expect("get_tensor_with_parallelism_into", k3, "global shape", "[4, 8]", "[16, 8]")
    assert bool((buf == 0xAB).all())
    # nothing stored
    assert tstore.get_tensor_with_parallelism(key("none"), ReadTarget("full")) is None
    logs.expect("get_tensor_with_parallelism", "nothing is stored")


def test_upserts_of_some_shards_under_a_reader(tstore, key):
    """A reader racing upserts of two of four shards sees one version per shard."""
    rows, cols, n = 64, 256, 4
    k = key("race")

    def shard_of(v: int, r: int) -> Any:
        return torch.full((rows // n, cols), float(v * 10 + r), dtype=torch.float32)

    for r in range(n):
        assert (
            tstore.put_tensor_with_parallelism(k, shard_of(0, r), TensorParallelism([TP(r, n, 0)]))
            == 0
        )
    stop = threading.Event()
    errors: list[str] = []
    seen: set[int] = set()

    def reader(read: Callable[[], Any]) -> None:
        while not stop.is_set():
            got = read()
            if got is None:
                errors.append("read returned None")
                return
            for r in range(n):
                part = got[r * rows // n : (r + 1) * rows // n]
                vals = torch.unique(part)
                if vals.numel() != 1 or int(vals.item()) % 10 != r:
                    errors.append(f"shard {r} mixes {vals.tolist()[:4]}")
                    return
                seen.add(int(vals.item()) // 10)

    full = ReadTarget("full")
    th = threading.Thread(
        target=reader, args=(lambda: tstore.get_tensor_with_parallelism(k, full),)
    )
    th.start()
    deadline = time.monotonic() + 3.0
    v = 0
    while time.monotonic() < deadline:
        v += 1
        for r in (1, 2):
            rc = tstore.upsert_tensor_with_parallelism(
                k, shard_of(v, r), TensorParallelism([TP(r, n, 0)])
            )
            assert rc == 0
    stop.set()
    th.join(timeout=30)
    assert not errors, errors
    assert v > 1 and len(seen) > 1, (v, seen)
    final = tstore.get_tensor_with_parallelism(k, ReadTarget("shard", [TP(0, 2, 0)]))
    assert torch.equal(final[16:32], shard_of(v, 1))


def test_readme_remap_example(tstore, key):
    """The README's non-TP remap: EP=8 in pipeline stage 1, read as TP rank 1 of 2 of a replica."""
    k = key("experts.w1")
    e = torch.randn(64, 1024)
    for r in range(8):
        par = TensorParallelism([PP(1, 2, stage_id=1), EP(r, 8, expert_id=r, split_dim=0)])
        assert tstore.put_tensor_with_parallelism(k, e, par) == 0
    cols = tstore.get_tensor_with_parallelism(k, ReadTarget("shard", [DP(0, 2), TP(1, 2, 1)]))
    assert torch.equal(cols, e[:, 512:])
