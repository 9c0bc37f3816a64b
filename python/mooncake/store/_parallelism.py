"""Parallelism descriptors for tensor IO: ``ParallelAxis``, ``TensorParallelism``, ``ReadTarget``.

These are plain value classes: upstream's no-argument
constructors and read/write attributes, plus keyword constructors, value
equality and a readable ``repr``. They hold no I/O and no hot path, so they live
in Python. ``TP``/``DP``/``EP``/``PP`` build the common axes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar, overload

__all__ = ["DP", "EP", "PP", "TP", "ParallelAxis", "ReadTarget", "TensorParallelism"]

_READ_MODES = ("as_stored", "shard", "full")

_T = TypeVar("_T")


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


class _Checked(Generic[_T]):
    """A read/write attribute kept in the slot ``_<name>``: an assignment
    stores ``check(name, value)``, which raises ``TypeError`` for a value of
    the wrong type."""

    def __init__(self, check: Callable[[str, Any], _T], doc: str) -> None:
        self._check = check
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name
        self._slot = "_" + name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _Checked[_T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...
    def __get__(self, obj: object, owner: type | None = None) -> _Checked[_T] | _T:
        if obj is None:
            return self
        value: _T = getattr(obj, self._slot)
        return value

    def __set__(self, obj: object, value: _T) -> None:
        setattr(obj, self._slot, self._check(self._name, value))


class ParallelAxis:
    """One axis of a tensor's parallel layout (tp, dp, ep or pp).

    ``kind`` is stored verbatim and compared case-insensitively only when used.
    """

    __slots__ = ("_expert_id", "_kind", "_rank", "_size", "_split_dim", "_stage_id")

    kind = _Checked(_check_str, "Axis kind: ``tp``, ``dp``, ``ep`` or ``pp`` (any case).")
    rank = _Checked(_check_int, "This shard's rank along the axis.")
    size = _Checked(_check_int, "Number of ranks along the axis.")
    split_dim = _Checked(_check_opt_int, "Tensor dimension the axis splits, or None.")
    expert_id = _Checked(_check_opt_int, "Expert id of an ``ep`` axis, or None.")
    stage_id = _Checked(_check_opt_int, "Pipeline stage id of a ``pp`` axis, or None.")

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

    def _key(self) -> tuple[Any, ...]:
        return (self.kind, self.rank, self.size, self.split_dim, self.expert_id, self.stage_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ParallelAxis):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # mutable value class

    def __repr__(self) -> str:
        parts = [f"kind={self.kind!r}", f"rank={self.rank}", f"size={self.size}"]
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
