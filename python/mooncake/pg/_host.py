"""Host identity and advertised address for peer records."""

from __future__ import annotations

import os
import socket


def advertised_host(explicit: str | None = None) -> str:
    """Address peers should dial: explicit, ``MOONCAKE_PG_HOST``, or the route to MASTER_ADDR."""
    if explicit:
        return explicit
    env = os.environ.get("MOONCAKE_PG_HOST")
    if env:
        return env
    master = os.environ.get("MASTER_ADDR")
    if master and master not in ("localhost", "127.0.0.1", "::1"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, 9))
                return str(s.getsockname()[0])
        except OSError:
            pass
    return "127.0.0.1"


def host_identity() -> str:
    """Hostname plus boot id: equal strings mean the same kernel, so shm works."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"
