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


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def machine_identity() -> str:
    """The running kernel (its boot id; the hostname where there is none):
    processes with equal strings share one machine's CPUs, whatever their
    network namespaces or containers."""
    return _boot_id() or socket.gethostname()


def cpu_mask() -> int:
    """The CPUs this process may run on, as a bit mask (bit ``c`` for CPU
    ``c``; every CPU where affinity is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        cpus = os.sched_getaffinity(0)
        if cpus:
            return sum(1 << c for c in cpus)
    return (1 << (os.cpu_count() or 1)) - 1


def host_identity() -> str:
    """Hostname, boot id and network namespace: equal strings mean the same
    kernel and the same network stack, so shared memory works. Processes in
    different network namespaces count as different hosts (containers, the
    cross-host tests), as they do for the store's same-host path."""
    boot = _boot_id()
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    return f"{socket.gethostname()}/{boot}/{netns}"
