"""Building blocks for the suites' fixtures and hooks."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def started_by(make: Callable[..., T], stop: Callable[[T], Any]) -> Iterator[Callable[..., T]]:
    """For a factory fixture (``yield from started_by(...)``): yields a
    function that calls ``make`` and keeps what it returns; at teardown
    ``stop`` is called on each of them, in the order they were made."""
    started: list[T] = []

    def start(*args: Any, **kw: Any) -> T:
        obj = make(*args, **kw)
        started.append(obj)
        return obj

    yield start
    for obj in started:
        stop(obj)


def stopped_after(obj: T, stop: Callable[[T], Any]) -> Iterator[T]:
    """For a fixture (``yield from stopped_after(...)``): yields ``obj``, then
    calls ``stop(obj)`` at teardown, whether or not the test passed."""
    try:
        yield obj
    finally:
        stop(obj)


def closed_at_teardown() -> Iterator[list[Any]]:
    """For a fixture (``yield from closed_at_teardown()``): yields a list the
    test appends stores to; at teardown each is closed, the last added
    first, an error from ``close`` ignored."""
    stores: list[Any] = []
    yield stores
    for s in reversed(stores):
        with contextlib.suppress(Exception):
            s.close()


def store_fixture(segment_mib: int, local_mib: int) -> Any:
    """A fixture (assign it to the fixture's name in a conftest): a set-up store
    with a ``segment_mib`` MiB segment and a ``local_mib`` MiB local buffer,
    from ``store_factory`` (on the module's shared master)."""

    @pytest.fixture
    def sized_store(store_factory: Any) -> Any:
        return store_factory(
            global_segment_size=segment_mib << 20, local_buffer_size=local_mib << 20
        )

    return sized_store


def default_timeouts(
    items: list[pytest.Item], config: pytest.Config, seconds: float, under: Path | None = None
) -> None:
    """When pytest-timeout is installed, gives each item without a ``timeout``
    marker a limit of ``seconds`` (thread method); with ``under``, only the
    items in that directory."""
    if not config.pluginmanager.hasplugin("timeout"):
        return
    for item in items:
        if under is not None and under not in Path(str(item.path)).parents:
            continue
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(seconds, method="thread"))
