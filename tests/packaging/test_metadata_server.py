"""``mooncake_http_metadata_server`` as a real process: upstream's flags and
routes, the master's codes (it is the same service), bad input answered
with 4xx while it keeps serving, a port in use, and the in-process
``KVBootstrapServer``; a store client publishes its segment through it."""

from __future__ import annotations

import signal
import socket
import time
from typing import Any

import pytest
from conftest import Proc, command, free_port, http, raw_http, run, wait_port


@pytest.fixture
def server(spawn: Any) -> tuple[Proc, int]:
    port = free_port()
    p = spawn(
        [command("mooncake_http_metadata_server"), "--host", "127.0.0.1", "--port", str(port)]
    )
    wait_port(port, p)
    return p, port


def url(port: int, key: str | None = None) -> str:
    base = f"http://127.0.0.1:{port}/metadata"
    return base if key is None else f"{base}?key={key}"


def test_put_get_delete(server: tuple[Proc, int]) -> None:
    _, port = server
    assert http(url(port, "k"))[:2] == (404, b"metadata not found")
    status, body, _ = http(url(port, "k"), "PUT", b'{"a": 1}')
    assert (status, body) == (200, b"metadata updated")
    status, body, headers = http(url(port, "k"))
    assert (status, body) == (200, b'{"a": 1}')
    assert headers["content-type"] == "application/json"
    assert http(url(port, "k"), "PUT", b"two")[:2] == (200, b"metadata updated")
    assert http(url(port, "k"), "DELETE")[:2] == (200, b"metadata deleted")
    assert http(url(port, "k"), "DELETE")[:2] == (404, b"metadata not found")
    assert http(f"http://127.0.0.1:{port}/health")[:2] == (200, b"OK")


def test_rpc_meta_keeps_its_first_value(server: tuple[Proc, int]) -> None:
    _, port = server
    k = "mooncake/rpc_meta/10.0.0.1:12384"
    assert http(url(port, k), "PUT", b"first")[0] == 200
    assert http(url(port, k), "PUT", b"other")[:2] == (400, b"Duplicate rpc_meta key not allowed")
    assert http(url(port, k))[1] == b"first"


def test_malformed_keys_and_bodies_get_4xx_and_it_keeps_serving(
    server: tuple[Proc, int],
) -> None:
    proc, port = server
    assert http(url(port, "good"), "PUT", b"v")[0] == 200
    for bad in [url(port), url(port, ""), url(port, "%ff"), url(port, "a%zz"), url(port, "%4")]:
        for method in ("GET", "PUT", "DELETE"):
            status, body, _ = http(bad, method, b"x" if method == "PUT" else None)
            assert status == 400, (method, bad, status, body)
    # A body over the limit (16 MiB), announced: 413 before it is read.
    head = (
        f"PUT /metadata?key=big HTTP/1.1\r\nHost: x\r\nContent-Length: {17 << 20}\r\n\r\n"
    ).encode()
    assert raw_http(port, head + b"x" * 1024).startswith(b"HTTP/1.1 413")
    # Broken chunked encoding: 400.
    chunked = (
        b"PUT /metadata?key=chunky HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\nnot-a-chunk\r\n"
    )
    assert raw_http(port, chunked).startswith(b"HTTP/1.1 400")
    # A body shorter than announced, then the connection closes.
    raw_http(port, b"PUT /metadata?key=short HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab")
    # Not HTTP at all.
    raw_http(port, b"\x16\x03\x01\x00\xff garbage\r\n\r\n")
    # Nothing of those was stored; the good key is intact; still serving.
    for k in ("big", "chunky", "short"):
        assert http(url(port, k))[0] == 404
    assert http(url(port, "good"))[:2] == (200, b"v")
    assert proc.p.poll() is None


def test_port_in_use_exits_1_naming_the_address(spawn: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        r = run(
            [command("mooncake_http_metadata_server"), "--host", "127.0.0.1", "--port", str(port)],
            timeout=30,
        )
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert f"127.0.0.1:{port}" in r.stderr and "in use" in r.stderr, r.stderr
        assert time.monotonic() - t0 < 30


def test_sigterm_exits_0(server: tuple[Proc, int]) -> None:
    proc, port = server
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), 0.5).close()


def test_default_flags_listen_on_8080_of_all_interfaces() -> None:
    r = run([command("mooncake_http_metadata_server"), "--help"])
    assert "--port PORT" in r.stdout and "(default: 8080)" in r.stdout
    assert "(default: 0.0.0.0)" in r.stdout and "(default: INFO)" in r.stdout


def test_kvbootstrapserver_in_process() -> None:
    from mooncake.http_metadata_server import KVBootstrapServer, KVPoll

    port = free_port()
    server = KVBootstrapServer(port=port, host="127.0.0.1")
    assert server.poll() == KVPoll.Failed
    thread = server.run()
    try:
        assert thread.is_alive() and server.poll() == KVPoll.Success
        assert http(url(port, "k"), "PUT", b"v")[0] == 200
        assert http(url(port, "k"))[1] == b"v"
        # A second server on the same port fails, and says so through poll().
        clash = KVBootstrapServer(port=port, host="127.0.0.1")
        clash.run()
        assert clash.poll() == KVPoll.Failed
    finally:
        server.close()
    assert server.poll() == KVPoll.Failed
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), 0.5).close()


def test_a_store_client_publishes_its_segment_through_it(
    server: tuple[Proc, int], master_factory: Any
) -> None:
    from mooncake.store import MooncakeDistributedStore

    _, port = server
    master = master_factory()
    data_port = free_port()
    store = MooncakeDistributedStore()
    rc = store.setup(
        f"127.0.0.1:{data_port}", url(port), 16 << 20, 4 << 20, "tcp", "", master.rpc_addr
    )
    assert rc == 0
    try:
        assert store.put("k", b"value") == 0
        assert store.get("k") == b"value"
        status, body, _ = http(url(port, f"mooncake/ram/127.0.0.1:{data_port}"))
        assert status == 200 and body, body
    finally:
        store.close()
    assert http(url(port, f"mooncake/ram/127.0.0.1:{data_port}"))[0] == 404
