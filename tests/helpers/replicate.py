"""Building ``ReplicateConfig`` values."""

from __future__ import annotations

from typing import Any

from mooncake.store import ReplicateConfig


def replicate_config(replica_num: int = 1, preferred: str = "") -> Any:
    """A ``ReplicateConfig`` with ``replica_num`` replicas, preferring the
    segment ``preferred`` when it is not empty."""
    c = ReplicateConfig()
    c.replica_num = replica_num
    if preferred:
        c.preferred_segment = preferred
    return c
