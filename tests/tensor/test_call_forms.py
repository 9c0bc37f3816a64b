"""Upstream call forms of every tensor method.

``UPSTREAM`` is the parameter list of each method in the upstream 0.3.13 wheel
(its pybind11 docstrings). Our signatures must have the same names in the same
order with the same defaults (upstream's ``config=ReplicateConfig()`` is our
``config=None``, which means the same); the only extra parameter allowed is
the keyword-only ``replica`` alias of the ``*_with_parallelism`` writes. Then
every method is called once positionally and once by keyword.
"""

from __future__ import annotations

import inspect
import types

import pytest
from helpers.tensor_buffer import obj_buffer
from mooncake.store import (
    TP,
    MooncakeDistributedStore,
    ReadTarget,
    ReplicateConfig,
    TensorParallelism,
)

torch = pytest.importorskip("torch")

CFG = "config=ReplicateConfig()"
UPSTREAM = {
    "put_tensor": "key, tensor",
    "get_tensor": "key",
    "batch_put_tensor": "keys, tensors_list",
    "batch_get_tensor": "keys",
    "put_tensor_from": "key, buffer_ptr, size",
    "batch_put_tensor_from": "keys, buffer_ptrs, sizes",
    "get_tensor_into": "key, buffer_ptr, size",
    "batch_get_tensor_into": "keys, buffer_ptrs, sizes",
    "upsert_tensor": "key, tensor",
    "batch_upsert_tensor": "keys, tensors_list",
    "upsert_tensor_from": "key, buffer_ptr, size",
    "batch_upsert_tensor_from": "keys, buffer_ptrs, sizes",
    "pub_tensor": f"key, tensor, {CFG}",
    "batch_pub_tensor": f"keys, tensors_list, {CFG}",
    "upsert_pub_tensor": f"key, tensor, {CFG}",
    "batch_upsert_pub_tensor": f"keys, tensors_list, {CFG}",
    "put_tensor_with_tp": "key, tensor, tp_rank=0, tp_size=1, split_dim=0",
    "batch_put_tensor_with_tp": "base_keys, tensors_list, tp_rank=0, tp_size=1, split_dim=0",
    "pub_tensor_with_tp": f"key, tensor, {CFG}, tp_rank=0, tp_size=1, split_dim=0",
    "batch_pub_tensor_with_tp": f"base_keys, tensors_list, {CFG}, tp_rank=0, tp_size=1, split_dim=0",
    "put_tensor_with_tp_from": "key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0",
    "batch_put_tensor_with_tp_from": (
        "base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1, split_dim=0"
    ),
    "get_tensor_with_tp": "key, tp_rank=0, tp_size=1, split_dim=0",
    "batch_get_tensor_with_tp": "base_keys, tp_rank=0, tp_size=1",
    "get_tensor_with_tp_into": "key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0",
    "batch_get_tensor_with_tp_into": "base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1",
    "put_tensor_with_parallelism": f"key, tensor, parallelism=None, {CFG}, writer_partition=None",
    "upsert_tensor_with_parallelism": (
        f"key, tensor, parallelism=None, {CFG}, writer_partition=None"
    ),
    "batch_put_tensor_with_parallelism": (
        f"keys, tensors_list, parallelisms=None, {CFG}, writer_partitions=None"
    ),
    "batch_upsert_tensor_with_parallelism": (
        f"keys, tensors_list, parallelisms=None, {CFG}, writer_partitions=None"
    ),
    "put_tensor_with_parallelism_from": (
        f"key, buffer_ptr, size, parallelism=None, {CFG}, writer_partition=None"
    ),
    "upsert_tensor_with_parallelism_from": (
        f"key, buffer_ptr, size, parallelism=None, {CFG}, writer_partition=None"
    ),
    "batch_put_tensor_with_parallelism_from": (
        f"keys, buffer_ptrs, sizes, parallelisms=None, {CFG}, writer_partitions=None"
    ),
    "batch_upsert_tensor_with_parallelism_from": (
        f"keys, buffer_ptrs, sizes, parallelisms=None, {CFG}, writer_partitions=None"
    ),
    "get_tensor_with_parallelism": "key, target=None",
    "batch_get_tensor_with_parallelism": "keys, targets=None",
    "get_tensor_with_parallelism_into": "key, buffer_ptr, size, target=None",
    "batch_get_tensor_with_parallelism_into": "keys, buffer_ptrs, sizes, targets=None",
}


def parse(spec: str) -> list[tuple[str, str | None]]:
    out = []
    for part in spec.split(", "):
        name, _, default = part.partition("=")
        out.append((name, default or None))
    return out


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_signature_matches_upstream(name):
    sig = inspect.signature(getattr(MooncakeDistributedStore, name))
    params = [p for p in sig.parameters.values() if p.name != "self"]
    positional = [p for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    keyword_only = [p.name for p in params if p.kind == p.KEYWORD_ONLY]
    want = parse(UPSTREAM[name])
    assert [p.name for p in positional] == [n for n, _ in want]
    for p, (_, default) in zip(positional, want, strict=True):
        if default is None:
            assert p.default is inspect.Parameter.empty, p.name
        elif default == "ReplicateConfig()":
            assert p.default is None, p.name
        else:
            assert repr(p.default) == default, p.name
    assert keyword_only == (["replica"] if "parallelism" in name and "get_" not in name else [])


def test_every_method_positional_and_keyword(tstore, key, full):
    s = tstore
    cfg = ReplicateConfig()
    src = obj_buffer(full)
    p, n = src.data_ptr(), src.numel()
    out = torch.zeros(8192, dtype=torch.uint8)
    o1, o2 = out.data_ptr(), out.data_ptr() + 4096
    par = TensorParallelism([TP(0, 2, 0)])
    wp = types.SimpleNamespace(rank=0, size=2, split_dim=1)
    k = key

    def both(method, positional, keywords):
        fn = getattr(s, method)
        return fn(*positional), fn(**keywords)

    def assert_writes(table):
        """Every (method, positional, keywords) write succeeds in both forms."""
        for method, positional, keywords in table:
            ok = ([0], [0]) if method.startswith("batch_") else (0, 0)
            assert both(method, positional, keywords) == ok, method

    assert_writes(
        [
            ("put_tensor", (k("a"), full), {"key": k("a2"), "tensor": full}),
            ("upsert_tensor", (k("a"), full), {"key": k("a"), "tensor": full}),
            ("pub_tensor", (k("b"), full, cfg), {"key": k("b2"), "tensor": full, "config": cfg}),
            (
                "upsert_pub_tensor",
                (k("b"), full, cfg),
                {"key": k("b"), "tensor": full, "config": cfg},
            ),
            ("batch_put_tensor", ([k("c")], [full]), {"keys": [k("c2")], "tensors_list": [full]}),
            (
                "batch_upsert_tensor",
                ([k("c")], [full]),
                {"keys": [k("c")], "tensors_list": [full]},
            ),
            (
                "batch_pub_tensor",
                ([k("d")], [full], cfg),
                {"keys": [k("d2")], "tensors_list": [full], "config": cfg},
            ),
            (
                "batch_upsert_pub_tensor",
                ([k("d")], [full], cfg),
                {"keys": [k("d")], "tensors_list": [full], "config": cfg},
            ),
            ("put_tensor_from", (k("e"), p, n), {"key": k("e2"), "buffer_ptr": p, "size": n}),
            ("upsert_tensor_from", (k("e"), p, n), {"key": k("e"), "buffer_ptr": p, "size": n}),
            (
                "batch_put_tensor_from",
                ([k("f")], [p], [n]),
                {"keys": [k("f2")], "buffer_ptrs": [p], "sizes": [n]},
            ),
            (
                "batch_upsert_tensor_from",
                ([k("f")], [p], [n]),
                {"keys": [k("f")], "buffer_ptrs": [p], "sizes": [n]},
            ),
        ]
    )
    a, b = both("get_tensor", (k("a"),), {"key": k("a")})
    assert torch.equal(a, full) and torch.equal(b, full)
    a, b = both("batch_get_tensor", ([k("a")],), {"keys": [k("a")]})
    assert torch.equal(a[0], full) and torch.equal(b[0], full)
    a, b = both(
        "get_tensor_into", (k("a"), o1, 4096), {"key": k("a"), "buffer_ptr": o2, "size": 4096}
    )
    assert torch.equal(a, full) and torch.equal(b, full)
    a, b = both(
        "batch_get_tensor_into",
        ([k("a")], [o1], [4096]),
        {"keys": [k("a")], "buffer_ptrs": [o2], "sizes": [4096]},
    )
    assert torch.equal(a[0], full) and torch.equal(b[0], full)
    # legacy TP wrappers: writes of rank 0 of 2
    tp0 = {"tp_rank": 0, "tp_size": 2, "split_dim": 0}
    assert_writes(
        [
            (
                "put_tensor_with_tp",
                (k("g"), full, 0, 2, 1),
                {"key": k("g2"), "tensor": full, **tp0, "split_dim": 1},
            ),
            (
                "batch_put_tensor_with_tp",
                ([k("h")], [full], 0, 2, 0),
                {"base_keys": [k("h2")], "tensors_list": [full], **tp0},
            ),
            (
                "pub_tensor_with_tp",
                (k("i"), full, cfg, 0, 2, 0),
                {"key": k("i2"), "tensor": full, "config": cfg, **tp0},
            ),
            (
                "batch_pub_tensor_with_tp",
                ([k("j")], [full], cfg, 0, 2, 0),
                {"base_keys": [k("j2")], "tensors_list": [full], "config": cfg, **tp0},
            ),
            (
                "put_tensor_with_tp_from",
                (k("l"), p, n, 0, 2, 0),
                {"key": k("l2"), "buffer_ptr": p, "size": n, **tp0},
            ),
            (
                "batch_put_tensor_with_tp_from",
                ([k("m")], [p], [n], 0, 2, 0),
                {"base_keys": [k("m2")], "buffer_ptrs": [p], "sizes": [n], **tp0},
            ),
        ]
    )
    a, b = both(
        "get_tensor_with_tp",
        (k("g"), 1, 2, 1),
        {"key": k("g"), "tp_rank": 1, "tp_size": 2, "split_dim": 1},
    )
    assert torch.equal(a, full[:, 3:]) and torch.equal(b, full[:, 3:])
    a, b = both(
        "batch_get_tensor_with_tp",
        ([k("h")], 1, 2),
        {"base_keys": [k("h")], "tp_rank": 1, "tp_size": 2},
    )
    assert torch.equal(a[0], full[2:]) and torch.equal(b[0], full[2:])
    a, b = both(
        "get_tensor_with_tp_into",
        (k("h"), o1, 4096, 0, 2, 0),
        {"key": k("h"), "buffer_ptr": o2, "size": 4096, "tp_rank": 0, "tp_size": 2, "split_dim": 0},
    )
    assert torch.equal(a, full[:2]) and torch.equal(b, full[:2])
    a, b = both(
        "batch_get_tensor_with_tp_into",
        ([k("h")], [o1], [4096], 0, 2),
        {"base_keys": [k("h")], "buffer_ptrs": [o2], "sizes": [4096], "tp_rank": 0, "tp_size": 2},
    )
    assert torch.equal(a[0], full[:2]) and torch.equal(b[0], full[:2])
    # unified writes
    for method in ("put_tensor_with_parallelism", "upsert_tensor_with_parallelism"):
        assert both(
            method,
            (k(method), full[:2], par, cfg, None),
            {"key": k(method), "tensor": full[:2], "parallelism": par, "config": cfg},
        ) == (0, 0)
        assert both(
            method,
            (k(method + "w"), full, None, cfg, wp),
            {"key": k(method + "w"), "tensor": full, "writer_partition": wp, "replica": cfg},
        ) == (0, 0)
    for method in ("batch_put_tensor_with_parallelism", "batch_upsert_tensor_with_parallelism"):
        assert both(
            method,
            ([k(method)], [full[:2]], [par], cfg, None),
            {"keys": [k(method)], "tensors_list": [full[:2]], "parallelisms": [par], "config": cfg},
        ) == ([0], [0])
        assert both(
            method,
            ([k(method + "w")], [full], None, cfg, [wp]),
            {"keys": [k(method + "w")], "tensors_list": [full], "writer_partitions": [wp]},
        ) == ([0], [0])
    for method in ("put_tensor_with_parallelism_from", "upsert_tensor_with_parallelism_from"):
        assert both(
            method,
            (k(method), p, n, par, cfg, None),
            {"key": k(method), "buffer_ptr": p, "size": n, "parallelism": par, "config": cfg},
        ) == (0, 0)
    for method in (
        "batch_put_tensor_with_parallelism_from",
        "batch_upsert_tensor_with_parallelism_from",
    ):
        assert both(
            method,
            ([k(method)], [p], [n], [par], cfg, None),
            {
                "keys": [k(method)],
                "buffer_ptrs": [p],
                "sizes": [n],
                "parallelisms": [par],
                "config": cfg,
                "writer_partitions": None,
            },
        ) == ([0], [0])
    # unified reads
    target = ReadTarget(mode="full")
    key_w = k("put_tensor_with_parallelismw")
    assert s.put_tensor_with_parallelism(key_w, full, writer_partition=(1, 2, 1)) == 0
    a, b = both("get_tensor_with_parallelism", (key_w, target), {"key": key_w, "target": target})
    assert torch.equal(a, full) and torch.equal(b, full)
    a, b = both(
        "batch_get_tensor_with_parallelism",
        ([key_w], [target]),
        {"keys": [key_w], "targets": [target]},
    )
    assert torch.equal(a[0], full) and torch.equal(b[0], full)
    a, b = both(
        "get_tensor_with_parallelism_into",
        (key_w, o1, 4096, target),
        {"key": key_w, "buffer_ptr": o2, "size": 4096, "target": target},
    )
    assert torch.equal(a, full) and torch.equal(b, full)
    a, b = both(
        "batch_get_tensor_with_parallelism_into",
        ([key_w], [o1], [4096], [target]),
        {"keys": [key_w], "buffer_ptrs": [o2], "sizes": [4096], "targets": [target]},
    )
    assert torch.equal(a[0], full) and torch.equal(b[0], full)


def test_wrong_argument_types_raise_type_error(tstore, full):
    with pytest.raises(TypeError):
        tstore.put_tensor(1, full)
    with pytest.raises(TypeError):
        tstore.get_tensor(None)
    with pytest.raises(TypeError):
        tstore.put_tensor_from("k", -1, 10)
    with pytest.raises(TypeError):
        tstore.batch_put_tensor("k", [full])
    with pytest.raises(TypeError):
        tstore.put_tensor_with_tp("k", full, "0")
    with pytest.raises(TypeError):
        tstore.pub_tensor("k", full, config=3)
