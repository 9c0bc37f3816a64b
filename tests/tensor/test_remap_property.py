"""Property: any stored layout, read with any target layout, equals the torch slice.

Random global shapes (1-3 dims, every extent divisible by every count),
random stored layouts (any of TP, EP with a split dim, DP, PP, in any caller
order) written by their writers in random order through single and batch
puts, random targets (shard or full, any layout); every read is compared
byte for byte with the torch slice of the original tensor.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from helpers.tensor_layouts import box, sample, writer_input, writers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mooncake.store import DP, EP, PP, TP, ParallelAxis, ReadTarget, TensorParallelism

torch = pytest.importorskip("torch")

DTYPES = ["float32", "bfloat16", "int8", "int64", "bool", "float8_e4m3fn"]
_counter = itertools.count()


@st.composite
def layouts(draw: Any, ndim: int, pp_stage: int) -> list[tuple[Any, ...]]:
    """A random axis list: ("tp"|"ep", size, dim) layout axes on distinct dims,
    ("dp", size), ("pp", rank, 2, stage); at least one axis."""
    axes: list[tuple[Any, ...]] = []
    dims = draw(st.permutations(list(range(ndim))))
    if draw(st.booleans()):
        axes.append(("tp", draw(st.integers(1, 4)), dims[0]))
    if ndim > 1 and draw(st.booleans()):
        axes.append(("ep", draw(st.integers(1, 4)), dims[1]))
    if draw(st.booleans()):
        axes.append(("dp", draw(st.integers(1, 3))))
    if draw(st.booleans()):
        axes.append(("pp", pp_stage, 2, pp_stage))
    if not axes:
        axes.append(("tp", draw(st.integers(1, 4)), dims[0]))
    return draw(st.permutations(axes))


def target_axes(layout: list[tuple[Any, ...]], ranks: list[int]) -> list[ParallelAxis]:
    out = []
    for s, r in zip(layout, ranks, strict=False):
        if s[0] == "pp":
            out.append(PP(s[1], s[2], stage_id=s[3]))
        elif s[0] == "tp":
            out.append(TP(r % s[1], s[1], s[2]))
        elif s[0] == "ep":
            out.append(EP(r % s[1], s[1], expert_id=r % s[1], split_dim=s[2]))
        else:
            out.append(DP(r % s[1], s[1]))
    return out


def as_bytes(t: Any) -> bytes:
    return t.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()


@st.composite
def cases(draw: Any) -> dict[str, Any]:
    ndim = draw(st.integers(1, 3))
    shape = tuple(12 * draw(st.integers(1, 2)) for _ in range(ndim))
    src = draw(layouts(ndim, draw(st.integers(0, 1))))
    dst = draw(layouts(ndim, draw(st.integers(0, 1))))
    return {
        "shape": shape,
        "dtype": draw(st.sampled_from(DTYPES)),
        "src": src,
        "dst": dst,
        "ranks": draw(st.lists(st.integers(0, 11), min_size=4, max_size=4)),
        "full": draw(st.booleans()),
        "batch": draw(st.booleans()),
        "order": draw(st.randoms(use_true_random=False)),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=cases())
def test_any_layout_reads_any_target(tstore, case):
    dtype = getattr(torch, case["dtype"])
    t = sample(case["shape"], dtype, case["seed"])
    k = f"prop/{next(_counter)}"
    ws = writers(case["src"])
    case["order"].shuffle(ws)
    inputs = [writer_input(t, axes) for axes in ws]
    if case["batch"]:
        rcs = tstore.batch_put_tensor_with_parallelism(
            [k] * len(ws), inputs, [TensorParallelism(a) for a in ws]
        )
    else:
        rcs = [
            tstore.put_tensor_with_parallelism(k, x, TensorParallelism(a))
            for x, a in zip(inputs, ws, strict=True)
        ]
    assert rcs == [0] * len(ws), (case["src"], rcs)
    tgt = target_axes(case["dst"], case["ranks"])
    if case["full"]:
        target, want = ReadTarget("full", TensorParallelism(tgt)), t
    else:
        target, want = ReadTarget("shard", TensorParallelism(tgt)), box(t, tgt)
    got = tstore.get_tensor_with_parallelism(k, target)
    assert got is not None, (case["src"], tgt)
    assert tuple(got.shape) == tuple(want.shape) and got.dtype == dtype
    assert as_bytes(got) == as_bytes(want), (case["src"], tgt)
