"""Fixtures of the structured-object suite: a store on the module's master
(``sstore``), a transfer over it with a per-test key prefix (``transfer``),
and helpers to count stored keys, bytes read and master RPCs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

MiB = 1 << 20


@pytest.fixture
def sstore(store_factory: Any) -> Any:
    return store_factory(global_segment_size=256 * MiB, local_buffer_size=32 * MiB)


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

    def keys(prefix: str) -> list[str]:
        status, body, _ = shared_master.admin_get("/get_all_keys")
        assert status == 200
        return sorted(k for k in body.decode().splitlines() if k.startswith(prefix + "/"))

    return keys


def read_bytes(store: Any) -> int:
    s = store.get_client_stats()
    return int(s["bytes_read_local"] + s["bytes_read_same_host"] + s["bytes_read_tcp"])


def rpcs(store: Any) -> int:
    return int(store.get_client_stats()["master_rpcs"])
