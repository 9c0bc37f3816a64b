"""Tensor-IO parallelism descriptors: constructors, setters, errors."""

from __future__ import annotations

import pytest
from mooncake.store import DP, EP, PP, TP, ParallelAxis, ReadTarget, TensorParallelism


def test_parallel_axis_defaults_and_attributes() -> None:
    a = ParallelAxis()
    assert (a.kind, a.rank, a.size) == ("", 0, 1)
    assert (a.split_dim, a.expert_id, a.stage_id) == (None, None, None)
    a.kind = "TP"  # stored verbatim, no validation on assignment
    a.rank = 3
    a.size = 2  # rank >= size is accepted here; checked only when used
    a.split_dim = 1
    assert (a.kind, a.rank, a.size, a.split_dim) == ("TP", 3, 2, 1)


def test_parallel_axis_type_errors() -> None:
    with pytest.raises(TypeError):
        ParallelAxis(kind="tp", rank=None)  # type: ignore[arg-type]
    a = ParallelAxis()
    with pytest.raises(TypeError):
        a.rank = None  # type: ignore[assignment]
    with pytest.raises(TypeError):
        a.kind = 5  # type: ignore[assignment]
    with pytest.raises(TypeError):
        a.split_dim = "0"  # type: ignore[assignment]
    assert a.rank == 0 and a.kind == "" and a.split_dim is None


def test_helpers_equality_and_repr() -> None:
    assert TP(1, 2, 0) == ParallelAxis(kind="tp", rank=1, size=2, split_dim=0)
    assert TP(1, 2, 0) != TP(0, 2, 0)
    assert repr(TP(1, 2, 0)) == "ParallelAxis(kind='tp', rank=1, size=2, split_dim=0)"
    assert DP(1, 2) == ParallelAxis("dp", 1, 2)
    assert EP(1, 2, 7).expert_id == 7 and EP(1, 2, 7).split_dim is None
    assert EP(0, 2, 3, split_dim=1).split_dim == 1
    assert PP(0, 4, 2).stage_id == 2 and PP(0, 4, 2).kind == "pp"


def test_tensor_parallelism_axes_copy_and_check() -> None:
    tp = TensorParallelism([TP(0, 2, 0), DP(1, 2)])
    axes = tp.axes
    axes.append(PP(0, 2, 1))
    assert len(tp.axes) == 2  # the getter returned a copy
    assert TensorParallelism().axes == []
    assert tp == TensorParallelism([TP(0, 2, 0), DP(1, 2)])
    with pytest.raises(TypeError):
        TensorParallelism([TP(0, 2, 0), "dp"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        tp.axes = [1]  # type: ignore[list-item]
    assert len(tp.axes) == 2


def test_read_target_mode_and_parallelism() -> None:
    t = ReadTarget()
    assert t.mode == "as_stored" and t.parallelism is None
    t.mode = "FULL"
    assert t.mode == "full"
    with pytest.raises(RuntimeError, match="Unsupported ReadTarget mode"):
        t.mode = "weird"
    assert t.mode == "full"
    with pytest.raises(TypeError):
        t.mode = 3  # type: ignore[assignment]
    t.parallelism = [TP(1, 2, 0)]  # a list is wrapped
    assert isinstance(t.parallelism, TensorParallelism)
    assert t.parallelism.axes == [TP(1, 2, 0)]
    with pytest.raises(TypeError):
        t.parallelism = "tp"  # type: ignore[assignment]
    assert ReadTarget("shard", TensorParallelism([DP(0, 2)])) == ReadTarget(
        mode="SHARD", parallelism=[DP(0, 2)]
    )
