"""Parallelism descriptors for tensor IO: ``ParallelAxis``, ``TensorParallelism``, ``ReadTarget``.

These are plain value classes: upstream's no-argument
constructors and read/write attributes, plus keyword constructors, value
equality and a readable ``repr``. They hold no I/O and no hot path, so they live
in Python. ``TP``/``DP``/``EP``/``PP`` build the common axes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["DP", "EP", "PP", "TP", "ParallelAxis", "ReadTarget", "TensorParallelism"]

_READ_MODES = ("as_stored", "shard", "full")


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be int, not {type(value).__name__}")
    return value


def _check_str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be str, not {type(value).__name__}")
    return value


def _check_opt_int(name: str, value: Any) -> int | None:
    if value is None:
        return None
    return _check_int(name, value)


class ParallelAxis:
    """One axis of a tensor's parallel layout (tp, dp, ep or pp).

    ``kind`` is stored verbatim and compared case-insensitively only when used.
    """

    __slots__ = ("_expert_id", "_kind", "_rank", "_size", "_split_dim", "_stage_id")

    def __init__(
        self,
        kind: str = "",
        rank: int = 0,
        size: int = 1,
        split_dim: int | None = None,
        expert_id: int | None = None,
        stage_id: int | None = None,
    ) -> None:
        self.kind = kind
        self.rank = rank
        self.size = size
        self.split_dim = split_dim
        self.expert_id = expert_id
        self.stage_id = stage_id

    @property
    def kind(self) -> str:
        """Axis kind: ``tp``, ``dp``, ``ep`` or ``pp`` (any case)."""
        return self._kind

    @kind.setter
    def kind(self, value: str) -> None:
        self._kind = _check_str("kind", value)

    @property
    def rank(self) -> int:
        """This shard's rank along the axis."""
        return self._rank

    @rank.setter
    def rank(self, value: int) -> None:
        self._rank = _check_int("rank", value)

    @property
    def size(self) -> int:
        """Number of ranks along the axis."""
        return self._size

    @size.setter
    def size(self, value: int) -> None:
        self._size = _check_int("size", value)

    @property
    def split_dim(self) -> int | None:
        """Tensor dimension the axis splits, or None."""
        return self._split_dim

    @split_dim.setter
    def split_dim(self, value: int | None) -> None:
        self._split_dim = _check_opt_int("split_dim", value)

    @property
    def expert_id(self) -> int | None:
        """Expert id of an ``ep`` axis, or None."""
        return self._expert_id

    @expert_id.setter
    def expert_id(self, value: int | None) -> None:
        self._expert_id = _check_opt_int("expert_id", value)

    @property
    def stage_id(self) -> int | None:
        """Pipeline stage id of a ``pp`` axis, or None."""
        return self._stage_id

    @stage_id.setter
    def stage_id(self, value: int | None) -> None:
        self._stage_id = _check_opt_int("stage_id", value)

    def _key(self) -> tuple[Any, ...]:
        return (
            self._kind,
            self._rank,
            self._size,
            self._split_dim,
            self._expert_id,
            self._stage_id,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ParallelAxis):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # mutable value class

    def __repr__(self) -> str:
        parts = [f"kind={self._kind!r}", f"rank={self._rank}", f"size={self._size}"]
        for name in ("split_dim", "expert_id", "stage_id"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={value}")
        return f"ParallelAxis({', '.join(parts)})"


def _check_axes(axes: Iterable[Any] | None) -> list[ParallelAxis]:
    if axes is None:
        return []
    if isinstance(axes, (str, bytes)) or not isinstance(axes, Iterable):
        raise TypeError("axes must be a list of ParallelAxis")
    out = list(axes)
    for item in out:
        if not isinstance(item, ParallelAxis):
            raise TypeError(f"axes items must be ParallelAxis, not {type(item).__name__}")
    return out


class TensorParallelism:
    """An ordered list of ``ParallelAxis`` describing one shard's place in the layout."""

    __slots__ = ("_axes",)

    def __init__(self, axes: Iterable[ParallelAxis] | None = None) -> None:
        self._axes = _check_axes(axes)

    @property
    def axes(self) -> list[ParallelAxis]:
        """A copy of the axes list (mutating it does not change this object)."""
        return list(self._axes)

    @axes.setter
    def axes(self, value: Iterable[ParallelAxis] | None) -> None:
        self._axes = _check_axes(value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorParallelism):
            return NotImplemented
        return self._axes == other._axes

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TensorParallelism(axes={self._axes!r})"


class ReadTarget:
    """How to read a sharded tensor back: ``as_stored``, ``shard`` or ``full``."""

    __slots__ = ("_mode", "_parallelism")

    def __init__(
        self,
        mode: str = "as_stored",
        parallelism: TensorParallelism | list[ParallelAxis] | None = None,
    ) -> None:
        self.mode = mode
        self.parallelism = parallelism

    @property
    def mode(self) -> str:
        """Read mode, lower-cased on assignment."""
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        lowered = _check_str("mode", value).lower()
        if lowered not in _READ_MODES:
            raise RuntimeError("Unsupported ReadTarget mode")
        self._mode = lowered

    @property
    def parallelism(self) -> TensorParallelism | None:
        """Target layout, or None."""
        return self._parallelism

    @parallelism.setter
    def parallelism(self, value: TensorParallelism | list[ParallelAxis] | None) -> None:
        if value is None or isinstance(value, TensorParallelism):
            self._parallelism = value
        elif isinstance(value, list):
            self._parallelism = TensorParallelism(value)
        else:
            raise TypeError(
                f"parallelism must be TensorParallelism or None, not {type(value).__name__}"
            )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReadTarget):
            return NotImplemented
        return (self._mode, self._parallelism) == (other._mode, other._parallelism)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ReadTarget(mode={self._mode!r}, parallelism={self._parallelism!r})"


def TP(rank: int, size: int, split_dim: int) -> ParallelAxis:
    """A tensor-parallel axis splitting dimension ``split_dim``."""
    return ParallelAxis("tp", rank, size, split_dim=split_dim)


def DP(rank: int, size: int) -> ParallelAxis:
    """A data-parallel (replicated) axis."""
    return ParallelAxis("dp", rank, size)


def EP(rank: int, size: int, expert_id: int, split_dim: int | None = None) -> ParallelAxis:
    """An expert-parallel axis for expert ``expert_id``."""
    return ParallelAxis("ep", rank, size, split_dim=split_dim, expert_id=expert_id)


def PP(rank: int, size: int, stage_id: int) -> ParallelAxis:
    """A pipeline-parallel axis for stage ``stage_id``."""
    return ParallelAxis("pp", rank, size, stage_id=stage_id)
