"""Start a real ``mooncake_master`` on ports the kernel picks (no pytest import).

The master binds 127.0.0.1 and port 0 for each listener and prints its
effective configuration, with the ports it got, once all of them are bound;
the ports are read from that line, so no test races another process for a
port it picked in advance.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

READY = "effective configuration:"
_PORT = re.compile(r"\b(rpc_port|http_metadata_server_port|metrics_port)=(\d+)\b")


def ephemeral_flags() -> list[str]:
    """Flags that bind every listener to 127.0.0.1 on a kernel-chosen port
    (``--rpc_port=0`` means "use --port", so ``--port=0`` asks for any)."""
    return [
        "--rpc_address=127.0.0.1",
        "--rpc_port=0",
        "--port=0",
        "--http_metadata_server_host=127.0.0.1",
        "--http_metadata_server_port=0",
        "--metrics_host=127.0.0.1",
        "--metrics_port=0",
    ]


def read_ports(
    log_path: Path, proc: subprocess.Popen[Any], timeout: float, offset: int = 0
) -> dict[str, int]:
    """Wait for the master's effective-configuration line in ``log_path``
    (written after byte ``offset``, so an appended log's earlier runs do not
    count); the bound ports by flag name. Raises with the log when the master
    exits or the line does not come."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(log_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            text = ""
        # Complete lines only: the line may be written in several pieces.
        for line in text.split("\n")[:-1]:
            if READY in line:
                ports = {k: int(v) for k, v in _PORT.findall(line)}
                if "rpc_port" in ports and "metrics_port" in ports:
                    return ports
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"master did not come up:\n{text[-4000:]}")
        time.sleep(0.02)
