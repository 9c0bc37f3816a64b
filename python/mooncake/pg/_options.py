"""``MooncakeBackendOptions`` with upstream's constructor overloads.

The overload is chosen by the type of the first positional argument, as in
upstream Mooncake::

    MooncakeBackendOptions(max_group_size)
    MooncakeBackendOptions(max_group_size, is_extension)
    MooncakeBackendOptions(max_group_size, is_extension,
                           auto_deactivate_on_failure, auto_sync_on_failure)
    MooncakeBackendOptions(active_ranks)                    # int32 tensor
    MooncakeBackendOptions(active_ranks, is_extension)
    MooncakeBackendOptions(active_ranks, is_extension, max_group_size)

Every argument can also be given by keyword (``max_group_size=``,
``is_extension=``, ``auto_deactivate_on_failure=``,
``auto_sync_on_failure=``, ``active_ranks=``; the seed's ``max_world_size=``
is an alias of ``max_group_size=``); omitted trailing arguments take their
defaults (``is_extension=False``, both failure flags ``True``).
"""

from __future__ import annotations

import os
from typing import Any

import torch

MAX_CAPACITY = 64

_INT_FORM = ("max_group_size", "is_extension", "auto_deactivate_on_failure", "auto_sync_on_failure")
_TENSOR_FORM = ("active_ranks", "is_extension", "max_group_size")
_KEYWORDS = {
    "active_ranks",
    "max_group_size",
    "max_world_size",
    "is_extension",
    "auto_deactivate_on_failure",
    "auto_sync_on_failure",
}


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise TypeError(f"MooncakeBackendOptions: {name} must be a bool, got {value!r}")


def _env_flag(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    if v is None or v.strip() == "":
        return default
    return v.strip().lower() not in ("0", "false", "off", "no")


def _bind_positional(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Adds the positional arguments to ``kwargs`` under the names of the
    overload their first one selects."""
    first = args[0]
    names: tuple[str, ...]
    if isinstance(first, torch.Tensor):
        names = _TENSOR_FORM
    elif isinstance(first, int) and not isinstance(first, bool):
        names = _INT_FORM
    else:
        raise TypeError(
            "MooncakeBackendOptions: the first argument must be max_group_size (int) or "
            f"active_ranks (torch.int32 tensor), got {type(first).__name__}"
        )
    if len(args) > len(names):
        raise TypeError(
            f"MooncakeBackendOptions({names[0]}, ...) takes at most {len(names)} "
            f"positional arguments ({', '.join(names)}), got {len(args)}"
        )
    # Fewer arguments than names: the trailing ones keep their defaults.
    for name, value in zip(names, args, strict=False):
        if name in kwargs:
            raise TypeError(f"MooncakeBackendOptions got multiple values for {name!r}")
        kwargs[name] = value


def _capacity(cap: Any, alias: Any) -> int | None:
    """``max_group_size`` (or its alias ``max_world_size``), checked."""
    if cap is not None and alias is not None and cap != alias:
        raise ValueError(
            f"MooncakeBackendOptions: max_group_size={cap} and max_world_size={alias} disagree"
        )
    if cap is None:
        cap = alias
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, int):
        raise TypeError(f"MooncakeBackendOptions: max_group_size must be an int, got {cap!r}")
    if not 1 <= cap <= MAX_CAPACITY:
        raise ValueError(
            f"MooncakeBackendOptions: max_group_size must be in [1, {MAX_CAPACITY}], got {cap}"
        )
    return cap


def _check_active_ranks(active: Any, cap: int | None) -> None:
    if not isinstance(active, torch.Tensor):
        raise TypeError(
            f"MooncakeBackendOptions: active_ranks must be a torch.Tensor, "
            f"got {type(active).__name__}"
        )
    if active.dtype != torch.int32:
        raise ValueError(
            f"MooncakeBackendOptions: active_ranks must be torch.int32, got {active.dtype}"
        )
    if active.dim() != 1 or not active.is_contiguous():
        raise ValueError("MooncakeBackendOptions: active_ranks must be a contiguous 1-D tensor")
    if not 1 <= active.numel() <= MAX_CAPACITY:
        raise ValueError(
            f"MooncakeBackendOptions: active_ranks has {active.numel()} entries; "
            f"expected between 1 and {MAX_CAPACITY}"
        )
    if cap is not None and active.numel() != cap:
        raise ValueError(
            f"MooncakeBackendOptions: active_ranks has {active.numel()} entries but "
            f"max_group_size is {cap}; size it to max_group_size"
        )


def _failure_flags(kwargs: dict[str, Any]) -> tuple[bool, bool]:
    """(auto_deactivate_on_failure, auto_sync_on_failure) with their defaults."""
    if "auto_deactivate_on_failure" in kwargs:
        auto_deact = _flag("auto_deactivate_on_failure", kwargs["auto_deactivate_on_failure"])
    else:
        auto_deact = _env_flag("MOONCAKE_PG_AUTO_DEACTIVATE_ON_FAILURE", True)
    if "auto_sync_on_failure" in kwargs:
        auto_sync = _flag("auto_sync_on_failure", kwargs["auto_sync_on_failure"])
    else:
        auto_sync = auto_deact
    if auto_sync and not auto_deact:
        raise ValueError(
            "MooncakeBackendOptions: auto_sync_on_failure=True requires "
            "auto_deactivate_on_failure=True (automatic synchronization only applies when "
            "the process group owns failure-driven deactivation); use False, False for "
            "framework-managed failure handling"
        )
    return auto_deact, auto_sync


class MooncakeBackendOptions:
    """Options for ``dist.init_process_group(..., pg_options=...)`` and ``new_group``.

    * ``max_group_size``: reserved slot capacity (>= the declared group size,
      <= 64); slots beyond the initial members stay inactive until activated.
    * ``active_ranks``: optional contiguous ``torch.int32`` tensor of length
      ``max_group_size`` that the backend keeps as a mirror of the committed
      membership (its initial contents are ignored). On the CPU or an
      accelerator, for either backend (as upstream): a CPU tensor is written
      in place, another device's is refreshed by a copy when the view changes.
    * ``is_extension``: a joining or replacement process that enters the
      group through ``join_group``.
    * ``auto_deactivate_on_failure`` / ``auto_sync_on_failure``: the failure
      handling mode (both ``True``: PG-managed, synchronized; ``True, False``:
      PG-managed, deferred; ``False, False``: framework-managed).
      ``False, True`` is rejected. The default of the first is
      ``MOONCAKE_PG_AUTO_DEACTIVATE_ON_FAILURE`` (1), the second defaults to
      the first.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        unknown = set(kwargs) - _KEYWORDS
        if unknown:
            raise TypeError(
                f"MooncakeBackendOptions got unexpected keyword argument(s) {sorted(unknown)}"
            )
        if args:
            _bind_positional(args, kwargs)
        cap = _capacity(kwargs.get("max_group_size"), kwargs.get("max_world_size"))
        active = kwargs.get("active_ranks")
        if active is not None:
            _check_active_ranks(active, cap)
        is_ext = _flag("is_extension", kwargs.get("is_extension", False))
        auto_deact, auto_sync = _failure_flags(kwargs)
        self.active_ranks: torch.Tensor | None = active
        self.is_extension = is_ext
        self.max_group_size: int | None = cap
        self.auto_deactivate_on_failure = auto_deact
        self.auto_sync_on_failure = auto_sync
        self.host_ip: str | None = None
        self.device_filter: list[str] | None = None

    @property
    def max_world_size(self) -> int | None:
        """The seed's name for ``max_group_size``."""
        return self.max_group_size

    # Seed-style attribute aliases.
    @property
    def activeRanks_(self) -> torch.Tensor | None:
        return self.active_ranks

    @property
    def isExtension_(self) -> bool:
        return self.is_extension

    @property
    def maxWorldSize_(self) -> int | None:
        return self.max_group_size

    def set_host_ip(self, ip: str) -> None:
        """Address advertised to peers by groups using these options."""
        self.host_ip = str(ip)

    def set_device_filter(self, devices: list[str]) -> None:
        """Accepted for compatibility; the TCP/shm transport selects no NICs."""
        self.device_filter = [str(d) for d in devices]

    def __repr__(self) -> str:
        return (
            f"MooncakeBackendOptions(max_group_size={self.max_group_size}, "
            f"is_extension={self.is_extension}, "
            f"auto_deactivate_on_failure={self.auto_deactivate_on_failure}, "
            f"auto_sync_on_failure={self.auto_sync_on_failure}, "
            f"active_ranks={'None' if self.active_ranks is None else 'tensor'})"
        )
