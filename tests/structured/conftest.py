"""Fixtures of the structured-object suite: a store on the module's master
(``sstore``), a transfer over it with a per-test key prefix (``transfer``),
and helpers to count stored keys, bytes read and master RPCs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from helpers.fixtures import store_fixture
from helpers.store_stats import read_bytes, rpcs, stored_keys  # noqa: F401  (re-exported for tests)

torch = pytest.importorskip("torch")

sstore = store_fixture(256, 32)


@pytest.fixture
def prefix(key: Callable[[str], str]) -> str:
    return key("rl").replace("/", "-")


@pytest.fixture
def transfer(sstore: Any, prefix: str) -> Any:
    from mooncake.structured_object_store import MooncakeBundleTransfer

    return MooncakeBundleTransfer(sstore, key_prefix=prefix)


@pytest.fixture
def keys_of(shared_master: Any) -> Callable[[str], list[str]]:
    """``keys_of(prefix)``: the keys stored under ``prefix/``."""

    return lambda prefix: stored_keys(shared_master, prefix + "/")
