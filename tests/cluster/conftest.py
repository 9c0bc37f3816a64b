"""Fixtures of the multi-host suite: simulated hosts (network namespaces on a
bridge, see netns.py), a real etcd, masters and clients inside the hosts.

Layout of the module-scoped ``net``: ``ctl`` runs etcd (and the single
master of the restart tests), ``m1``..``m3`` run HA masters (one per host, so
a leader's host can be cut off alone), ``c1`` and ``c2`` run clients.

Tests that need root and ``ip netns`` skip with the reason when those are
missing; CI runs as root, so they run there. Every process is killed and
every namespace removed at teardown.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.bins import console_script
from helpers.fixtures import started_by, stopped_after
from helpers.json_child import JsonLineChild
from helpers.logged import LoggedProcess
from helpers.ss import ss_sockets
from helpers.waits import http_get, wait_until

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from netns import Faults, Net, unavailable_reason, wait_port

REPO = HERE.parents[1]
ETCD_PORT = 2379
RPC_PORT = 50051
METRICS_PORT = 9003
HOSTS = ["ctl", "m1", "m2", "m3", "c1", "c2"]


def master_bin() -> str:
    return console_script("mooncake_master", "MOONCAKE_MASTER_BIN")


def _kill(proc: subprocess.Popen[Any] | None, sig: int = signal.SIGKILL) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


# ---------------------------------------------------------------- hosts


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"multi-host tests skipped: {reason}")
    yield from stopped_after(Net(HOSTS).up(), Net.down)


@pytest.fixture
def faults(net: Net) -> Iterator[Faults]:
    yield from stopped_after(Faults(net), Faults.clear_all)


# ---------------------------------------------------------------- congestion control


@pytest.fixture
def default_cc(net: Any) -> Iterator[Callable[[str], None]]:
    """``default_cc(name)`` makes ``name`` the system default inside hosts c1
    and c2 (and lets unprivileged sockets select cubic, as distributions
    that default to it do); everything is restored at teardown."""
    allowed_path = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
    allowed = allowed_path.read_text().split()
    hosts = ("c1", "c2")
    before = {
        h: net.exec(h, ["sysctl", "-n", "net.ipv4.tcp_congestion_control"]).stdout.strip()
        for h in hosts
    }

    def set_default(name: str) -> None:
        if "cubic" not in allowed:
            allowed_path.write_text(" ".join([*allowed, "cubic"]))
        for h in hosts:
            net.exec(h, ["sysctl", "-qw", f"net.ipv4.tcp_congestion_control={name}"])

    try:
        yield set_default
    finally:
        for h, cc in before.items():
            net.exec(h, ["sysctl", "-qw", f"net.ipv4.tcp_congestion_control={cc}"], check=False)
        allowed_path.write_text(" ".join(allowed))


def tcp_sockets(net: Any, host: str, pid: int, state: str) -> list[tuple[str, str, str]]:
    """(local, peer, congestion algorithm) of ``pid``'s TCP sockets in ``state``,
    read in ``host``'s namespace with ``ss``."""
    return ss_sockets(net.exec(host, ["ss", "-tinpH", "state", state]).stdout, pid)


# ---------------------------------------------------------------- etcd


class Etcd(LoggedProcess):
    """A single-member etcd inside host ``ctl`` (data on tmpfs when available)."""

    def __init__(self, net: Net, host: str = "ctl") -> None:
        self.net = net
        self.host = host
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = tempfile.mkdtemp(prefix="mc-etcd-", dir=base)
        self.log_path = Path(self.dir) / "etcd.log"
        ip = net.ip(host)
        self.endpoint = f"{ip}:{ETCD_PORT}"
        etcd = shutil.which("etcd")
        if etcd is None:
            pytest.skip("etcd not installed (apt-get install etcd-server)")
        argv = [
            etcd,
            "--name=mc-test",
            f"--data-dir={self.dir}/data",
            f"--listen-client-urls=http://{ip}:{ETCD_PORT},http://127.0.0.1:{ETCD_PORT}",
            f"--advertise-client-urls=http://{ip}:{ETCD_PORT}",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=mc-test=http://127.0.0.1:2380",
            "--log-level=warn",
        ]
        with open(self.log_path, "wb") as log:
            self.proc = net.popen(
                host, argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        if not wait_port(net, host, ETCD_PORT, 20.0) or not self.healthy(10.0):
            self.stop()
            raise AssertionError(f"etcd did not start:\n{self.log_text()[-3000:]}")

    def healthy(self, timeout: float = 5.0) -> bool:
        def ok() -> bool:
            try:
                with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as r:
                    return b'"health":"true"' in r.read()
            except OSError:
                return False

        return bool(wait_until(ok, timeout, 0.1))

    def stop(self) -> None:
        _kill(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def etcd(net: Net) -> Iterator[Etcd]:
    yield from stopped_after(Etcd(net), Etcd.stop)


_cluster_counter = 0


@pytest.fixture
def cluster_id() -> str:
    """A cluster id of its own for each test (the module shares one etcd)."""
    global _cluster_counter
    _cluster_counter += 1
    return f"mc-test-{os.getpid()}-{_cluster_counter}"


# ---------------------------------------------------------------- masters


class NsMaster(LoggedProcess):
    """A ``mooncake_master`` inside one host, on that host's address."""

    def __init__(self, net: Net, host: str, tmpdir: Path, **flags: Any) -> None:
        self.net = net
        self.host = host
        self.ip = net.ip(host)
        self.flags = flags
        self.log_path = tmpdir / f"master-{host}-{time.monotonic_ns()}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def rpc_addr(self) -> str:
        return f"{self.ip}:{RPC_PORT}"

    def argv(self) -> list[str]:
        args = [
            master_bin(),
            f"--rpc_address={self.ip}",
            f"--rpc_port={RPC_PORT}",
            f"--metrics_port={METRICS_PORT}",
            "--default_kv_lease_ttl=500",
        ]
        for k, v in self.flags.items():
            if isinstance(v, bool):
                v = "true" if v else "false"
            args.append(f"--{k}={v}")
        return args

    def start(self, wait: bool = True) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = self.net.popen(
                self.host,
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        if wait and not wait_port(self.net, self.host, METRICS_PORT, 20.0):
            raise AssertionError(
                f"master on {self.host} did not come up:\n{self.log_text()[-3000:]}"
            )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        _kill(self.proc, sig)

    def restart(self) -> None:
        self.kill()
        self.start()

    def admin(self, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
        return http_get(f"http://{self.ip}:{METRICS_PORT}{path}", timeout)

    def health(self) -> dict[str, Any]:
        status, body = self.admin("/health")
        if status != 200:
            return {}
        return json.loads(body)

    def metric(self, name: str) -> float | None:
        status, body = self.admin("/metrics")
        if status != 200:
            return None
        for line in body.decode().splitlines():
            parts = line.split()
            if len(parts) >= 2 and not line.startswith("#") and parts[0] == name:
                return float(parts[1])
        return None


@pytest.fixture
def masters(net: Net, tmp_path: Path) -> Iterator[Any]:
    """``masters(host, **flags)`` starts a master in ``host``; all are killed at teardown."""
    yield from started_by(
        lambda host, **flags: NsMaster(net, host, tmp_path, **flags), NsMaster.kill
    )


def ha_flags(etcd: Any, cluster_id: str) -> dict[str, Any]:
    """The flags of an HA master of cluster ``cluster_id`` on ``etcd``."""
    return {
        "enable_ha": True,
        "ha_backend_type": "etcd",
        "ha_backend_connstring": etcd.endpoint,
        "cluster_id": cluster_id,
    }


def etcd_addr(etcd: Any) -> str:
    """The master address clients give to follow the leader through etcd."""
    return f"etcd://{etcd.endpoint}"


def cluster_env(cluster_id: str) -> dict[str, str]:
    """The environment of a client of cluster ``cluster_id``."""
    return {"MC_STORE_CLUSTER_ID": cluster_id}


def leaders(ms: list[Any]) -> list[Any]:
    """The masters of ``ms`` that say they lead."""
    return [m for m in ms if m.alive() and m.health().get("role") == "leader"]


def wait_one_leader(ms: list[Any], timeout: float = 20.0) -> Any:
    """The one leader among ``ms``, once there is exactly one."""
    got = wait_until(lambda: len(leaders(ms)) == 1 and leaders(ms), timeout, 0.1)
    assert got, [m.health() for m in ms]
    return got[0]


def trio_with_leader(
    masters: Any, etcd: Any, cluster_id: str, **flags: Any
) -> tuple[list[Any], Any, list[Any]]:
    """HA masters on m1, m2 and m3 (with ``flags``), once one of them leads:
    (all three, the leader, the other two)."""
    ms = [masters(h, **ha_flags(etcd, cluster_id), **flags) for h in ("m1", "m2", "m3")]
    leader = wait_one_leader(ms)
    return ms, leader, [m for m in ms if m is not leader]


# ---------------------------------------------------------------- clients


class NsClient(JsonLineChild):
    """``cluster_client.py`` inside one host, driven by JSON lines."""

    def __init__(
        self, net: Net, host: str, tmpdir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.net = net
        self.host = host
        self.ip = net.ip(host)
        self.log_path = tmpdir / f"client-{host}-{time.monotonic_ns()}.log"
        argv = [sys.executable, str(HERE / "cluster_client.py")]
        self._spawn(functools.partial(net.popen, host), argv, env, str(REPO), 60.0)

    def name(self) -> str:
        return f"client on {self.host}"

    def setup(self, master_server_addr: str, **kw: Any) -> dict[str, Any]:
        return self.call(
            "setup", local_hostname=self.ip, master_server_addr=master_server_addr, **kw
        )

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def kill(self) -> None:
        _kill(self.proc)

    def stop(self) -> None:
        self.ask_exit(15.0)
        self.kill()


@pytest.fixture
def clients(net: Net, tmp_path: Path) -> Iterator[Any]:
    """``clients(host, env=None)`` starts a client process in ``host``."""
    yield from started_by(lambda host, env=None: NsClient(net, host, tmp_path, env), NsClient.stop)
