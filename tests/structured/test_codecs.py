"""Codec inference with upstream's literal call forms (the imports and
calls of upstream's tensor test file), no store needed."""

from __future__ import annotations

import pytest
import torch
from mooncake.structured_object_store import (
    MISSING,
    _choose_leaf_codec,
    _escape_key,
    infer_structure,
)


def test_tensor_rows() -> None:
    d = _choose_leaf_codec([torch.tensor([1, 2]), torch.tensor([3])])
    assert d.accepted and d.codec == "ragged_tensor"
    d = _choose_leaf_codec(
        [torch.tensor([1], dtype=torch.float32), torch.tensor([1], dtype=torch.int64)]
    )
    assert not d.accepted and d.codec == "ragged_tensor"
    d = _choose_leaf_codec([torch.tensor([1]), torch.tensor([[1, 2]])])
    assert d.accepted and d.codec == "ragged_tensor"


@pytest.mark.parametrize(
    "values, accepted, codec",
    [
        ([[1, 2, 3], [4, 5]], True, "typed_ragged"),
        ([b"hello", b"world"], True, "bytes_ragged"),
        (["hello", "world"], True, "utf8_ragged"),
        ([{"a": 1}, {"b": 2}], True, "msgpack_ragged"),
        ([1, 2.0, 3], True, "ndarray"),
        ([object(), object()], False, "msgpack_ragged"),
        (["hello", None, "world"], True, "utf8_ragged"),
        ([[b"a"], [b"b", b"c"]], True, "media_list_ragged"),
    ],
)
def test_leaf_codecs(values: list, accepted: bool, codec: str) -> None:
    d = _choose_leaf_codec(values)
    assert (d.accepted, d.codec) == (accepted, codec)


def test_late_non_serializable_rows_and_empty_columns_are_rejected() -> None:
    values = [{"ok": i} for i in range(200)] + [object()]
    assert not _choose_leaf_codec(values).accepted
    assert not _choose_leaf_codec([]).accepted
    assert not _choose_leaf_codec([None, None, None]).accepted


def test_infer_flat_dict_nested_and_lists() -> None:
    leaves, nodes = [], []
    infer_structure("root", ["a", "b", "c"], leaves, nodes)
    assert (len(leaves), len(nodes), leaves[0].decision.codec) == (1, 0, "utf8_ragged")
    leaves, nodes = [], []
    infer_structure("root", [{"x": 1, "y": "a"}, {"x": 2, "y": "b"}], leaves, nodes)
    assert nodes[0].node_type == "dict" and sorted(nodes[0].children) == ["x", "y"]
    assert sorted(leaf.path for leaf in leaves) == ["root.x", "root.y"]
    leaves, nodes = [], []
    infer_structure("r", [{"x": 1}, None, {"x": 3}], leaves, nodes)
    assert (len(nodes), len(leaves), leaves[0].path) == (1, 1, "r.x")
    leaves, nodes = [], []
    infer_structure("r", [{"a": {"b": 1}}, {"a": {"b": 2}}], leaves, nodes)
    assert len(nodes) == 2 and leaves[0].path == "r.a.b" and leaves[0].decision.codec == "ndarray"
    leaves, nodes = [], []
    infer_structure("r", [[{"k": 1}], [{"k": 2}]], leaves, nodes)
    lists = [n for n in nodes if n.node_type == "list"]
    assert len(lists) == 1 and lists[0].lengths == [1, 1]
    assert len([n for n in nodes if n.node_type == "dict"]) == 1 and leaves[0].path == "r[0].k"
    leaves, nodes = [], []
    infer_structure("r", [[{"k": 1}, None], [{"k": 2}, None]], leaves, nodes)
    assert len([n for n in nodes if n.node_type == "list"]) == 1


def test_missing_keys_differ_from_none_values() -> None:
    leaves, nodes = [], []
    infer_structure("r", [{"x": None}, {"y": 2}, None], leaves, nodes)
    assert nodes[0].row_mask == [True, True, False]
    x = next(leaf for leaf in leaves if leaf.path == "r.x")
    assert x.values[0] is None and isinstance(x.values[1], type(MISSING)) and x.values[2] is None
    rows = [
        {"tokens": torch.arange(2, dtype=torch.float32), "label": None},
        None,
        {"label": 3},
        {"tokens": None, "label": 4},
    ]
    leaves, nodes = [], []
    infer_structure("r", rows, leaves, nodes)
    assert nodes[0].row_mask == [True, False, True, True]
    tokens = {leaf.path: leaf for leaf in leaves}["r.tokens"]
    assert torch.equal(tokens.values[0], rows[0]["tokens"]) and tokens.values[1] is None
    assert isinstance(tokens.values[2], type(MISSING)) and tokens.values[3] is None
    assert tokens.decision.codec == "ragged_tensor"


def test_keys_with_dots_and_the_depth_limit() -> None:
    assert _escape_key("simple") == "simple"
    assert _escape_key("a.b") == "a\\.b"
    assert _escape_key("a[0]") == "a\\[0]"
    assert _escape_key("a\\b") == "a\\\\b"
    leaves, nodes = [], []
    infer_structure("r", [{"a.b": 1}, {"a.b": 2}], leaves, nodes)
    assert leaves[0].path == "r.a\\.b"
    deep = 1
    for _ in range(40):
        deep = {"a": deep}
    with pytest.raises(ValueError):
        infer_structure("r", [deep, deep], [], [])


def test_upstream_tensor_test_file_imports() -> None:
    # Upstream's tensor test file imports these names at module level.
    import importlib

    module = importlib.import_module("mooncake.structured_object_store")
    for name in ("MISSING", "_choose_leaf_codec", "_escape_key", "infer_structure"):
        assert hasattr(module, name), name
