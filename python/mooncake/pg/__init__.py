"""Mooncake PG: ``torch.distributed`` backends ``mooncake-cpu`` and ``mooncake``.

Importing this package registers both backends::

    import mooncake.pg  # noqa: F401
    dist.init_process_group("mooncake-cpu", rank=r, world_size=n)
    dist.all_reduce(t)

Environment: ``MOONCAKE_PG_TRANSPORT=tcp`` forces TCP between same-host
ranks (default ``auto``: shared memory); ``MOONCAKE_PG_HOST`` is the address
advertised to peers. While an op waits on a peer the engine PINGs it; a peer
silent for T (``MOONCAKE_PG_COLLECTIVE_TIMEOUT_US`` /
``MOONCAKE_PG_P2P_TIMEOUT_US``, default 10 s; or ``set_collective_timeout_us``
/ ``set_p2p_timeout_us``) is declared failed, and ops complete without it
(see ``get_failed_ranks_hint``). ``MOONCAKE_PG_FAULT`` holds fault-injection
rules (``mooncake.pg._testing``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from mooncake import _native
from mooncake.pg._backend import MooncakeProcessGroup, make_creator
from mooncake.pg._options import MooncakeBackendOptions
from mooncake.pg._work import MooncakeWork

__all__ = [
    "MooncakeBackendOptions",
    "MooncakeProcessGroup",
    "MooncakeWork",
    "extend_group_size_to",
    "get_active_ranks",
    "get_failed_ranks_hint",
    "get_local_success",
    "get_peer_state",
    "join_group",
    "recover_ranks",
    "set_collective_timeout_us",
    "set_p2p_timeout_us",
    "set_transfer_engine",
]

ACCELERATOR = "cuda"


def _register() -> None:
    for name, dev in (("mooncake-cpu", "cpu"), ("mooncake", ACCELERATOR)):
        if name in dist.Backend.backend_list:
            continue
        dist.Backend.register_backend(
            name, make_creator(name, dev), extended_api=True, devices=[dev]
        )


_register()


def _group(backend: Any) -> MooncakeProcessGroup:
    if isinstance(backend, MooncakeProcessGroup):
        return backend
    owner = getattr(backend, "_pg", None)
    if callable(owner):
        pg = owner()
        if isinstance(pg, MooncakeProcessGroup):
            return pg
    raise TypeError(
        f"expected a Mooncake process group (dist.group.WORLD or a new_group result), "
        f"got {type(backend).__name__}"
    )


def set_transfer_engine(engine: Any) -> None:
    """Only ``None`` (the built-in engine) is accepted in this version."""
    if engine is not None:
        raise TypeError("set_transfer_engine accepts only None in this version")


def get_active_ranks(backend: Any) -> torch.Tensor:
    """The live int32 active-rank mask (length = capacity)."""
    return _group(backend).active_ranks()


def get_failed_ranks_hint(work: MooncakeWork) -> torch.Tensor:
    """int32 tensor (length = capacity): 1 for ranks whose contribution ``work`` lost."""
    if not isinstance(work, MooncakeWork):
        raise TypeError("expected a Work returned by a mooncake op (use async_op=True)")
    cap = work._group.capacity
    m = work.failed_mask()
    return torch.tensor([(m >> i) & 1 for i in range(cap)], dtype=torch.int32)


def get_local_success(work: MooncakeWork) -> bool:
    """True when ``work`` obtained every active rank's contribution."""
    if not isinstance(work, MooncakeWork):
        raise TypeError("expected a Work returned by a mooncake op (use async_op=True)")
    return work.failed_mask() == 0


def set_collective_timeout_us(us: int) -> None:
    """Process-wide silence timeout T (µs) for collectives; applies to waits
    from now on (0 restores ``MOONCAKE_PG_COLLECTIVE_TIMEOUT_US`` / 10 s)."""
    _native.pg_set_collective_timeout_us(int(us))


def set_p2p_timeout_us(us: int) -> None:
    """Process-wide silence timeout T (µs) for send/recv; applies to waits
    from now on (0 restores ``MOONCAKE_PG_P2P_TIMEOUT_US`` / 10 s)."""
    _native.pg_set_p2p_timeout_us(int(us))


def _elastic(*_: Any, **__: Any) -> Any:
    raise NotImplementedError("the elastic protocol (spec §7) is not implemented yet")


extend_group_size_to = _elastic
get_peer_state = _elastic
recover_ranks = _elastic
join_group = _elastic
