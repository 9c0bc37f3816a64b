"""Bounded waits and free ports, shared by the suites' conftests (no pytest import)."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
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


def assert_reads_converge(
    read: Callable[[str], bytes], want: dict[str, bytes], after: str, timeout: float = 10.0
) -> None:
    """Reads every key of ``want`` until each reads back as its value (bounded
    by ``timeout``); meanwhile a read may find nothing (``b""``), never an
    old version (``after`` names the event, for the message)."""
    deadline = time.monotonic() + timeout
    while True:
        got = {k: read(k) for k in want}
        for k, v in got.items():
            assert v in (b"", want[k]), f"{k}: an old version after the {after}"
        if got == want or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert got == want, got


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


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """Status and body of a GET of ``url``: an HTTP error's own status and
    body, ``(0, b"")`` when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""
