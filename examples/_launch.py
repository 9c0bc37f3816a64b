"""Process plumbing shared by the examples: free loopback ports, waiting for a
port to open, and starting ``mooncake_master`` with its embedded HTTP metadata
server. The examples import it as a sibling module (run them as
``python examples/<name>.py``)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open")


def start_master(quiet: bool = True) -> tuple[subprocess.Popen[bytes], int, int, int]:
    """Start ``$MOONCAKE_MASTER_BIN`` (else ``mooncake_master`` from PATH) on free ports:
    (process, rpc port, metadata HTTP port, admin/metrics port). With ``quiet`` its
    output is discarded. The caller waits for the rpc port and stops the process."""
    master_bin = os.environ.get("MOONCAKE_MASTER_BIN") or shutil.which("mooncake_master")
    if not master_bin:
        raise SystemExit("mooncake_master not found on PATH")
    rpc, http, admin = free_port(), free_port(), free_port()
    out = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen(
        [
            master_bin,
            f"--rpc_port={rpc}",
            "--enable_http_metadata_server",
            f"--http_metadata_server_port={http}",
            f"--metrics_port={admin}",
        ],
        stdout=out,
        stderr=out,
    )
    return proc, rpc, http, admin
