"""Calls on a closed or never-set-up store return error values, never crash.

Upstream 0.3.13 segfaults on most of these, so each scenario runs in a child
process (tests/helpers/closed_store.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import HELPERS, Master, run_script

B = {"bytes": ""}
EXPECTED: dict[str, Any] = {
    "put": -600,
    "put_parts": -600,
    "put_batch": -600,
    "upsert": -600,
    "get": B,
    "get_batch": [B, B],
    "get_buffer": None,
    "batch_get_buffer": [None, None],
    "get_size": -600,
    "is_exist": -600,
    "batch_is_exist": [-600, -600],
    "remove": -600,
    "batch_remove": [-600, -600],
    "remove_by_regex": -600,
    "remove_all": -600,
    "register_buffer": -600,
    "unregister_buffer": -600,
    "put_from": -600,
    "get_into": -600,
    "batch_put_from": [-600, -600],
    "batch_get_into": [-600, -600],
    "upsert_from": -600,
    "get_into_ranges": [[[-600], [-600, -600]]],
    "get_hostname": "",
    "health_check": 1,
    "close": 0,
}


def _run(args: list[str]) -> dict[str, Any]:
    r = run_script([str(HELPERS / "closed_store.py"), *args], timeout=60)
    assert r.returncode == 0, f"child crashed rc={r.returncode}\n{r.stderr[-3000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _check(out: dict[str, Any]) -> None:
    bad = {k: (out.get(k), v) for k, v in EXPECTED.items() if out.get(k) != v}
    assert not bad, f"(got, expected): {bad}"


@pytest.mark.ours
def test_never_set_up_store() -> None:
    _check(_run(["never"]))


@pytest.mark.ours
def test_closed_store(master: Master) -> None:
    _check(_run(["closed", master.metadata_url, master.rpc_addr]))
