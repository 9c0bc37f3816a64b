"""Host identity and advertised address for peer records."""

from __future__ import annotations

import os
import socket
from typing import Any

_LOOPBACK = ("", "localhost", "127.0.0.1", "::1")


def store_host(store: Any) -> str | None:
    """The host of the TCP store under ``store`` (through prefix stores), if any."""
    for _ in range(16):
        host = getattr(store, "host", None)
        if isinstance(host, str):
            return host
        inner = getattr(store, "underlying_store", None)
        if inner is None or inner is store:
            return None
        store = inner
    return None


def _route_to(addr: str) -> str | None:
    """The local address the kernel would use to reach ``addr``."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))
            return str(s.getsockname()[0])
    except OSError:
        return None


def advertised_host(explicit: str | None = None, rendezvous: str | None = None) -> str:
    """Address peers should dial: explicit, ``MOONCAKE_PG_HOST``, or the local
    address on the route to the rendezvous host (``MASTER_ADDR``, else the
    host of the TCP store the process group was given, as with
    ``init_method="tcp://host:port"``); 127.0.0.1 when that host is local."""
    if explicit:
        return explicit
    env = os.environ.get("MOONCAKE_PG_HOST")
    if env:
        return env
    for target in (os.environ.get("MASTER_ADDR"), rendezvous):
        if target and target not in _LOOPBACK:
            found = _route_to(target)
            if found:
                return found
    return "127.0.0.1"


def host_identity() -> str:
    """Hostname, boot id and network namespace: equal strings mean the same
    kernel and the same network stack, so shared memory works. Processes in
    different network namespaces count as different hosts (containers, the
    cross-host tests), as they do for the store's same-host path."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    return f"{socket.gethostname()}/{boot}/{netns}"
