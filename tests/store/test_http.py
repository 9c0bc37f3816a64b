"""Embedded metadata server and admin server."""

from __future__ import annotations

import json

import pytest
from conftest import Master, StoreFactory, http_request, wait_until


def _md(m: Master, key: str | None) -> str:
    return m.metadata_url + ("" if key is None else f"?key={key}")


def test_metadata_crud(shared_master: Master) -> None:
    m = shared_master
    status, body, _ = http_request(_md(m, "k"), "PUT", b'{"a":1}')
    assert status == 200
    assert body.decode().strip() == "metadata updated"
    status, body, headers = http_request(_md(m, "k"))
    assert status == 200
    assert body == b'{"a":1}'
    assert headers.get("content-type", "").startswith("application/json")
    status, body, _ = http_request(_md(m, "k"), "DELETE")
    assert status == 200
    assert body.decode().strip() == "metadata deleted"
    status, body, _ = http_request(_md(m, "k"), "DELETE")
    assert status == 404
    status, body, _ = http_request(_md(m, "k"))
    assert status == 404
    assert body.decode().strip() == "metadata not found"


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_metadata_missing_key(shared_master: Master, method: str) -> None:
    body = b"{}" if method == "PUT" else None
    status, resp, _ = http_request(_md(shared_master, None), method, body)
    assert status == 400
    assert resp.decode().strip() == "Missing key parameter"


def test_metadata_rpc_meta_duplicate(shared_master: Master) -> None:
    url = _md(shared_master, "mooncake/rpc_meta/h")
    assert http_request(url, "PUT", b'{"ip":"1"}')[0] == 200
    status, body, _ = http_request(url, "PUT", b'{"ip":"1"}')
    assert status == 200
    assert body.decode().strip() == "metadata unchanged"
    status, body, _ = http_request(url, "PUT", b'{"ip":"2"}')
    assert status == 400
    assert "Duplicate rpc_meta key not allowed" in body.decode()
    assert http_request(url)[1] == b'{"ip":"1"}'
    http_request(url, "DELETE")


def test_metadata_health_and_unknown(shared_master: Master) -> None:
    base = shared_master.metadata_url.rsplit("/", 1)[0]
    status, body, _ = http_request(base + "/health")
    assert status == 200 and body.decode().strip() == "OK"
    assert http_request(base + "/nope")[0] == 404


def test_admin_health(shared_master: Master) -> None:
    status, body, _ = shared_master.admin_get("/health")
    assert status == 200
    assert json.loads(body) == {
        "status": "ok",
        "role": "leader",
        "ha_state": "serving",
        "service_ready": True,
        "leader_address": None,
        "view_version": None,
    }


def test_admin_unknown_path(shared_master: Master) -> None:
    assert shared_master.admin_get("/does_not_exist")[0] == 404


METRIC_NAMES = [
    "master_allocated_bytes",
    "master_total_capacity_bytes",
    "master_key_count",
    "master_soft_pin_key_count",
    "master_active_clients",
    "master_put_start_requests_total",
    "master_put_start_failures_total",
    "master_put_start_alloc_failures_total",
    "master_put_start_partial_allocations_total",
    "master_get_replica_list_requests_total",
    "master_remove_requests_total",
    "master_ping_requests_total",
    "master_mount_segment_requests_total",
    "master_unmount_segment_requests_total",
    "master_successful_evictions_total",
    "master_attempted_evictions_total",
    "master_evicted_key_count",
    "master_evicted_size_bytes",
]


def test_metrics_format(shared_master: Master) -> None:
    status, body, headers = shared_master.admin_get("/metrics")
    assert status == 200
    assert headers.get("content-type", "").startswith("text/plain; version=0.0.4")
    text = body.decode()
    assert "# HELP " in text and "# TYPE " in text
    for name in METRIC_NAMES:
        assert shared_master.metric(name) is not None, name


def test_key_count_and_keys(store_factory: StoreFactory, master: Master) -> None:
    assert master.metric("master_key_count") == 0
    assert master.admin_get("/get_all_keys")[:2] == (200, b"")
    s = store_factory(master)
    assert wait_until(lambda: master.metric("master_active_clients") == 1, 3.0)
    assert master.metric("master_total_capacity_bytes") == 64 << 20
    assert s.put("k1", b"hello") == 0
    assert master.metric("master_key_count") == 1
    assert (master.metric("master_allocated_bytes") or 0) >= 5
    status, body, _ = master.admin_get("/get_all_keys")
    assert status == 200 and body == b"k1\n"
    assert s.put("k2", b"x") == 0
    status, body, _ = master.admin_get("/get_all_keys")
    assert sorted(body.decode().splitlines()) == ["k1", "k2"]
    assert body.endswith(b"\n")


def test_query_key(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    assert s.put("qk", b"hello") == 0
    status, body = master.query_key("qk")
    assert status == 200
    assert body["success"] is True
    assert len(body["data"]) == 1
    rep = body["data"][0]
    assert rep["size_"] == 5
    assert rep["protocol_"] == "tcp"
    assert rep["transport_endpoint_"] == s.get_hostname()
    assert isinstance(rep["buffer_address_"], int)
    # /query_key grants a lease
    assert s.remove("qk") == -706


def test_query_key_missing(shared_master: Master) -> None:
    status, body = shared_master.query_key("missing")
    assert status == 404
    assert body == {"success": False, "error_code": -704, "error_message": "OBJECT_NOT_FOUND"}


def test_get_all_segments(store_factory: StoreFactory, master: Master) -> None:
    assert master.segments() == []
    a = store_factory(master)
    b = store_factory(master)
    assert sorted(master.segments()) == sorted([a.get_hostname(), b.get_hostname()])
    _, body, _ = master.admin_get("/get_all_segments")
    assert body.endswith(b"\n")
