"""The ``mooncake_client`` daemon as a program: on PATH after install, with
upstream's flags and defaults, the gflags rules ``mooncake_master`` follows,
a clean unmount on SIGTERM, one daemon per port, and a dead master retried
(and said so) instead of a silent exit."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import READY, Daemon, client_bin, wait_until

# Upstream's mooncake_client flags: name -> (gflags type, default).
UPSTREAM_FLAGS = {
    "host": ("string", "0.0.0.0"),
    "metadata_server": ("string", "http://127.0.0.1:8080/metadata"),
    "device_names": ("string", ""),
    "master_server_address": ("string", "127.0.0.1:50051"),
    "protocol": ("string", "tcp"),
    "port": ("int32", "50052"),
    "global_segment_size": ("string", "4 GB"),
    "local_buffer_size": ("string", "0"),
    "threads": ("int32", "1"),
    "tenant_id": ("string", "default"),
    "enable_offload": ("bool", "false"),
    "start_offload_rpc_server": ("bool", "true"),
    "enable_http_server": ("bool", "false"),
    "http_port": ("int32", "9300"),
}


def run(argv: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def test_on_path_after_install() -> None:
    found = shutil.which("mooncake_client", path=str(Path(sys.executable).parent))
    assert found is not None, "pip install . puts mooncake_client next to the interpreter"
    assert Path(found).name == "mooncake_client"


def test_upstream_flags_and_defaults() -> None:
    out = run([client_bin(), "--help"])
    assert out.returncode == 1  # gflags: --help exits 1
    table = {
        m.group(1): (m.group(2), m.group(3))
        for m in re.finditer(
            r"^\s+-(\w+) \(.*\) type: (\w+) default: \"(.*)\"$", out.stdout, re.MULTILINE
        )
    }
    for name, want in UPSTREAM_FLAGS.items():
        assert table.get(name) == want, f"--{name}: {table.get(name)} != {want}"
    # The gflags built-ins the master has.
    for name in ("flagfile", "undefok", "fromenv", "v", "minloglevel", "version"):
        assert name in table


@pytest.mark.parametrize(
    "client_args, master_args, names",
    [
        (["--bogus=1"], ["--bogus=1"], ("bogus", "bogus")),
        (["-nobogus"], ["-nobogus"], ("nobogus", "nobogus")),
        (["--port=x"], ["--rpc_port=x"], ("port", "rpc_port")),
        (["--threads"], ["--rpc_port"], ("threads", "rpc_port")),
        (["--port=-1"], ["--rpc_port=-1"], ("port", "rpc_port")),
    ],
)
def test_bad_command_lines_exit_1_like_the_master(
    client_args: list[str], master_args: list[str], names: tuple[str, str]
) -> None:
    got = run([client_bin(), *client_args])
    master = Path(client_bin()).parent / "mooncake_master"
    want = run([str(master), *master_args])
    assert got.returncode == 1 == want.returncode
    assert got.stderr.startswith("ERROR: "), got.stderr
    # One parser: the same message, with the flag's own name.
    assert got.stderr == want.stderr.replace(f"'{names[1]}'", f"'{names[0]}'")


def test_undefok_is_honoured() -> None:
    got = run([client_bin(), "--undefok=bogus", "--bogus=1", "--port=0"])
    assert got.returncode == 1
    # --bogus passed; the port 0 is then refused by validation.
    assert got.stderr.strip() == "ERROR: failed validation of new value '0' for flag 'port'"


def test_sigterm_unmounts_cleanly(master_factory: Any, daemon_factory: Any) -> None:
    m = master_factory()
    d: Daemon = daemon_factory(m)
    assert wait_until(lambda: len(m.segments()) == 1, 10)
    assert d.terminate() == 0
    assert "unmounting" in d.log_text()
    # The master forgot the segment at once (no client TTL wait).
    assert m.segments() == []


def test_two_daemons_on_one_port(master_factory: Any, daemon_factory: Any, dummies: Any) -> None:
    m = master_factory()
    first: Daemon = daemon_factory(m)
    second: Daemon = daemon_factory(m, port=first.port, wait=False)
    assert second.proc is not None
    assert second.proc.wait(20) == 1
    assert "another mooncake_client serves it" in second.log_text(), second.log_text()
    # Nothing lost: the first daemon still serves, and only its segment is mounted.
    s = dummies(first)
    assert s.put("k", b"v" * 100) == 0
    assert s.get("k") == b"v" * 100
    assert len(m.segments()) == 1


def test_a_dead_master_is_retried_and_said(master_factory: Any, daemon_factory: Any) -> None:
    m = master_factory()
    m.kill()
    d: Daemon = daemon_factory(m, wait=False)
    assert wait_until(lambda: d.log_text().count("retrying in 1 s") >= 2, 20), d.log_text()
    assert d.alive(), "the daemon must keep retrying, not exit"
    assert m.rpc_addr in d.log_text()
    m.restart()
    assert wait_until(lambda: READY in d.log_text(), 20), d.log_text()[-2000:]
    assert wait_until(lambda: len(m.segments()) == 1, 10)


def test_version_and_flagfile(tmp_path: Path) -> None:
    out = run([client_bin(), "--version"])
    assert out.returncode == 0
    assert out.stdout.startswith("mooncake_client version ")
    ff = tmp_path / "flags"
    ff.write_text("--port=70000\n")
    out = run([client_bin(), f"--flagfile={ff}"])
    assert out.returncode == 1
    assert "failed validation of new value '70000' for flag 'port'" in out.stderr
