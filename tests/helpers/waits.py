"""Bounded waits and free ports, shared by the suites' conftests (no pytest import)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any


def wait_until(pred: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Poll ``pred`` until truthy or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        val = pred()
        if val or time.monotonic() >= deadline:
            return val
        time.sleep(interval)


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1, outside the store clients' data
    port range (12300-14300)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not 12300 <= port <= 14300:
            return port
    raise RuntimeError("could not find a free port")
