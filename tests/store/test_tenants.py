"""Tenants (``setup(..., tenant_id=...)``) and the master's
``--enable_multi_tenants`` with the file connector: each tenant's keys are
invisible to every other tenant, bulk removals touch only the caller's
tenant, writes are admitted only for tenants with a policy
(TENANT_NOT_REGISTERED, -1701) and within their quota
(TENANT_QUOTA_EXCEEDED, -1700), the admin API lists and changes the
policies and writes the file back, and a master without multi-tenancy lets
every tenant share one namespace (upstream's behaviour)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Master, StoreFactory, http_request, setup_positional

MiB = 1 << 20
TENANT_QUOTA_EXCEEDED = -1700
TENANT_NOT_REGISTERED = -1701
NOT_FOUND = -704

POLICY = """version: 1

tenants:
  - name: tenant-a
    quota: 4MB

  - name: tenant-b
    quota: 64MB
"""


def tenant_store(sf: StoreFactory, m: Master, tenant: str) -> Any:
    s = sf.raw()
    assert setup_positional(s, m, tenant_id=tenant) == 0
    return s


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    p = tmp_path / "tenant_quotas.yaml"
    p.write_text(POLICY)
    return p


@pytest.fixture
def mt_master(master_factory: Callable[..., Master], policy: Path) -> Master:
    return master_factory(enable_multi_tenants=True, tenant_quota_connector_uri=str(policy))


@pytest.fixture
def tenants_ab(store_factory: StoreFactory, mt_master: Master) -> tuple[Any, Any]:
    """Clients of ``tenant-a`` (quota 4 MB) and ``tenant-b`` (64 MB) on ``mt_master``."""
    return (
        tenant_store(store_factory, mt_master, "tenant-a"),
        tenant_store(store_factory, mt_master, "tenant-b"),
    )


def api(
    m: Master, method: str, query: str = "", body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    status, raw, _ = http_request(m.admin_url + "/api/v1/tenant_quotas" + query, method, data)
    return status, json.loads(raw)


def test_each_tenant_sees_only_its_own_keys(tenants_ab: tuple[Any, Any]) -> None:
    a, b = tenants_ab
    assert a.put("k", b"from a") == 0
    assert b.is_exist("k") == 0
    assert b.get("k") == b""
    assert b.put("k", b"from b") == 0
    assert a.get("k") == b"from a"
    assert b.get("k") == b"from b"
    assert a.batch_is_exist(["k", "only-b"]) == [1, 0]
    # Keys that look like another namespace's stored form stay the caller's.
    assert b.put("tenant-a\0k", b"b's odd key") == 0
    assert a.get("k") == b"from a"
    assert b.get("tenant-a\0k") == b"b's odd key"
    # A removal by one tenant leaves the other's key alone.
    assert b.remove("k", True) == 0
    assert a.get("k") == b"from a"
    assert b.get("k") == b""


def test_bulk_removals_stay_inside_the_tenant(tenants_ab: tuple[Any, Any]) -> None:
    a, b = tenants_ab
    for s, v in ((a, b"a"), (b, b"b")):
        for k in ("x1", "x2", "y1"):
            assert s.put(k, v) == 0
    assert a.remove_by_regex("^x", True) == 2
    assert [a.is_exist(k) for k in ("x1", "x2", "y1")] == [0, 0, 1]
    assert [b.is_exist(k) for k in ("x1", "x2", "y1")] == [1, 1, 1]
    assert b.remove_all(True) == 3
    assert a.get("y1") == b"a"


def test_writes_need_a_registered_tenant(store_factory: StoreFactory, mt_master: Master) -> None:
    # "default" is not special: without a policy it may not write.
    d = tenant_store(store_factory, mt_master, "default")
    other = tenant_store(store_factory, mt_master, "nobody")
    assert d.put("k", b"v") == TENANT_NOT_REGISTERED
    assert other.put("k", b"v") == TENANT_NOT_REGISTERED
    assert d.is_exist("k") == 0
    assert other.get("k") == b""


def test_quota_bounds_a_tenants_memory_and_frees_with_removal(
    tenants_ab: tuple[Any, Any], mt_master: Master
) -> None:
    a, b = tenants_ab
    for i in range(4):
        assert a.put(f"p{i}", bytes([i]) * MiB) == 0, i
    # Quota 4 MiB, 4 MiB charged: the next MiB is refused and not stored.
    assert a.put("p4", b"x" * MiB) == TENANT_QUOTA_EXCEEDED
    assert a.is_exist("p4") == 0
    assert a.put_batch(["q0", "q1"], [b"q" * 64, b"r" * 64]) == TENANT_QUOTA_EXCEEDED
    # Another tenant is not held back by a's quota.
    assert b.put("p4", b"y" * MiB) == 0
    # Everything a stored is intact, and a removal gives the room back.
    for i in range(4):
        assert a.get(f"p{i}") == bytes([i]) * MiB
    assert a.remove("p0", True) == 0
    assert a.put("p4", b"x" * MiB) == 0
    assert a.get("p4") == b"x" * MiB
    status, body = api(mt_master, "GET", "?tenant_id=tenant-a")
    assert status == 200 and body["success"], body
    d = body["data"]
    assert d["tenant_id"] == "tenant-a"
    assert d["requested_quota_bytes"] == d["effective_quota_bytes"] == 4 * MiB
    assert d["charged_bytes"] == 4 * MiB
    assert not d["over_quota"] and not d["admission_closed"] and d["has_explicit_policy"]
    status, raw, _ = mt_master.admin_get("/metrics")
    lines = raw.decode().splitlines()
    assert f'mooncake_tenant_quota_charged_bytes{{tenant_id="tenant-a"}} {4 * MiB}' in lines
    assert f'mooncake_tenant_quota_effective_bytes{{tenant_id="tenant-b"}} {64 * MiB}' in lines
    assert 'mooncake_tenant_quota_over_quota{tenant_id="tenant-a"} 0' in lines


def test_admin_api_lists_changes_and_persists_policies(
    store_factory: StoreFactory, mt_master: Master, policy: Path
) -> None:
    status, body = api(mt_master, "GET")
    assert status == 200
    assert [t["tenant_id"] for t in body["data"]] == ["tenant-a", "tenant-b"]
    # A new tenant: admitted once its policy exists, and the file has it.
    c = tenant_store(store_factory, mt_master, "tenant-c")
    assert c.put("k", b"v") == TENANT_NOT_REGISTERED
    status, body = api(mt_master, "PUT", "?tenant_id=tenant-c", {"requested_quota_bytes": 2 * MiB})
    assert status == 200 and body["data"]["requested_quota_bytes"] == 2 * MiB, body
    assert "tenant-c" in policy.read_text()
    assert c.put("k", b"v") == 0
    # A tenant that owns objects cannot lose its policy.
    status, body = api(mt_master, "DELETE", "?tenant_id=tenant-c")
    assert (status, body["error_code"]) == (409, -1702), body
    assert c.remove("k", True) == 0
    status, body = api(mt_master, "DELETE", "?tenant_id=tenant-c")
    assert status == 200, body
    assert "tenant-c" not in policy.read_text()
    assert c.put("k", b"v") == TENANT_NOT_REGISTERED
    # Bad input: a clear 4xx and nothing changed.
    for query, payload in [
        ("?tenant_id=tenant-d", {"requested_quota_bytes": 0}),
        ("?tenant_id=_reserved", {"requested_quota_bytes": 1}),
        ("", {"requested_quota_bytes": 1}),
        ("?tenant_id=tenant-d", {"quota": 1}),
    ]:
        status, body = api(mt_master, "PUT", query, payload)
        assert status == 400 and body["error_code"] == -600, (query, body)
    assert api(mt_master, "GET", "?tenant_id=tenant-d")[0] == 404
    assert api(mt_master, "DELETE", "?tenant_id=tenant-d")[0] == 404
    assert "tenant-d" not in policy.read_text()


def test_a_restarted_master_reads_the_policy_the_api_wrote(mt_master: Master) -> None:
    assert api(mt_master, "PUT", "?tenant_id=tenant-e", {"requested_quota_bytes": 123})[0] == 200
    mt_master.restart()
    status, body = api(mt_master, "GET", "?tenant_id=tenant-e")
    assert status == 200 and body["data"]["requested_quota_bytes"] == 123, body


def test_without_multi_tenancy_every_tenant_shares_the_namespace(
    store_factory: StoreFactory, master: Master
) -> None:
    a = tenant_store(store_factory, master, "tenant-a")
    d = tenant_store(store_factory, master, "default")
    assert a.put("shared", b"v") == 0
    assert d.get("shared") == b"v"
    status, body = api(master, "GET")
    assert (status, body["error_code"]) == (409, -1011), body


@pytest.mark.parametrize("tenant", ["_reserved", "tab\there"])
def test_setup_refuses_a_name_no_tenant_may_have(
    store_factory: StoreFactory, master: Master, tenant: str
) -> None:
    s = store_factory.raw()
    assert setup_positional(s, master, tenant_id=tenant) != 0
    assert s.put("k", b"v") != 0


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--enable_multi_tenants"], "--tenant_quota_connector_uri"),
        (
            ["--enable_multi_tenants", "--tenant_quota_connector_type=etcd"],
            "--tenant_quota_connector_type",
        ),
        (
            ["--enable_multi_tenants", "--tenant_quota_connector_uri=/nonexistent/q.yaml"],
            "/nonexistent/q.yaml",
        ),
    ],
)
def test_master_refuses_a_policy_it_cannot_use(flags: list[str], needle: str) -> None:
    r = subprocess.run(
        ["mooncake_master", *flags], check=False, capture_output=True, text=True, timeout=30
    )
    assert r.returncode != 0
    assert needle in r.stderr + r.stdout


def test_master_refuses_a_malformed_policy_file(tmp_path: Path) -> None:
    bad = tmp_path / "q.yaml"
    bad.write_text("version: 1\ntenants:\n  - name: a\n    quota: 5XB\n")
    r = subprocess.run(
        ["mooncake_master", "--enable_multi_tenants", f"--tenant_quota_connector_uri={bad}"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode != 0
    assert "unknown unit" in r.stderr + r.stdout
