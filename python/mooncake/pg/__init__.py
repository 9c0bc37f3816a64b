"""Mooncake PG: ``torch.distributed`` backends ``mooncake-cpu`` and ``mooncake``.

Importing this package registers both backends::

    import mooncake.pg  # noqa: F401
    dist.init_process_group("mooncake-cpu", rank=r, world_size=n)
    dist.all_reduce(t)

Dynamic membership (upstream Mooncake's API): a group reserves
``max_group_size`` rank slots (``MooncakeBackendOptions``); which of them
participate is the committed view, numbered by an epoch. A membership
coordinator, started by rank 0 of the default group (the process that hosts
torch's rendezvous store), validates and distributes every change;
``activate_ranks``/``recover_ranks`` and ``deactivate_ranks`` propose one
from any member, ``join_group`` blocks a joining process until its
activation commits, and failures are reconciled from the members' link
reports. Killing any rank other than rank 0 is survivable.

Environment: ``MOONCAKE_PG_TRANSPORT=tcp`` forces TCP between same-host
ranks (default ``auto``: shared memory); ``MOONCAKE_PG_HOST`` is the address
advertised to peers. While an op waits on a peer the engine PINGs it; a peer
silent for T (``MOONCAKE_PG_COLLECTIVE_TIMEOUT_US`` /
``MOONCAKE_PG_P2P_TIMEOUT_US``, default 10 s; or ``set_collective_timeout_us``
/ ``set_p2p_timeout_us``) is declared failed; a peer whose process ended is
declared failed at once. ``MOONCAKE_PG_FAULT`` holds fault-injection rules
(``mooncake.pg._testing``).
"""

from __future__ import annotations

import enum
from typing import Any

import torch
import torch.distributed as dist

from mooncake import _native
from mooncake.pg import _rendezvous
from mooncake.pg._backend import MooncakeProcessGroup, make_creator
from mooncake.pg._options import MooncakeBackendOptions
from mooncake.pg._work import MooncakeWork

__all__ = [
    "MooncakeBackendOptions",
    "MooncakeProcessGroup",
    "MooncakeWork",
    "ProposalStatus",
    "ProposeViewUpdateResponse",
    "SyncAfterFailureResponse",
    "SyncAfterFailureStatus",
    "ViewUpdateStatus",
    "activate_ranks",
    "deactivate_ranks",
    "extend_group_size_to",
    "get_active_ranks",
    "get_current_epoch",
    "get_failed_ranks_hint",
    "get_local_success",
    "get_num_synced_ranks",
    "get_peer_state",
    "join_group",
    "recover_ranks",
    "set_collective_timeout_us",
    "set_device_filter",
    "set_fault_reconciliation_window_us",
    "set_host_ip",
    "set_p2p_timeout_us",
    "set_transfer_engine",
    "sync_after_failure",
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


class ProposalStatus(enum.IntEnum):
    """Outcome of ``activate_ranks`` / ``deactivate_ranks`` (upstream's codes)."""

    Rejected = 0
    Applied = 1
    AppliedWithDroppedRanks = 2


#: Upstream's earlier name of ``ProposalStatus``.
ViewUpdateStatus = ProposalStatus


class SyncAfterFailureStatus(enum.IntEnum):
    """Outcome of ``sync_after_failure`` (upstream's codes)."""

    Reconciled = 0
    NoPending = 1
    Rejected = 2


class ProposeViewUpdateResponse:
    """What a membership proposal did."""

    __slots__ = ("_dropped", "_epoch", "_reason", "_status")

    def __init__(
        self,
        status: ProposalStatus | int,
        new_epoch: int,
        dropped_ranks: list[int],
        reject_reason: str,
    ) -> None:
        self._status = ProposalStatus(status)
        self._epoch = int(new_epoch)
        self._dropped = list(dropped_ranks)
        self._reason = str(reject_reason)

    @property
    def status(self) -> ProposalStatus:
        """``Applied``, ``AppliedWithDroppedRanks`` or ``Rejected``."""
        return self._status

    @property
    def new_epoch(self) -> int:
        """The group's epoch after the proposal."""
        return self._epoch

    @property
    def dropped_ranks(self) -> list[int]:
        """Requested ranks left out (they left, or never called ``join_group`` in time)."""
        return list(self._dropped)

    @property
    def reject_reason(self) -> str:
        """Why the proposal was rejected ("" otherwise)."""
        return self._reason

    def __repr__(self) -> str:
        return (
            f"ProposeViewUpdateResponse(status={self._status.name}, new_epoch={self._epoch}, "
            f"dropped_ranks={self._dropped}, reject_reason={self._reason!r})"
        )


class SyncAfterFailureResponse:
    """What ``sync_after_failure`` did."""

    __slots__ = ("_reason", "_status")

    def __init__(self, status: SyncAfterFailureStatus, reject_reason: str) -> None:
        self._status = SyncAfterFailureStatus(status)
        self._reason = str(reject_reason)

    @property
    def status(self) -> SyncAfterFailureStatus:
        """``Reconciled``, ``NoPending`` or ``Rejected``."""
        return self._status

    @property
    def reject_reason(self) -> str:
        """Why it was rejected ("" otherwise)."""
        return self._reason

    def __repr__(self) -> str:
        return (
            f"SyncAfterFailureResponse(status={self._status.name}, reject_reason={self._reason!r})"
        )


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


def _work(work: Any) -> MooncakeWork:
    if not isinstance(work, MooncakeWork):
        raise TypeError(
            f"expected a Work returned by a mooncake op (use async_op=True), "
            f"got {type(work).__name__}"
        )
    return work


def set_host_ip(host_ip: str) -> None:
    """Address advertised to peers by groups created afterwards (overrides
    ``MOONCAKE_PG_HOST``); ``""`` restores the default."""
    if not isinstance(host_ip, str):
        raise TypeError(f"set_host_ip: host_ip must be a str, got {type(host_ip).__name__}")
    _rendezvous.HOST_OVERRIDE[0] = host_ip or None


def set_device_filter(filters: list[str]) -> None:
    """Restricts NIC/HCA selection in upstream's RDMA transport. Accepted for
    compatibility: the TCP/shared-memory transport selects no devices."""
    if isinstance(filters, str) or not all(isinstance(f, str) for f in filters):
        raise TypeError("set_device_filter: filters must be a list of str")


def set_transfer_engine(engine: Any) -> None:
    """Only ``None`` (the built-in transport) is accepted: this backend owns its
    TCP/shared-memory transport and cannot use an external TransferEngine."""
    if engine is not None:
        raise TypeError(
            "set_transfer_engine: this build's PG backend owns its transport; only None is "
            f"accepted, got {type(engine).__name__}"
        )


def get_active_ranks(backend: Any) -> torch.Tensor:
    """The live int32 active-rank mirror (length = capacity)."""
    return _group(backend).active_ranks()


def get_num_synced_ranks(backend: Any) -> int:
    """How many rank slots are ready for the data plane with this rank
    (itself included): the number of ``True`` entries ``get_peer_state``
    would report over the whole capacity."""
    return int(_group(backend)._native.num_synced())


def extend_group_size_to(backend: Any, size: int) -> None:
    """Raises the group's capacity to ``size`` (local; the new slots start
    inactive, the visible size does not change). The active-rank tensor is
    resized in place. A smaller size or one above 64 raises ``ValueError``."""
    _group(backend)._extend(size)


def get_peer_state(backend: Any, ranks: list[int]) -> list[bool]:
    """Per rank, whether it is ready for the data plane with this rank: a live
    link to the process currently registered at that rank. Local and
    communication-free (a best-effort readiness query)."""
    return _group(backend)._peer_state(ranks)


def activate_ranks(backend: Any, ranks: list[int]) -> ProposeViewUpdateResponse:
    """Proposes activating ``ranks`` through the coordinator. One call from
    any online rank suffices; equivalent calls are safe. Waits (up to
    ``MOONCAKE_PG_ADMISSION_TIMEOUT_US``, 60 s) for the targets to call
    ``join_group``, then commits the view on every member before returning."""
    return ProposeViewUpdateResponse(*_group(backend)._propose(True, ranks))


#: Compatibility alias of ``activate_ranks``.
recover_ranks = activate_ranks


def deactivate_ranks(backend: Any, ranks: list[int]) -> ProposeViewUpdateResponse:
    """Proposes deactivating ``ranks``: they leave the active set (slots are
    not renumbered; their processes stay alive and local-only and may
    ``join_group`` again). Rejected when it would leave no active rank."""
    return ProposeViewUpdateResponse(*_group(backend)._propose(False, ranks))


def join_group(backend: Any, timeout: Any = None) -> None:
    """On a joining (``is_extension=True``) or deactivated rank: confirms it is
    ready and blocks until an activation commits. Raises ``RuntimeError`` on an
    active rank and ``TimeoutError`` after ``timeout`` (default: the group's
    timeout)."""
    _group(backend)._join(timeout)


def get_failed_ranks_hint(work: Any) -> torch.Tensor:
    """int32 tensor (length = capacity): 1 for ranks whose part ``work`` lost."""
    w = _work(work)
    cap = w._group_capacity()
    m = w.failed_mask()
    return torch.tensor([(m >> i) & 1 for i in range(cap)], dtype=torch.int32)


def get_local_success(work: Any) -> bool:
    """True when every transfer ``work`` needed completed at this rank."""
    return _work(work).failed_mask() == 0


def get_current_epoch(backend: Any) -> int:
    """Epoch of the membership view this rank applied (increases on every change)."""
    return int(_group(backend)._native.epoch())


def sync_after_failure(backend: Any) -> SyncAfterFailureResponse:
    """Reports this rank's current link observations, waits for any pending
    reconciliation and applies the resulting view."""
    status, _epoch, reason = _group(backend)._sync_after_failure()
    return SyncAfterFailureResponse(SyncAfterFailureStatus(status), reason)


def set_collective_timeout_us(us: int) -> None:
    """Process-wide silence timeout T (µs) for collectives; applies to waits
    from now on (0 restores ``MOONCAKE_PG_COLLECTIVE_TIMEOUT_US`` / 10 s)."""
    _native.pg_set_collective_timeout_us(int(us))


def set_p2p_timeout_us(us: int) -> None:
    """Process-wide silence timeout T (µs) for send/recv; applies to waits
    from now on (0 restores ``MOONCAKE_PG_P2P_TIMEOUT_US`` / 10 s)."""
    _native.pg_set_p2p_timeout_us(int(us))


def set_fault_reconciliation_window_us(us: int) -> None:
    """The coordinator's fault-reconciliation window (µs; 0 restores 30 s).
    Takes effect in the process hosting the coordinator (rank 0). The
    coordinator decides earlier whenever every member nobody suspects has
    reported (in a group with ``auto_deactivate_on_failure=False``: has
    called ``sync_after_failure``)."""
    _native.pg_set_fault_reconciliation_window_us(int(us))
