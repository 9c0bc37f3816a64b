"""What a store holds and what a client did: the keys the master lists, and
a client's master RPCs and bytes read (``get_client_stats``)."""

from __future__ import annotations

from typing import Any


def stored_keys(master: Any, prefix: str) -> list[str]:
    """Keys from the master's ``/get_all_keys`` that start with ``prefix``, sorted."""
    status, body, _ = master.admin_get("/get_all_keys")
    assert status == 200
    return sorted(k for k in body.decode().splitlines() if k.startswith(prefix))


def rpcs(store: Any) -> int:
    """Cumulative master RPCs of a client."""
    return int(store.get_client_stats()["master_rpcs"])


def read_bytes(store: Any) -> int:
    """Bytes a client has read: local, same-host and over TCP."""
    s = store.get_client_stats()
    return int(s["bytes_read_local"] + s["bytes_read_same_host"] + s["bytes_read_tcp"])
