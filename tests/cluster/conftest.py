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
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.bins import console_script

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


def wait_until(pred: Any, timeout: float, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


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
    n = Net(HOSTS).up()
    try:
        yield n
    finally:
        n.down()


@pytest.fixture
def faults(net: Net) -> Iterator[Faults]:
    f = Faults(net)
    try:
        yield f
    finally:
        f.clear_all()


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
    out = net.exec(host, ["ss", "-tinpH", "state", state]).stdout
    rows: list[tuple[str, str, str]] = []
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if f"pid={pid}," not in line:
            continue
        parts = line.split()
        info = lines[i + 1].split() if i + 1 < len(lines) else []
        rows.append((parts[2], parts[3], info[0] if info else ""))
    return rows


# ---------------------------------------------------------------- etcd


class Etcd:
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

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        _kill(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def etcd(net: Net) -> Iterator[Etcd]:
    e = Etcd(net)
    try:
        yield e
    finally:
        e.stop()


_cluster_counter = 0


@pytest.fixture
def cluster_id() -> str:
    """A cluster id of its own for each test (the module shares one etcd)."""
    global _cluster_counter
    _cluster_counter += 1
    return f"mc-test-{os.getpid()}-{_cluster_counter}"


# ---------------------------------------------------------------- masters


class NsMaster:
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

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def admin(self, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(
                f"http://{self.ip}:{METRICS_PORT}{path}", timeout=timeout
            ) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return 0, b""

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
    started: list[NsMaster] = []

    def make(host: str, **flags: Any) -> NsMaster:
        m = NsMaster(net, host, tmp_path, **flags)
        started.append(m)
        return m

    yield make
    for m in started:
        m.kill()


# ---------------------------------------------------------------- clients


class NsClient:
    """``cluster_client.py`` inside one host, driven by JSON lines."""

    def __init__(
        self, net: Net, host: str, tmpdir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.net = net
        self.host = host
        self.ip = net.ip(host)
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env["PYTHONUNBUFFERED"] = "1"
        self.log_path = tmpdir / f"client-{host}-{time.monotonic_ns()}.log"
        with open(self.log_path, "wb") as log:
            self.proc = net.popen(
                host,
                [sys.executable, str(HERE / "cluster_client.py")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=full_env,
                cwd=str(REPO),
            )
        self._buf = b""
        assert self._readline(60.0).get("ready")

    def _readline(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"client on {self.host} timed out after {timeout}s:\n{self.log_tail()}"
                    )
                if not sel.select(min(left, 0.5)):
                    if self.proc.poll() is not None:
                        raise AssertionError(f"client on {self.host} exited:\n{self.log_tail()}")
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    raise AssertionError(f"client on {self.host} exited:\n{self.log_tail()}")
                self._buf += chunk
        finally:
            sel.close()
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def call(self, op: str, timeout: float = 60.0, **kw: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(dict(kw, op=op)) + "\n").encode())
        self.proc.stdin.flush()
        reply = self._readline(timeout)
        if not reply.get("ok"):
            raise AssertionError(f"{op} failed on {self.host}: {reply.get('error')}")
        return reply.get("result")

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
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"op": "exit"}\n')
                self.proc.stdin.flush()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=15)
        self.kill()


@pytest.fixture
def clients(net: Net, tmp_path: Path) -> Iterator[Any]:
    """``clients(host, env=None)`` starts a client process in ``host``."""
    started: list[NsClient] = []

    def make(host: str, env: dict[str, str] | None = None) -> NsClient:
        c = NsClient(net, host, tmp_path, env)
        started.append(c)
        return c

    yield make
    for c in started:
        c.stop()
