"""Fixtures of the tensor IO suite.

Setup: one master and a client with a 256 MiB segment and a
128 MiB local buffer (``tstore``); tests use ``key()`` prefixes so they can
share the module's master. Helpers list stored keys, count master RPCs and
check log records on ``mooncake.store``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers.fixtures import store_fixture
from helpers.store_stats import rpcs, stored_keys  # noqa: F401  (re-exported for tests)

torch = pytest.importorskip("torch")

# A set-up store (256 MiB segment, 128 MiB local buffer) on the module's shared master.
tstore = store_fixture(256, 128)


@pytest.fixture
def full() -> Any:
    """``torch.arange(24, dtype=torch.float32).reshape(4, 6)``, the suite's reference tensor."""
    return torch.arange(24, dtype=torch.float32).reshape(4, 6)


class LogCheck:
    """Records of the ``mooncake.store`` logger, captured per test."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog
        caplog.set_level(logging.INFO, logger="mooncake.store")

    def clear(self) -> None:
        self.caplog.clear()

    def records(self) -> list[logging.LogRecord]:
        return [r for r in self.caplog.records if r.name == "mooncake.store"]

    def expect(self, method: str, *fragments: str) -> logging.LogRecord:
        """Assert one record names ``method`` and contains every fragment; clear."""
        for r in self.records():
            msg = r.getMessage()
            if msg.startswith(method + ":") and all(f in msg for f in fragments):
                self.clear()
                return r
        seen = [r.getMessage() for r in self.records()]
        raise AssertionError(f"no {method} log line with {fragments}; got {seen}")

    def none(self) -> None:
        assert self.records() == [], [r.getMessage() for r in self.records()]


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[LogCheck]:
    yield LogCheck(caplog)


@pytest.fixture
def keys_of(shared_master: Any) -> Callable[[str], list[str]]:
    """``keys_of(prefix)``: the stored keys starting with ``prefix``."""
    return lambda prefix: stored_keys(shared_master, prefix)
