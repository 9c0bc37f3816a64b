"""Unified parallel tensor IO and the legacy TP wrappers.

``full = torch.arange(24, dtype=torch.float32).reshape(4, 6)`` throughout. Key
listings come from the master's ``/get_all_keys``.
"""

from __future__ import annotations

import types

import pytest
from conftest import rpcs
from helpers.tensor_format import decode_header, decode_manifest
from mooncake.store import (
    DP,
    EP,
    PP,
    TP,
    ParallelAxis,
    ReadTarget,
    ReplicateConfig,
    TensorParallelism,
)

torch = pytest.importorskip("torch")


def P(*axes):
    return TensorParallelism(list(axes))


def shard(*axes):
    return ReadTarget(mode="shard", parallelism=P(*axes))


def full_of(*axes):
    return ReadTarget(mode="full", parallelism=P(*axes) if axes else None)


def axis_tuple(a):
    return tuple(a)


def test_tp_shard_write_stores_shard_and_manifest(tstore, key, keys_of, full):
    k = key("A")
    assert tstore.put_tensor_with_parallelism(k, full[2:4], P(TP(1, 2, 0))) == 0
    assert keys_of(k) == [f"{k}__parallelism_manifest", f"{k}_tp_1"]
    m = decode_manifest(tstore.get(f"{k}__parallelism_manifest"))
    assert len(tstore.get(f"{k}__parallelism_manifest")) == 96
    assert m["magic_bytes"] == b"NAMW" and (m["version"], m["header_size"]) == (1, 96)
    assert (m["split_dim"], m["shard_count"], m["global"]) == (0, 2, (4, 6))
    h = decode_header(tstore.get(f"{k}_tp_1"))
    assert h["layout"] == 1
    assert h["global"][:2] == (4, 6) and h["local"][:2] == (2, 6)
    assert [axis_tuple(a) for a in h["axes"]] == [(1, 0, 1, 2, 0, 0, 2)]


@pytest.fixture
def tp_a(tstore, key, full):
    k = key("A")
    assert tstore.put_tensor_with_parallelism(k, full[2:4], P(TP(1, 2, 0))) == 0
    assert tstore.put_tensor_with_parallelism(k, full[0:2], P(TP(0, 2, 0))) == 0
    return k


def test_tp_set_reads(tstore, tp_a, full):
    k = tp_a
    assert torch.equal(tstore.get_tensor_with_parallelism(k, full_of(TP(0, 2, 0))), full)
    assert torch.equal(tstore.get_tensor_with_parallelism(k, shard(TP(3, 4, 0))), full[3:4])
    assert torch.equal(tstore.get_tensor_with_parallelism(k, shard(TP(0, 1, 0))), full)
    assert torch.equal(tstore.get_tensor_with_tp(k, 1, 2), full[2:4])


@pytest.mark.ours
def test_tp_set_read_modes_without_object_at_k(tstore, tp_a, full, logs):
    k = tp_a
    assert tstore.get_tensor_with_parallelism(k) is None
    logs.expect("get_tensor_with_parallelism", "OBJECT_NOT_FOUND")
    assert torch.equal(tstore.get_tensor_with_parallelism(k, ReadTarget(mode="full")), full)
    got = tstore.get_tensor_with_parallelism(k, ReadTarget("as_stored", P(TP(1, 2, 0))))
    assert torch.equal(got, full[2:4])
    # a full read ignores the request's layout axes
    assert torch.equal(tstore.get_tensor_with_parallelism(k, full_of(TP(0, 2, 1))), full)
    # a TP split along another dim than the stored one is that box, never a stored chunk
    got = tstore.get_tensor_with_parallelism(k, shard(TP(1, 2, 1)))
    assert torch.equal(got, full[:, 3:6])


def test_multi_axis_write(tstore, key, keys_of, full):
    k = key("B")
    assert tstore.put_tensor_with_parallelism(k, full, P(TP(1, 3, 1), DP(1, 2))) == 0
    assert keys_of(k) == [f"{k}__dp_1of2__tp_1of3_sd1", f"{k}__parallelism_manifest"]
    h = decode_header(tstore.get(f"{k}__dp_1of2__tp_1of3_sd1"))
    assert [axis_tuple(a) for a in h["axes"]] == [(1, 0, 1, 3, 1, 0, 2), (0, 1, 1, 2, -1, 0, 0)]
    assert h["global"][:2] == (4, 6) and h["local"][:2] == (4, 2)
    m = decode_manifest(tstore.get(f"{k}__parallelism_manifest"))
    assert (m["global"], m["split_dim"], m["shard_count"]) == ((4, 6), 1, 3)


def test_multi_axis_reads(tstore, key, full, logs):
    k = key("B")
    for r in range(3):
        assert tstore.put_tensor_with_parallelism(k, full, P(TP(r, 3, 1), DP(1, 2))) == 0
    got = tstore.get_tensor_with_parallelism(k, shard(DP(1, 2), TP(1, 3, 1)))
    assert torch.equal(got, full[:, 2:4])
    # DP replicas hold the same tensor: DP rank 0 is served by replica 1
    got = tstore.get_tensor_with_parallelism(k, shard(DP(0, 2), TP(1, 3, 1)))
    assert torch.equal(got, full[:, 2:4])
    got = tstore.get_tensor_with_parallelism(k, shard(DP(1, 2), TP(1, 2, 1)))
    assert torch.equal(got, full[:, 3:6])
    assert torch.equal(tstore.get_tensor_with_parallelism(k, full_of(DP(1, 2), TP(0, 3, 1))), full)
    assert torch.equal(tstore.get_tensor_with_parallelism(k, full_of(DP(0, 2), TP(0, 3, 1))), full)
    # a scope axis the stored set lacks does not restrict which set serves it
    assert torch.equal(
        tstore.get_tensor_with_parallelism(k, full_of(PP(0, 2, 1), TP(0, 3, 1))), full
    )
    logs.none()


def test_multi_axis_shard_input_is_non_uniform(tstore, key, keys_of, full, logs):
    k = key("B2")
    assert tstore.put_tensor_with_parallelism(k, full[:, 2:4], P(TP(1, 3, 1), DP(1, 2))) == -600
    logs.expect("put_tensor_with_parallelism", "only uniform sharding is supported")
    assert keys_of(k) == []


@pytest.mark.parametrize(
    "axes,reason",
    [
        ([ParallelAxis(kind="ep", rank=0, size=2)], "requires expert_id"),
        ([ParallelAxis(kind="dp", rank=0, size=2, split_dim=0)], "must not have split_dim"),
        ([ParallelAxis(kind="tp", rank=0, size=2)], "requires split_dim"),
        ([ParallelAxis(kind="pp", rank=0, size=2)], "requires stage_id"),
        ([DP(0, 2), DP(1, 2)], "duplicate"),
        ([DP(0, 2), TP(0, 2, 0), EP(0, 2, 1), PP(0, 2, 0), DP(1, 2)], "1 to 4 axes"),
        ([ParallelAxis(kind="xx", rank=0, size=1)], "unknown axis kind"),
        ([TP(2, 2, 0)], "rank"),
        ([], "1 to 4 axes"),
        ([TP(0, 2, 5)], "split_dim 5"),
        ([ParallelAxis(kind="tp", rank=0, size=2, split_dim=-1)], "negative"),
        ([ParallelAxis(kind="dp", rank=0, size=2, expert_id=3)], "only allowed on an ep"),
        ([EP(0, 2, 1, split_dim=0), TP(0, 2, 0)], "distinct dims"),
        ([ParallelAxis(kind="tp", rank=0, size=0, split_dim=0)], "size"),
    ],
)
def test_validation_failures_write_nothing(tstore, key, keys_of, full, logs, axes, reason):
    k = key("V")
    assert tstore.put_tensor_with_parallelism(k, full, P(*axes)) == -600
    logs.expect("put_tensor_with_parallelism", reason)
    assert keys_of(k) == []
    # the same request reads None (split_dim 5 is only checked against a tensor)
    assert tstore.get_tensor_with_parallelism(k, shard(*axes)) is None
    logs.expect("get_tensor_with_parallelism")


def test_kinds_are_case_insensitive(tstore, key, keys_of, full):
    k = key("K")
    axes = [
        ParallelAxis(kind="TP", rank=1, size=2, split_dim=1),
        ParallelAxis(kind="Dp", rank=0, size=2),
    ]
    assert tstore.put_tensor_with_parallelism(k, full, P(*axes)) == 0
    assert f"{k}__dp_0of2__tp_1of2_sd1" in keys_of(k)


def test_ep_scope(tstore, key, keys_of, full, logs):
    k = key("C")
    assert tstore.put_tensor_with_parallelism(k, full, P(EP(1, 2, expert_id=7))) == 0
    assert keys_of(k) == [f"{k}__ep_1of2_eid7", f"{k}__parallelism_manifest"]
    h = decode_header(tstore.get(f"{k}__ep_1of2_eid7"))
    assert h["global"][:2] == h["local"][:2] == (4, 6)
    assert [axis_tuple(a) for a in h["axes"]] == [(2, 0, 1, 2, -1, 7, 0)]
    assert torch.equal(tstore.get_tensor_with_parallelism(k, shard(EP(1, 2, 7))), full)
    assert tstore.get_tensor_with_parallelism(k, shard(EP(1, 2, 8))) is None
    logs.expect("get_tensor_with_parallelism")


@pytest.mark.ours
def test_ep_scope_full_read(tstore, key, full):
    k = key("C")
    assert tstore.put_tensor_with_parallelism(k, full, P(EP(1, 2, expert_id=7))) == 0
    assert torch.equal(tstore.get_tensor_with_parallelism(k, full_of(EP(1, 2, 7))), full)


@pytest.mark.ours
def test_ep_layout_axes(tstore, key, keys_of, full, logs):
    k = key("E")
    for r in range(2):
        for t in range(3):
            par = P(EP(r, 2, expert_id=r, split_dim=0), TP(t, 3, 1))
            assert tstore.put_tensor_with_parallelism(k, full, par) == 0
    assert f"{k}__tp_1of3_sd1__ep_0of2_sd0" in keys_of(k)
    for r in range(2):
        for t in range(3):
            got = tstore.get_tensor_with_parallelism(k, full_of(EP(r, 2, r, 0), TP(t, 3, 1)))
            assert torch.equal(got, full)
    got = tstore.get_tensor_with_parallelism(k, shard(EP(1, 2, 1, 0), TP(2, 3, 1)))
    assert torch.equal(got, full[2:4, 4:6])
    assert tstore.remove(f"{k}__tp_2of3_sd1__ep_1of2_sd0", True) == 0
    assert tstore.get_tensor_with_parallelism(k, full_of(EP(0, 2, 0, 0), TP(0, 3, 1))) is None
    logs.expect("get_tensor_with_parallelism", "OBJECT_NOT_FOUND")


def test_pp_dp_scope(tstore, key, keys_of, full):
    k = key("D")
    assert tstore.put_tensor_with_parallelism(k, full, P(PP(0, 4, stage_id=2), DP(1, 2))) == 0
    assert keys_of(k) == [f"{k}__dp_1of2__pp_0of4_sid2", f"{k}__parallelism_manifest"]
    got = tstore.get_tensor_with_parallelism(k, shard(DP(1, 2), PP(0, 4, 2)))
    assert torch.equal(got, full)


@pytest.mark.parametrize(
    "wp",
    [
        types.SimpleNamespace(rank=1, size=2, split_dim=1),
        {"rank": 1, "size": 2, "split_dim": 1},
        (1, 2, 1),
    ],
    ids=["object", "dict", "tuple"],
)
def test_writer_partition(tstore, key, keys_of, full, logs, wp):
    k = key("W")
    assert tstore.put_tensor_with_parallelism(k, full, writer_partition=wp) == 0
    assert keys_of(k) == [f"{k}__writer_1of2_sd1", f"{k}__writer_manifest"]
    assert tstore.get_tensor_with_parallelism(k, ReadTarget(mode="full")) is None
    logs.expect("get_tensor_with_parallelism", "OBJECT_NOT_FOUND")
    rank0 = types.SimpleNamespace(rank=0, size=2, split_dim=1)
    assert tstore.put_tensor_with_parallelism(k, full, writer_partition=rank0) == 0
    assert torch.equal(tstore.get_tensor_with_parallelism(k, ReadTarget(mode="full")), full)
    assert torch.equal(tstore.get_tensor_with_parallelism(k, shard(TP(1, 2, 1))), full[:, 3:6])
    h = decode_header(tstore.get(f"{k}__writer_1of2_sd1"))
    assert [axis_tuple(a) for a in h["axes"]] == [(1, 0, 1, 2, 1, 0, 3)]


def test_writer_partition_errors(tstore, key, keys_of, full, logs):
    k = key("W")
    wp = types.SimpleNamespace(rank=1, size=2, split_dim=1)
    assert tstore.put_tensor_with_parallelism(k, full, P(TP(0, 2, 0)), writer_partition=wp) == -600
    logs.expect("put_tensor_with_parallelism", "mutually exclusive")
    bad = [
        (types.SimpleNamespace(rank=0, size=4, split_dim=1), "uniform"),
        (types.SimpleNamespace(rank=2, size=2, split_dim=1), "rank"),
        (types.SimpleNamespace(rank=0, size=0, split_dim=1), "size"),
        (types.SimpleNamespace(rank=0, size=2, split_dim=-1), "split_dim"),
        (types.SimpleNamespace(rank=0, size=2, split_dim=2), "outside"),
        ((0, 2), "tuple"),
        ({"rank": 0, "size": 2}, "split_dim"),
        (types.SimpleNamespace(rank=0, size=2), "split_dim"),
    ]
    for wp_bad, reason in bad:
        assert tstore.put_tensor_with_parallelism(k, full, writer_partition=wp_bad) == -600
        logs.expect("put_tensor_with_parallelism", reason)
    assert keys_of(k) == []


def test_legacy_tp_wrappers(tstore, key, keys_of, full, logs):
    k = key("G")
    assert tstore.put_tensor_with_tp(k, full, 1, 3, 1) == 0
    assert keys_of(k) == [f"{k}_tp_0", f"{k}_tp_1", f"{k}_tp_2"]
    for i in range(3):
        h = decode_header(tstore.get(f"{k}_tp_{i}"))
        assert [axis_tuple(a) for a in h["axes"]] == [(1, 0, i, 3, 1, 0, 2)]
    assert torch.equal(tstore.get_tensor_with_tp(k, 2, 3, 1), full[:, 4:6])
    h = key("H")
    assert tstore.put_tensor_with_tp(h, full) == 0
    assert keys_of(h) == [h] and decode_header(tstore.get(h))["layout"] == 0
    assert tstore.put_tensor_with_tp(key("H2"), full, 0, 4, 1) == -600
    logs.expect("put_tensor_with_tp", "uniform")
    assert tstore.put_tensor_with_tp(key("H4"), torch.tensor(1.0), 0, 2, 0) == -600
    logs.expect("put_tensor_with_tp", "outside")
    assert tstore.put_tensor_with_tp(key("H5"), full, 0, 2, -1) == -600
    logs.expect("put_tensor_with_tp", "negative")
    assert keys_of(key("H2")) == [] and keys_of(key("H4")) == [] and keys_of(key("H5")) == []
    assert tstore.put_tensor_with_tp(key("H3"), full, 5, 2, 0) == 0
    assert keys_of(key("H3")) == [f"{key('H3')}_tp_0", f"{key('H3')}_tp_1"]


@pytest.mark.ours
def test_legacy_tp_read_reshards(tstore, key, full, logs):
    k = key("G")
    assert tstore.put_tensor_with_tp(k, full, 1, 3, 1) == 0
    assert torch.equal(tstore.get_tensor_with_tp(k, 0, 2), full[:, 0:3])
    assert torch.equal(tstore.get_tensor_with_tp(k, 1, 2, 1), full[:, 3:6])
    assert tstore.get_tensor_with_tp(k, 5, 2, 0) is None
    logs.expect("get_tensor_with_tp", "rank")
    got = tstore.batch_get_tensor_with_tp([k, key("missing")], 1, 2)
    assert torch.equal(got[0], full[:, 3:6]) and got[1] is None
    logs.expect("batch_get_tensor_with_tp", "1 of 2")
    # tp_size 1 is a plain read of K itself, which holds nothing here
    assert tstore.get_tensor_with_tp(k) is None


def test_legacy_tp_size_one_reads_plain(tstore, key, full):
    assert tstore.put_tensor(key("F"), full) == 0
    assert torch.equal(tstore.get_tensor_with_tp(key("F")), full)
    assert torch.equal(tstore.batch_get_tensor_with_tp([key("F")])[0], full)


def test_batch_tp_wrappers(tstore, key, keys_of, full, logs):
    ks = [key("g1"), key("g2")]
    assert tstore.batch_put_tensor_with_tp(ks, [full, full * 2], 0, 2, 0) == [0, 0]
    got = tstore.batch_get_tensor_with_tp(ks, 1, 2)
    assert torch.equal(got[0], full[2:4]) and torch.equal(got[1], full[2:4] * 2)
    assert tstore.batch_put_tensor_with_tp([key("g3"), key("g4")], [full, "x"], 0, 2, 0) == [
        0,
        -600,
    ]
    logs.expect("batch_put_tensor_with_tp", "expected a torch.Tensor")
    assert tstore.batch_put_tensor_with_tp([key("g5")], [full, full], 0, 2, 0) == [-600]
    cfg = ReplicateConfig()
    assert tstore.pub_tensor_with_tp(key("g6"), full, cfg, 0, 2, 1) == 0
    assert keys_of(key("g6")) == [f"{key('g6')}_tp_0", f"{key('g6')}_tp_1"]
    assert tstore.batch_pub_tensor_with_tp([key("g7")], [full], cfg, 0, 3, 1) == [0]
    bad = ReplicateConfig()
    bad.preferred_segments = ["x", "y"]
    assert tstore.pub_tensor_with_tp(key("g8"), full, bad, 0, 2, 1) == -600
    logs.expect("pub_tensor_with_tp", "preferred_segments")
    assert keys_of(key("g8")) == []


def full_object(t):
    """A buffer holding ``t`` as a FULL tensor object."""
    raw = bytearray(304 + t.numel() * t.element_size())
    buf = torch.frombuffer(raw, dtype=torch.uint8)
    from mooncake.store import _serialize_tensor

    header, _p, _n, owner = _serialize_tensor(t)
    buf[:304] = torch.frombuffer(bytearray(header), dtype=torch.uint8)
    buf[304:] = owner.reshape(-1).view(torch.uint8)
    return buf


def test_from_buffer_routes(tstore, key, keys_of, full, logs):
    buf = full_object(full)
    p, n = buf.data_ptr(), buf.numel()
    k = key("X")
    assert tstore.put_tensor_with_parallelism_from(k, p, n, P(TP(1, 2, 0))) == 0
    assert keys_of(k) == [f"{k}_tp_0", f"{k}_tp_1"]
    assert torch.equal(tstore.get_tensor_with_tp(k, 0, 2), full[0:2])
    k2 = key("X2")
    assert tstore.put_tensor_with_parallelism_from(k2, p, n, P(DP(1, 2), TP(0, 3, 1))) == 0
    assert keys_of(k2) == [f"{k2}__dp_1of2__tp_{i}of3_sd1" for i in range(3)]
    k3 = key("X3")
    assert tstore.put_tensor_with_parallelism_from(k3, p, n) == 0
    assert bytes(tstore.get(k3)) == bytes(buf.numpy())
    k4 = key("X4")
    wp = types.SimpleNamespace(rank=0, size=2, split_dim=0)
    assert tstore.put_tensor_with_parallelism_from(k4, p, n, writer_partition=wp) == 0
    assert keys_of(k4) == [f"{k4}__writer_0of2_sd0", f"{k4}__writer_manifest"]
    k5 = key("X5")
    assert tstore.put_tensor_with_parallelism_from(k5, p, n, P(DP(0, 2))) == 0
    assert torch.equal(tstore.get_tensor_with_parallelism(k5, shard(DP(0, 2))), full)
    assert tstore.put_tensor_with_parallelism_from(key("X6"), p + 1, n, P(TP(0, 2, 0))) == -600
    logs.expect("put_tensor_with_parallelism_from", "bad magic")
    assert keys_of(key("X6")) == []
    assert tstore.put_tensor_with_tp_from(key("X7"), p, n, 0, 2, 1) == 0
    assert keys_of(key("X7")) == [f"{key('X7')}_tp_0", f"{key('X7')}_tp_1"]
    assert tstore.put_tensor_with_tp_from(key("X8"), p, n) == 0
    assert bytes(tstore.get(key("X8"))) == bytes(buf.numpy())
    res = tstore.batch_put_tensor_with_tp_from([key("X9"), key("X10")], [p, p + 1], [n, n], 0, 2, 0)
    assert res == [0, -600]
    logs.expect("batch_put_tensor_with_tp_from")
    assert tstore.batch_put_tensor_with_tp_from([key("X11")], [p], [n, n], 0, 2, 0) == [-600]
    assert tstore.upsert_tensor_with_parallelism_from(k, p, n, P(TP(0, 2, 0))) == 0


def test_batch_from_with_requests(tstore, key, keys_of, full, logs):
    buf = full_object(full)
    p, n = buf.data_ptr(), buf.numel()
    ks = [key("Y1"), key("Y2")]
    res = tstore.batch_put_tensor_with_parallelism_from(ks, [p, p], [n, n], [P(TP(0, 2, 0)), None])
    assert res == [0, 0]
    assert keys_of(ks[0]) == [f"{ks[0]}_tp_0", f"{ks[0]}_tp_1"]
    assert bytes(tstore.get(ks[1])) == bytes(buf.numpy())
    # no requests: all-or-nothing like batch_put_tensor_from
    res = tstore.batch_put_tensor_with_parallelism_from([key("Y3"), key("Y4")], [p, p + 1], [n, n])
    assert res == [-600, -600]
    logs.expect("batch_put_tensor_with_parallelism_from")
    assert keys_of(key("Y3")) == []
    res = tstore.batch_put_tensor_with_parallelism_from(
        [key("Y5")], [p], [n], None, None, [(0, 2, 1)]
    )
    assert res == [0]
    both = tstore.batch_upsert_tensor_with_parallelism_from(
        [key("Y6")], [p], [n], [None], None, [None]
    )
    assert both == [-600]
    logs.expect("batch_upsert_tensor_with_parallelism_from", "mutually exclusive")
    assert tstore.batch_put_tensor_with_parallelism_from([], [], []) == []


def test_batch_with_parallelism(tstore, key, keys_of, full):
    ks = [key("K1"), key("K2"), key("K3")]
    pars = [None, P(TP(0, 2, 0)), P(DP(0, 2), TP(1, 2, 1))]
    before = rpcs(tstore)
    assert tstore.batch_put_tensor_with_parallelism(ks, [full, full[:2], full], pars) == [0, 0, 0]
    assert rpcs(tstore) - before <= 2
    assert keys_of(ks[0]) == [ks[0]]
    assert keys_of(ks[1]) == [f"{ks[1]}__parallelism_manifest", f"{ks[1]}_tp_0"]
    assert keys_of(ks[2]) == [f"{ks[2]}__dp_0of2__tp_1of2_sd1", f"{ks[2]}__parallelism_manifest"]
    got = tstore.batch_get_tensor_with_parallelism(
        ks, [None, ReadTarget("as_stored", P(TP(0, 2, 0))), shard(DP(0, 2), TP(1, 2, 1))]
    )
    assert torch.equal(got[0], full) and torch.equal(got[1], full[:2])
    assert torch.equal(got[2], full[:, 3:6])


def test_batch_with_parallelism_errors(tstore, key, keys_of, full, logs):
    a, b = key("e1"), key("e2")
    assert tstore.batch_put_tensor_with_parallelism([a, b], [full]) == [-600, -600]
    logs.expect("batch_put_tensor_with_parallelism", "differ in length")
    both = tstore.batch_put_tensor_with_parallelism([a], [full], [None], writer_partitions=[None])
    assert both == [-600]
    logs.expect("batch_put_tensor_with_parallelism", "mutually exclusive")
    assert tstore.batch_put_tensor_with_parallelism([a, b], [full, "x"]) == [0, -600]
    logs.expect("batch_put_tensor_with_parallelism", "expected a torch.Tensor")
    assert tstore.batch_put_tensor_with_parallelism([], []) == []
    assert tstore.batch_put_tensor_with_parallelism([b], [full], 5) == [-600]
    logs.expect("batch_put_tensor_with_parallelism", "must be a list")
    assert tstore.batch_put_tensor_with_parallelism([b], [full], [None, None]) == [-600]
    logs.expect("batch_put_tensor_with_parallelism", "entries for 1 keys")
    assert tstore.batch_put_tensor_with_parallelism([b], [full], None, None, [(0, 2)]) == [-600]
    assert tstore.batch_upsert_tensor_with_parallelism([b], [full], [None], None, None) == [0]
    assert keys_of(b) == [b]
    cfg = ReplicateConfig()
    cfg.group_ids = ["g"]
    assert tstore.batch_put_tensor_with_parallelism([a, b], [full, full], None, cfg) == [-600, -600]
    logs.expect("batch_put_tensor_with_parallelism", "group_ids")


def test_batch_reads_use_at_most_three_rpcs(tstore, key, full, logs):
    ks = [key(f"R{i}") for i in range(64)]
    pars = [P(TP(r, 2, 0)) for r in range(2)]
    for k in ks:
        assert tstore.batch_put_tensor_with_parallelism([k, k], [full[:2], full[2:]], pars) == [
            0,
            0,
        ]
    targets = [full_of(TP(0, 2, 0)) if i % 3 == 0 else shard(TP(i % 4, 4, 0)) for i in range(64)]
    before = rpcs(tstore)
    got = tstore.batch_get_tensor_with_parallelism(ks, targets)
    assert rpcs(tstore) - before <= 3
    for i, g in enumerate(got):
        want = full if i % 3 == 0 else full[i % 4 : i % 4 + 1]
        assert torch.equal(g, want), i
    before = rpcs(tstore)
    got = tstore.batch_get_tensor_with_parallelism(ks, [ReadTarget(mode="full")] * 64)
    assert rpcs(tstore) - before <= 3
    assert all(torch.equal(g, full) for g in got)
    assert tstore.batch_get_tensor_with_parallelism(ks, targets[:3]) == [None] * 64
    logs.expect("batch_get_tensor_with_parallelism", "targets")
    assert tstore.batch_get_tensor_with_parallelism(ks[:1], 5) == [None]
    logs.expect("batch_get_tensor_with_parallelism", "must be a list")


def test_into_reads(tstore, tp_a, full, logs):
    k = tp_a
    for registered in (False, True):
        buf = torch.zeros(4096, dtype=torch.uint8)
        p = buf.data_ptr()
        if registered:
            assert tstore.register_buffer(p, 4096) == 0
        got = tstore.get_tensor_with_parallelism_into(k, p, 4096, ReadTarget(mode="full"))
        assert torch.equal(got, full) and got.data_ptr() == p + 304
        h = decode_header(bytes(buf[:304].numpy()))
        assert h["layout"] == 0 and h["global"][:2] == (4, 6) and h["axis_count"] == 0
        if registered:
            assert tstore.unregister_buffer(p) == 0
    buf = torch.zeros(4096, dtype=torch.uint8)
    p = buf.data_ptr()
    got = tstore.get_tensor_with_parallelism_into(k, p, 4096, shard(TP(1, 4, 0)))
    assert torch.equal(got, full[1:2])
    h = decode_header(bytes(buf[:304].numpy()))
    assert h["layout"] == 1 and [axis_tuple(a) for a in h["axes"]] == [(1, 0, 1, 4, 0, 0, 1)]
    assert tstore.get_tensor_with_parallelism_into(k, p, 200, ReadTarget(mode="full")) is None
    logs.expect("get_tensor_with_parallelism_into", "smaller")
    got = tstore.get_tensor_with_tp_into(k, p, 4096, 1, 2, 0)
    assert torch.equal(got, full[2:4])
    assert bytes(buf[:304].numpy()) == tstore.get(f"{k}_tp_1")[:304]
    b2 = torch.zeros(8192, dtype=torch.uint8)
    res = tstore.batch_get_tensor_with_tp_into(
        [k, k], [b2.data_ptr(), b2.data_ptr() + 4096], [4096, 4096], 0, 2
    )
    assert torch.equal(res[0], full[0:2]) and torch.equal(res[1], full[0:2])
    assert tstore.batch_get_tensor_with_tp_into([k], [p], [4096, 1], 0, 2) == [-600]
    logs.expect("batch_get_tensor_with_tp_into")
    res = tstore.batch_get_tensor_with_parallelism_into(
        [k, k], [b2.data_ptr(), b2.data_ptr() + 4096], [4096, 4096], [full_of(), shard(TP(0, 2, 0))]
    )
    assert torch.equal(res[0], full) and torch.equal(res[1], full[0:2])
    assert tstore.batch_get_tensor_with_parallelism_into([k, k], [p], [4096, 4096]) == [None, None]
    logs.expect("batch_get_tensor_with_parallelism_into")
    assert tstore.batch_get_tensor_with_parallelism_into([k], [0], [4096]) == [None]


def test_upsert_with_parallelism(tstore, key, full):
    k = key("U")
    assert tstore.upsert_tensor_with_parallelism(k, full[:2], P(TP(0, 2, 0))) == 0
    assert tstore.upsert_tensor_with_parallelism(k, full[:2] + 100, P(TP(0, 2, 0))) == 0
    got = tstore.get_tensor_with_parallelism(k, ReadTarget("as_stored", P(TP(0, 2, 0))))
    assert torch.equal(got, full[:2] + 100)
    bigger = torch.ones(3, 6)
    assert tstore.upsert_tensor_with_parallelism(k, bigger, P(TP(0, 2, 0))) == 0
    m = decode_manifest(tstore.get(f"{k}__parallelism_manifest"))
    assert m["global"] == (6, 6)
    # put keeps an existing manifest (write-once)
    k2 = key("U2")
    assert tstore.put_tensor_with_parallelism(k2, full[:2], P(TP(0, 2, 0))) == 0
    assert tstore.put_tensor_with_parallelism(k2, bigger, P(TP(1, 2, 0))) == 0
    assert decode_manifest(tstore.get(f"{k2}__parallelism_manifest"))["global"] == (4, 6)
    assert tstore.batch_upsert_tensor_with_parallelism([k2], [bigger], [P(TP(1, 2, 0))]) == [0]
    assert decode_manifest(tstore.get(f"{k2}__parallelism_manifest"))["global"] == (6, 6)


def test_read_target_class():
    t = ReadTarget()
    t.mode = "FULL"
    assert t.mode == "full"
    with pytest.raises(RuntimeError):
        t.mode = "weird"
    assert TP(1, 2, 0) == ParallelAxis(kind="tp", rank=1, size=2, split_dim=0)


def test_replica_alias(tstore, key, full):
    cfg = ReplicateConfig()
    assert tstore.put_tensor_with_parallelism(key("r"), full, replica=cfg) == 0
    assert tstore.batch_put_tensor_with_parallelism([key("r2")], [full], replica=cfg) == [0]
    with pytest.raises(TypeError):
        tstore.put_tensor_with_parallelism(key("r3"), full, config=cfg, replica=cfg)
    with pytest.raises(TypeError):
        tstore.batch_upsert_tensor_with_parallelism([key("r3")], [full], config=cfg, replica=cfg)


def test_read_target_duck_typing(tstore, tp_a, full, logs):
    k = tp_a
    target = types.SimpleNamespace(
        mode="shard",
        parallelism=types.SimpleNamespace(
            axes=[types.SimpleNamespace(kind="tp", rank=1, size=2, split_dim=0)]
        ),
    )
    assert torch.equal(tstore.get_tensor_with_parallelism(k, target), full[2:4])
    assert tstore.get_tensor_with_parallelism(k, types.SimpleNamespace(mode="odd")) is None
    logs.expect("get_tensor_with_parallelism", "unsupported ReadTarget mode")
    assert tstore.get_tensor_with_parallelism(k, types.SimpleNamespace(mode=3)) is None
    logs.expect("get_tensor_with_parallelism", "mode must be a str")
    assert tstore.get_tensor_with_parallelism(k, ReadTarget(mode="shard")) is None
    logs.expect("get_tensor_with_parallelism", "parallelism is required")
    target = ReadTarget("shard", [TP(1, 2, 0)])
    assert torch.equal(tstore.get_tensor_with_parallelism(k, target), full[2:4])
    assert tstore.put_tensor_with_parallelism(k, full, 5) == -600
    logs.expect("put_tensor_with_parallelism", "must provide axes")


def test_large_sets_split_over_threads(tstore, key):
    """16 MiB tensors (copies big enough to be spread over threads), split along
    dim 1 into strided runs, written, rebuilt and re-sharded exactly."""
    big = torch.arange(2048 * 2048, dtype=torch.float32).reshape(2048, 2048)
    k = key("L")
    assert tstore.put_tensor_with_tp(k, big, 0, 4, 1) == 0
    assert torch.equal(tstore.get_tensor_with_parallelism(k, ReadTarget(mode="full")), big)
    assert torch.equal(tstore.get_tensor_with_tp(k, 2, 8, 1), big[:, 512:768])
    k2 = key("L2")
    assert tstore.put_tensor(k2, big) == 0
    assert torch.equal(tstore.get_tensor(k2), big)
    got = tstore.get_tensor_with_parallelism(k2, shard(TP(1, 2, 1)))
    assert torch.equal(got, big[:, 1024:])
