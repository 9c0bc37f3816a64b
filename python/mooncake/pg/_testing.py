"""Fault injection for tests, built into the transport.

Rules are ``action@key=val,...`` strings, several joined by ``;``; the same
rules can be given in ``MOONCAKE_PG_FAULT`` before the first group is
created. Actions: ``exit`` (``group``, ``seq``, ``point=before_send|mid_send|
after_send``, ``code``), ``freeze`` (``group``, ``seq``), ``drop_link``
(``group``, ``slot``), ``delay`` (``group``, ``slot``, ``ms``) and
``fail_connect`` (``group``, ``slot``). ``group`` is the torch group id
(``"0"`` for the default group); a missing key matches anything.
"""

from __future__ import annotations

from mooncake import _native


def inject_fault(rule: str) -> None:
    """Adds ``rule`` (or ``rule;rule``); raises ``ValueError`` if one is malformed."""
    _native.pg_inject_fault(rule)


def clear_faults() -> None:
    """Removes every rule; the hook is inert again."""
    _native.pg_clear_faults()


def fault_stats() -> dict[str, int]:
    """Every rule set, with the number of times it fired."""
    return dict(_native.pg_fault_stats())
