"""Upstream Mooncake's process-group surface (``mooncake.pg``, re-exported by
``mooncake.ep``): the names it exports, and each function's parameter names
as upstream's reference spells them (keyword calls written for upstream must
bind); ``join_group``'s timeout is an optional extra of ours."""

from __future__ import annotations

UPSTREAM_PG_FUNCTIONS: dict[str, list[str]] = {
    "set_host_ip": ["host_ip"],
    "set_device_filter": ["filters"],
    "set_transfer_engine": ["engine"],
    "get_active_ranks": ["backend"],
    "get_num_synced_ranks": ["backend"],
    "extend_group_size_to": ["backend", "size"],
    "get_peer_state": ["backend", "ranks"],
    "activate_ranks": ["backend", "ranks"],
    "recover_ranks": ["backend", "ranks"],
    "deactivate_ranks": ["backend", "ranks"],
    "join_group": ["backend", "timeout"],
    "get_failed_ranks_hint": ["work"],
    "get_local_success": ["work"],
    "get_current_epoch": ["backend"],
    "sync_after_failure": ["backend"],
    "set_collective_timeout_us": ["us"],
    "set_p2p_timeout_us": ["us"],
    "set_fault_reconciliation_window_us": ["us"],
}

UPSTREAM_PG_TYPES = (
    "MooncakeBackendOptions",
    "ProposalStatus",
    "ProposeViewUpdateResponse",
    "SyncAfterFailureResponse",
    "SyncAfterFailureStatus",
    "ViewUpdateStatus",
)

#: Every process-group name upstream exports, sorted.
UPSTREAM_PG_NAMES = sorted([*UPSTREAM_PG_TYPES, *UPSTREAM_PG_FUNCTIONS])
