"""Host staging of the tensors an op touches.

The Rust core reads and writes host memory through raw addresses, so every
tensor an op reads must be contiguous host memory, and every tensor it writes
must be one or be written through a host temporary that is copied back once
the op succeeded. A tensor that already is contiguous host memory is used as
it is, with no copy.

The copies back are *finish* callbacks: the op's Work runs them, in order,
after the op completed without error.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# A copy back into the caller's tensor, run once the op succeeded.
Finish = Callable[[], None]


def nbytes(t: torch.Tensor) -> int:
    """The bytes of ``t``'s elements."""
    return t.numel() * t.element_size()


def host_in(t: torch.Tensor) -> torch.Tensor:
    """A contiguous host tensor holding ``t``'s data (an input)."""
    if t.is_cpu and t.is_contiguous():
        return t
    if t.device.type != "cpu":
        return t.detach().to("cpu", copy=True).contiguous()
    return t.detach().contiguous()


def _copy_back(t: torch.Tensor, tmp: torch.Tensor) -> Finish:
    def finish() -> None:
        t.copy_(tmp)

    return finish


def host_out(t: torch.Tensor, finish: list[Finish]) -> torch.Tensor:
    """A contiguous host tensor the op writes (an output); registers the copy
    back into ``t`` when that is a temporary."""
    if t.is_cpu and t.is_contiguous():
        return t
    tmp = torch.empty(t.shape, dtype=t.dtype, device="cpu")
    finish.append(_copy_back(t, tmp))
    return tmp


def host_inout(t: torch.Tensor, finish: list[Finish]) -> torch.Tensor:
    """A contiguous host tensor holding ``t``'s data that the op updates in
    place; registers the copy back into ``t`` when that is a temporary."""
    if t.is_cpu and t.is_contiguous():
        return t
    tmp = host_in(t)
    finish.append(_copy_back(t, tmp))
    return tmp
