"""``MooncakeBackendOptions``: the seed's and upstream's constructor forms."""

from __future__ import annotations

import os

import torch

MAX_CAPACITY = 64


class MooncakeBackendOptions:
    """Options for ``dist.init_process_group(..., pg_options=...)`` and ``new_group``.

    Accepted forms:

    * seed: ``MooncakeBackendOptions(active_ranks, is_extension=False, max_world_size=None)``
      where ``active_ranks`` is an int32 tensor the backend owns and updates in place;
    * upstream: ``MooncakeBackendOptions(max_group_size, is_extension=False,
      auto_deactivate_on_failure=True, auto_sync_on_failure=True)``.
    """

    def __init__(
        self,
        active_ranks: torch.Tensor | int | None = None,
        is_extension: bool = False,
        max_world_size: int | None = None,
        auto_deactivate_on_failure: bool | None = None,
        auto_sync_on_failure: bool = True,
        *,
        max_group_size: int | None = None,
    ) -> None:
        if isinstance(active_ranks, bool):
            raise TypeError("active_ranks must be an int32 tensor or an int max_group_size")
        if isinstance(active_ranks, int):
            if max_group_size is not None:
                raise TypeError("max_group_size given twice")
            max_group_size = active_ranks
            active_ranks = None
        if max_group_size is not None:
            if max_world_size is not None and max_world_size != max_group_size:
                raise ValueError("max_world_size and max_group_size disagree")
            max_world_size = max_group_size
        if active_ranks is not None:
            if not isinstance(active_ranks, torch.Tensor):
                raise TypeError("active_ranks must be a torch.Tensor")
            if active_ranks.dtype != torch.int32:
                raise ValueError(f"active_ranks must be int32, got {active_ranks.dtype}")
            if not active_ranks.is_contiguous() or active_ranks.dim() != 1:
                raise ValueError("active_ranks must be a contiguous 1-D tensor")
        if max_world_size is not None and (
            not isinstance(max_world_size, int) or not 1 <= max_world_size <= MAX_CAPACITY
        ):
            raise ValueError(f"max_world_size must be an int in [1, {MAX_CAPACITY}]")
        if auto_deactivate_on_failure is None:
            auto_deactivate_on_failure = os.environ.get(
                "MOONCAKE_PG_AUTO_DEACTIVATE_ON_FAILURE", "1"
            ) not in ("0", "false", "False")
        self.active_ranks = active_ranks
        self.is_extension = bool(is_extension)
        self.max_world_size = max_world_size
        self.auto_deactivate_on_failure = bool(auto_deactivate_on_failure)
        self.auto_sync_on_failure = bool(auto_sync_on_failure)
        self.host_ip: str | None = None
        self.device_filter: list[str] | None = None

    # Seed-style attribute aliases.
    @property
    def activeRanks_(self) -> torch.Tensor | None:
        return self.active_ranks

    @property
    def isExtension_(self) -> bool:
        return self.is_extension

    @property
    def maxWorldSize_(self) -> int | None:
        return self.max_world_size

    def set_host_ip(self, ip: str) -> None:
        """Address advertised to peers (overrides ``MOONCAKE_PG_HOST``)."""
        self.host_ip = str(ip)

    def set_device_filter(self, devices: list[str]) -> None:
        """Accepted for compatibility; has no effect on the TCP/shm transport."""
        self.device_filter = list(devices)

    def __repr__(self) -> str:
        return (
            f"MooncakeBackendOptions(max_world_size={self.max_world_size}, "
            f"is_extension={self.is_extension}, "
            f"auto_deactivate_on_failure={self.auto_deactivate_on_failure})"
        )
