"""The client's HTTP endpoints (``enable_client_http_server=True``):
``/health``, ``/metrics`` and ``/metrics/summary`` on ``client_http_port``,
as SGLang's HiCache backend turns them on (``enable_storage_metrics``)."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from conftest import (
    LOCAL_BUFFER_SIZE,
    SEGMENT_SIZE,
    Master,
    StoreFactory,
    free_port,
    http_request,
    port_open,
    wait_until,
)


def setup_with_http(s: Any, m: Master, port: int) -> int:
    return int(
        s.setup(
            "127.0.0.1",
            m.metadata_url,
            SEGMENT_SIZE,
            LOCAL_BUFFER_SIZE,
            "tcp",
            "",
            m.rpc_addr,
            enable_client_http_server=True,
            client_http_port=port,
        )
    )


def test_health_and_metrics(store_factory: StoreFactory, shared_master: Master) -> None:
    port = free_port()
    s = store_factory.raw()
    assert setup_with_http(s, shared_master, port) == 0
    assert wait_until(lambda: port_open(port), 10.0)
    status, body, headers = http_request(f"http://127.0.0.1:{port}/health")
    assert status == 200
    assert json.loads(body) == {"status": "healthy", "code": 0}
    assert headers["content-type"] == "application/json"
    assert s.put("http-metrics", b"z" * 1000) == 0
    assert s.get("http-metrics") == b"z" * 1000
    status, body, headers = http_request(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain")
    values = {
        line.split()[0]: int(line.split()[1])
        for line in body.decode().splitlines()
        if line and not line.startswith("#")
    }
    stats = s.get_client_stats()
    assert values["mooncake_transfer_write_bytes"] >= 1000
    assert values["mooncake_transfer_read_bytes"] >= 1000
    assert values["mooncake_client_master_rpcs"] <= stats["master_rpcs"]
    status, body, _ = http_request(f"http://127.0.0.1:{port}/metrics/summary")
    assert status == 200
    assert "master_rpcs: " in body.decode()
    # Closing the store stops the server and frees the port.
    assert s.close() == 0
    assert wait_until(lambda: not port_open(port), 10.0)


def test_dict_form_turns_it_on(store_factory: StoreFactory, shared_master: Master) -> None:
    port = free_port()
    s = store_factory.raw()
    rc = s.setup(
        {
            "local_hostname": "127.0.0.1",
            "metadata_server": shared_master.metadata_url,
            "master_server_addr": shared_master.rpc_addr,
            "enable_client_http_server": "true",
            "client_http_port": str(port),
        }
    )
    assert rc == 0
    assert wait_until(lambda: port_open(port), 10.0)
    assert http_request(f"http://127.0.0.1:{port}/health")[0] == 200


@pytest.mark.parametrize("port", [0, 70000])
def test_a_bad_port_fails_setup(
    store_factory: StoreFactory, shared_master: Master, port: int
) -> None:
    s = store_factory.raw()
    assert setup_with_http(s, shared_master, port) == -600
    assert s.health_check() == 1


def test_a_port_in_use_leaves_the_store_working(
    store_factory: StoreFactory, shared_master: Master
) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        s = store_factory.raw()
        assert setup_with_http(s, shared_master, port) == 0
        assert s.put("http-busy", b"ok") == 0 and s.get("http-busy") == b"ok"
        assert s.health_check() == 0


def test_off_by_default(store_factory: StoreFactory, shared_master: Master) -> None:
    port = free_port()
    s = store_factory.raw()
    rc = s.setup(
        "127.0.0.1",
        shared_master.metadata_url,
        SEGMENT_SIZE,
        LOCAL_BUFFER_SIZE,
        "tcp",
        "",
        shared_master.rpc_addr,
        client_http_port=port,
    )
    assert rc == 0
    assert not port_open(port)
