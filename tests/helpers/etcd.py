"""A real single-member etcd on free loopback ports, and reads of its keys
through etcd's JSON gateway (no client library)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator

import pytest
from helpers.waits import free_port, port_open, wait_until


@contextlib.contextmanager
def running_etcd() -> Iterator[str]:
    """Start etcd on free loopback ports; yields its ``host:port`` and kills
    it (and removes its data) on exit. Skips the test without the binary."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("etcd not installed (apt-get install etcd-server)")
    c, p = free_port(), free_port()
    d = tempfile.mkdtemp(prefix="mc-etcd-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    proc = subprocess.Popen(
        [
            binary,
            "--name=t",
            f"--data-dir={d}/data",
            f"--listen-client-urls=http://127.0.0.1:{c}",
            f"--advertise-client-urls=http://127.0.0.1:{c}",
            f"--listen-peer-urls=http://127.0.0.1:{p}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
            f"--initial-cluster=t=http://127.0.0.1:{p}",
            "--log-level=error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(lambda: port_open(c), 20.0), "etcd did not start"
        yield f"127.0.0.1:{c}"
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(d, ignore_errors=True)


def etcd_get(addr: str, key: str) -> bytes | None:
    """The value of ``key`` in the etcd at ``addr``, or None when absent."""
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    req = urllib.request.Request(f"http://{addr}/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        kvs = json.loads(r.read()).get("kvs") or []
    return base64.b64decode(kvs[0]["value"]) if kvs else None
