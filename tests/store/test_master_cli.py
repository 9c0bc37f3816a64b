"""mooncake_master command line: gflags syntax, flag files, errors and exit codes."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    Master,
    free_port,
    http_request,
    master_bin,
    port_open,
    wait_until,
)
from helpers.master_proc import ephemeral_flags, read_ports


def run_master(args: list[str], timeout: float = 10.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [master_bin(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_unknown_flag_exits_1() -> None:
    r = run_master(["--bogus=1"])
    assert r.returncode == 1
    assert "unknown command line flag 'bogus'" in r.stderr


def test_bad_int_value_exits_1() -> None:
    r = run_master(["--rpc_port=abc"])
    assert r.returncode == 1
    assert "illegal value 'abc'" in r.stderr
    assert "rpc_port" in r.stderr


@pytest.mark.ours
def test_unimplemented_feature_switch_fails_fast() -> None:
    r = run_master(["--enable_cxl=true", f"--rpc_port={free_port()}"])
    assert r.returncode == 1
    # A feature switch set to true fails fast with exit 1 and
    # "flag --X requires <feature>, which this build does not implement".
    text = (r.stderr + r.stdout).lower()
    assert "not implement" in text
    assert "enable_cxl" in text


@pytest.mark.ours
def test_a_relative_root_fs_dir_is_refused() -> None:
    r = run_master(["--root_fs_dir=relative/dir", f"--rpc_port={free_port()}"])
    assert r.returncode == 1
    assert "root_fs_dir" in r.stderr + r.stdout
    assert "absolute path" in r.stderr + r.stdout


@pytest.mark.ours
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--enable_ha=true"], "--enable_ha needs --ha_backend_connstring"),
        (
            ["--enable_ha=true", "--etcd_endpoints=127.0.0.1:2379"],
            "needs a reachable --rpc_address",
        ),
        (
            [
                "--enable_ha=true",
                "--ha_backend_type=redis",
                "--ha_backend_connstring=127.0.0.1:6379",
                "--rpc_address=127.0.0.1",
            ],
            "supports only the etcd ha backend",
        ),
        (
            ["--enable_ha=true", "--ha_backend_connstring=nohost", "--rpc_address=127.0.0.1"],
            "ha_backend_connstring",
        ),
    ],
)
def test_ha_flags_bad_input(args: list[str], needle: str) -> None:
    r = run_master([*args, f"--rpc_port={free_port()}"])
    assert r.returncode == 1
    assert needle in r.stderr.lower() or needle in r.stderr, r.stderr


def test_version_flag() -> None:
    r = run_master(["--version"])
    assert r.returncode == 0
    assert r.stdout.startswith("mooncake_master version ")


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as f:
        return subprocess.Popen(
            [master_bin(), *args], stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def _bindable(port: int) -> bool:
    """Whether a listener could bind ``0.0.0.0:port`` now. A connect probe
    misses a port held as the local end of an outgoing connection (or its
    TIME_WAIT), which upstream's default ports, inside the ephemeral range, can be."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def test_single_dash_space_separated_flags(tmp_path: Path) -> None:
    rpc, http = 53123, 38080
    args = [
        "-rpc_port",
        str(rpc),
        "-enable_http_metadata_server",
        "-http_metadata_server_port",
        str(http),
        # A kernel-chosen port: a port picked free beforehand can be taken as
        # an outgoing connection's local port before the master binds it.
        "-metrics_port=0",
    ]
    # Upstream's literal default ports: wait for a moment when both are free to
    # bind. An earlier connection may hold one as its ephemeral local port,
    # for up to TIME_WAIT's 60 s after it closed.
    if not wait_until(lambda: _bindable(rpc) and _bindable(http), 70.0, 0.2):
        pytest.skip("spec ports 53123/38080 stay in use on this machine")
    proc = _start(args, tmp_path / "m.log")
    try:
        assert wait_until(lambda: port_open(rpc), 10.0), (tmp_path / "m.log").read_text()
        status, body, _ = http_request(f"http://127.0.0.1:{http}/metadata?key=x")
        assert status == 404
        assert body.decode().strip() == "metadata not found"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_lease_ttl_duration_suffix(master_factory, store_factory) -> None:  # type: ignore[no-untyped-def]
    m: Master = master_factory(default_kv_lease_ttl="2s")
    # Effective configuration is logged once at startup.
    text = wait_until(
        lambda: re.search(r"default_kv_lease_ttl\D{0,6}2000(?!\d)", m.log_text()), 5.0
    )
    assert text, m.log_text()[-3000:]
    # Behaviour: the lease outlives the 500 ms suite default.
    s = store_factory(m)
    assert s.put("lease2s", b"v") == 0
    assert s.get("lease2s") == b"v"
    time.sleep(1.0)
    assert s.remove("lease2s") == -706


def test_sigterm_graceful_exit(master: Master) -> None:
    assert master.proc is not None
    master.proc.terminate()
    rc = master.proc.wait(timeout=10)
    assert rc == 0


@pytest.mark.parametrize(
    "arg",
    [
        "--snapshot_retention_count=3",
        "--vmodule=rpc=2",
        "--memory_allocator=cachelib",
        "--kv_events_block_size=16",
    ],
)
def test_unimplemented_knobs_are_refused_not_ignored(arg: str) -> None:
    r = run_master([arg, f"--rpc_port={free_port()}"])
    assert r.returncode == 1
    name = arg.split("=")[0]
    assert name in r.stderr, r.stderr


def test_unimplemented_knobs_at_their_default_are_accepted(tmp_path: Path) -> None:
    log = tmp_path / "m.log"
    proc = _start([*ephemeral_flags(), "--snapshot_retention_count=2"], log)
    try:
        ports = read_ports(log, proc, 10.0)
        assert port_open(ports["rpc_port"]), log.read_text()
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _text(logs: Path) -> str:
    f = logs / "mooncake_master.INFO"
    return f.read_text(errors="replace") if f.exists() else ""


def test_log_dir_gets_the_log_file(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = _start([*ephemeral_flags(), f"--log_dir={logs}"], tmp_path / "m.log")
    try:
        read_ports(tmp_path / "m.log", proc, 10.0)
        # The log file gets the records, with their level.
        assert wait_until(lambda: "INFO" in _text(logs) and "is ready" in _text(logs), 10.0), _text(
            logs
        )
    finally:
        proc.kill()
        proc.wait(timeout=10)
