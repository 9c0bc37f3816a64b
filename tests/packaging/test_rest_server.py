"""``mc_store_rest_server`` as a real process in front of a real master:
upstream's routes and JSON, configured by ``--config`` or the environment
with ``-D`` overrides; bad requests get 4xx JSON and it keeps serving; a
port in use and an unreachable master exit 1."""

from __future__ import annotations

import json
import re
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Proc, command, free_port, http, raw_http, run, wait_port
from helpers.common import write_config


def config_file(tmp_path: Path, master: Any) -> Path:
    return write_config(
        tmp_path / "mooncake.json",
        "127.0.0.1",
        master.metadata_url,
        master.rpc_addr,
        global_segment_size=32 << 20,
        local_buffer_size=8 << 20,
        protocol="tcp",
        device_name="",
    )


@pytest.fixture
def rest(spawn: Any, master_factory: Any, tmp_path: Path) -> tuple[Proc, str]:
    master = master_factory()
    port = free_port()
    p = spawn(
        [
            command("mc_store_rest_server"),
            "--config",
            str(config_file(tmp_path, master)),
            "--port",
            str(port),
            "--max-wait-time",
            "20",
        ]
    )
    wait_port(port, p)
    return p, f"http://127.0.0.1:{port}"


def call(url: str, method: str = "GET", payload: Any = None, raw: bytes | None = None) -> Any:
    body = raw if raw is not None else (None if payload is None else json.dumps(payload).encode())
    status, data, headers = http(url, method, body)
    if headers.get("content-type", "").startswith("application/json"):
        return status, json.loads(data)
    return status, data


def test_key_value_routes(rest: tuple[Proc, str]) -> None:
    _, base = rest
    ok = {"status": "success"}
    assert call(f"{base}/api/put", "PUT", {"key": "k1", "value": "hello"}) == (200, ok)
    assert call(f"{base}/api/put", "PUT", {"key": "k2", "value": "wörld"}) == (200, ok)
    assert call(f"{base}/api/get/k1") == (200, b"hello")
    assert call(f"{base}/api/get/k2") == (200, "wörld".encode())
    _, _, headers = http(f"{base}/api/get/k1")
    assert headers["content-type"] == "application/octet-stream"
    assert call(f"{base}/api/exist/k1") == (200, {"exists": True})
    assert call(f"{base}/api/exist/nope") == (200, {"exists": False})
    assert call(f"{base}/api/get/nope") == (404, {"error": "Key not found"})
    # A key nobody read (no read lease) is removed at once; a second time fails.
    assert call(f"{base}/api/put", "PUT", {"key": "k3", "value": "x"}) == (200, ok)
    assert call(f"{base}/api/remove/k3", "DELETE") == (200, ok)
    assert call(f"{base}/api/exist/k3") == (200, {"exists": False})
    assert call(f"{base}/api/remove/k3", "DELETE") == (500, {"error": "Remove operation failed"})
    # remove_all reports how many keys it removed; the read ones go once
    # their read leases (500 ms here) have run out.
    removed = 0
    deadline = time.monotonic() + 10
    while removed < 2 and time.monotonic() < deadline:
        status, body = call(f"{base}/api/remove_all", "DELETE")
        assert status == 200, body
        m = re.fullmatch(r"success removed (\d+) keys", body["status"])
        assert m, body
        removed += int(m.group(1))
        if removed < 2:
            time.sleep(0.05)
    assert removed == 2
    assert call(f"{base}/api/exist/k1") == (200, {"exists": False})


def test_bad_requests_get_4xx_json_and_it_keeps_serving(rest: tuple[Proc, str]) -> None:
    proc, base = rest
    missing = (400, {"error": "Missing key or value"})
    assert call(f"{base}/api/put", "PUT", {"key": "k"}) == missing
    assert call(f"{base}/api/put", "PUT", {"value": "v"}) == missing
    assert call(f"{base}/api/put", "PUT", {"key": "", "value": "v"}) == missing
    assert call(f"{base}/api/put", "PUT", raw=b"{not json") == (
        400,
        {"error": "Malformed JSON body"},
    )
    assert call(f"{base}/api/put", "PUT", [1, 2]) == (
        400,
        {"error": "Request body must be a JSON object"},
    )
    assert call(f"{base}/api/put", "PUT", {"key": "k", "value": 5})[0] == 400
    assert call(f"{base}/api/mount", "POST", {"size": -1}) == (
        400,
        {"error": "Invalid size, must be a positive integer"},
    )
    assert call(f"{base}/api/mount", "POST", {"size": True})[0] == 400
    assert call(f"{base}/api/unmount", "POST", {}) == (400, {"error": "Missing segment_ids"})
    assert call(f"{base}/api/mount_shm", "POST", {"name": "../etc", "size": 1}) == (
        400,
        {"error": "Missing or invalid name or size"},
    )
    assert call(f"{base}/api/unmount_local_disk", "POST", {"grace_period_seconds": -1})[0] == 400
    assert call(f"{base}/api/reconfigure", "POST", {"mode": "sideways"}) == (
        400,
        {"error": "Invalid mode. Use 'decode' or 'prefill'"},
    )
    assert call(f"{base}/api/reconfigure", "POST", {"mode": "decode"}) == (
        400,
        {"error": "Missing path or size for decode mode"},
    )
    assert call(f"{base}/api/reconfigure", "POST", {"mode": "prefill"}) == (
        200,
        {"status": "success", "mode": "prefill"},
    )
    assert call(f"{base}/api/nope")[0] == 404
    assert call(f"{base}/api/get/")[0] == 404
    assert call(f"{base}/api/put", "GET")[0] == 405
    assert call(f"{base}/api/get/k", "PUT", {})[0] == 405
    port = int(base.rsplit(":", 1)[1])
    big = f"PUT /api/put HTTP/1.1\r\nHost: x\r\nContent-Length: {101 << 20}\r\n\r\n".encode()
    assert raw_http(port, big + b"{").startswith(b"HTTP/1.1 413")
    assert raw_http(port, b"\x16\x03\x01 not http\r\n\r\n").startswith(b"HTTP/1.")
    # Still serving, and nothing was stored by the refused requests.
    assert call(f"{base}/api/exist/k") == (200, {"exists": False})
    assert call(f"{base}/api/put", "PUT", {"key": "k", "value": "v"})[0] == 200
    assert proc.p.poll() is None


def test_segment_routes_mount_and_unmount(rest: tuple[Proc, str]) -> None:
    _, base = rest
    status, body = call(f"{base}/api/mount", "POST", {"size": 1 << 20})
    assert status == 200, body
    assert body["allocated_size"] == 1 << 20 and len(body["segment_ids"]) == 1, body
    status, body2 = call(f"{base}/api/unmount", "POST", {"segment_ids": body["segment_ids"]})
    assert status == 200, body2
    status, body = call(f"{base}/api/unmount", "POST", {"segment_ids": ["x"]})
    assert status == 500 and body["error"].startswith("Unmount and free failed, ret=")


def test_environment_config_with_overrides(spawn: Any, master_factory: Any) -> None:
    master = master_factory()
    port = free_port()
    env = {
        "MOONCAKE_MASTER": master.rpc_addr,
        "MOONCAKE_TE_META_DATA_SERVER": master.metadata_url,
        "MOONCAKE_GLOBAL_SEGMENT_SIZE": "16MB",
        "MOONCAKE_LOCAL_BUFFER_SIZE": "8MB",
    }
    p = spawn(
        [
            command("mc_store_rest_server"),
            "-Dlocal_hostname=127.0.0.1",
            "--define",
            "global_segment_size=24MB",
            "--port",
            str(port),
        ],
        env=env,
    )
    wait_port(port, p)
    base = f"http://127.0.0.1:{port}"
    assert call(f"{base}/api/put", "PUT", {"key": "e", "value": "x" * 1000})[0] == 200
    assert call(f"{base}/api/get/e") == (200, b"x" * 1000)
    status, body, _ = http(f"{master.admin_url}/get_all_segments")
    assert status == 200 and b"127.0.0.1" in body, body
    p.signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 0


def test_port_in_use_exits_1_at_once(master_factory: Any, tmp_path: Path) -> None:
    master = master_factory()
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [command("mc_store_rest_server"), "--config", str(config_file(tmp_path, master))]
        r = run([*argv, "--port", str(port)], timeout=30)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"cannot listen on 0.0.0.0:{port}" in r.stderr, r.stderr


def test_unreachable_master_exits_1_after_max_wait_time(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path / "c.json",
        "127.0.0.1",
        "P2PHANDSHAKE",
        f"127.0.0.1:{free_port()}",
        global_segment_size=16 << 20,
        local_buffer_size=8 << 20,
    )
    argv = [command("mc_store_rest_server"), "--config", str(cfg), "--port", str(free_port())]
    r = run([*argv, "--max-wait-time", "1"], timeout=60)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Failed to start store service" in r.stderr, r.stderr


def test_missing_config_exits_1(tmp_path: Path) -> None:
    r = run([command("mc_store_rest_server"), "--config", str(tmp_path / "none.json")])
    assert r.returncode == 1 and "Configuration load failed" in r.stderr, r.stderr
