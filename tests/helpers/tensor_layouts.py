"""Stored tensor layouts as the remap tests describe them, and the torch
slices a layout selects.

A layout is a list of axis specs: every combination of the ranks of its
``("tp", size, dim)``, ``("ep", size, dim)`` and ``("dp", size)`` entries is
one writer; ``("pp", rank, size, stage)`` is a fixed scope. These import
torch lazily, so call them after the caller's ``importorskip``.
"""

from __future__ import annotations

from typing import Any

from mooncake.store import DP, EP, PP, TP, ParallelAxis

Spec = tuple[Any, ...]


def writers(layout: list[Spec]) -> list[list[ParallelAxis]]:
    """The axis list of every writer of ``layout``."""
    lists: list[list[ParallelAxis]] = [[]]
    for s in layout:
        if s[0] == "pp":
            lists = [x + [PP(s[1], s[2], stage_id=s[3])] for x in lists]
            continue
        size = s[1]
        nxt = []
        for x in lists:
            for r in range(size):
                if s[0] == "tp":
                    a = TP(r, size, s[2])
                elif s[0] == "ep":
                    a = EP(r, size, expert_id=r, split_dim=s[2])
                else:
                    a = DP(r, size)
                nxt.append(x + [a])
        lists = nxt
    return lists


def box(t: Any, axes: list[Any]) -> Any:
    """The torch slice of ``t`` that the layout axes of ``axes`` select."""
    for a in axes:
        if a.split_dim is not None:
            step = t.shape[a.split_dim] // a.size
            t = t.narrow(a.split_dim, a.rank * step, step)
    return t.contiguous()


def writer_input(t: Any, axes: list[ParallelAxis]) -> Any:
    """What the writer ``axes`` hands to a put: its own shard when it is the
    only axis and a TP one, else the whole tensor (the store slices it)."""
    single_tp = len(axes) == 1 and axes[0].kind == "tp"
    return box(t, axes) if single_tp else t


def sample(shape: tuple[int, ...], dtype: Any, seed: int) -> Any:
    """A tensor of ``shape`` and ``dtype`` with distinct-looking random bytes."""
    import torch

    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    item = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * item,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)
