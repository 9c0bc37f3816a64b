"""Masters in HA on a real etcd, on free loopback ports: start one, read its
health and metrics, find the single leader of a set, kill one."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path
from typing import Any

from helpers.bins import console_script
from helpers.waits import free_port, http_get, port_open, wait_until


class HaMaster:
    """One ``mooncake_master --enable_ha`` of cluster ``cluster`` on ``etcd``
    (``extra``: more flags), logging to a file under ``tmp``."""

    def __init__(self, etcd: str, cluster: str, tmp: Path, extra: list[str] | None = None) -> None:
        self.rpc, self.metrics = free_port(), free_port()
        self.log = tmp / f"ha-master-{self.rpc}.log"
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                [
                    console_script("mooncake_master", "MOONCAKE_MASTER_BIN"),
                    "--enable_ha=true",
                    "--ha_backend_type=etcd",
                    f"--ha_backend_connstring={etcd}",
                    f"--cluster_id={cluster}",
                    "--rpc_address=127.0.0.1",
                    f"--rpc_port={self.rpc}",
                    f"--metrics_port={self.metrics}",
                    "--default_kv_lease_ttl=500",
                    *(extra or []),
                ],
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        assert wait_until(lambda: port_open(self.metrics), 20.0), self.log.read_text()

    def _get(self, path: str) -> tuple[int, bytes]:
        return http_get(f"http://127.0.0.1:{self.metrics}{path}")

    def health(self) -> dict[str, Any]:
        status, body = self._get("/health")
        return json.loads(body) if status == 200 else {}

    def metric(self, name: str) -> float | None:
        _, body = self._get("/metrics")
        for line in body.decode().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == name:
                return float(parts[1])
        return None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()


def leader(ms: list[HaMaster], timeout: float = 20.0) -> HaMaster:
    """The one live master of ``ms`` that reports itself leader (waits for it)."""

    def one() -> Any:
        ls = [m for m in ms if m.proc.poll() is None and m.health().get("role") == "leader"]
        return ls[0] if len(ls) == 1 else None

    got = wait_until(one, timeout, 0.1)
    assert got is not None, [m.health() for m in ms]
    return got
