"""Shared fixtures for the Mooncake store acceptance suite.

The suite runs against whatever ``mooncake.store`` the current interpreter
imports and a REAL ``mooncake_master`` process. The master binary is taken from
``$MOONCAKE_MASTER_BIN``, else the ``mooncake_master`` next to ``sys.executable``
(the venv's console script), else ``mooncake_master`` on ``PATH``.

Markers:
  ours  -- behaviour that is ours (our additions, deliberate deviations from
           upstream, or rules that upstream 0.3.13 does not follow); it fails
           on upstream.
           ``-m "not ours"`` selects the upstream-comparable subset.
  slow  -- fault / TTL tests that take a few seconds each.

Every wait is bounded and every process started here is killed at teardown.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
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
from helpers.common import pattern  # noqa: F401  (re-exported for tests)
from helpers.fixtures import default_timeouts, started_by
from helpers.json_child import JsonLineChild
from helpers.logged import LoggedProcess
from helpers.master_proc import ephemeral_flags, read_ports
from helpers.waits import free_port, port_open, wait_until  # noqa: F401  (re-exported for tests)

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
HELPERS = HERE / "helpers"

MiB = 1 << 20
SEGMENT_SIZE = 64 * MiB
LOCAL_BUFFER_SIZE = 16 * MiB
DEFAULT_LEASE_TTL_MS = 500

# Per-test wall-clock cap (seconds) applied when pytest-timeout is installed.
DEFAULT_TEST_TIMEOUT = 120


# ---------------------------------------------------------------- pytest hooks


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "ours: behaviour specific to this implementation (our additions, deliberate "
        "deviations, or rules upstream 0.3.13 does not follow); fails on upstream",
    )
    config.addinivalue_line("markers", "slow: takes several seconds (faults, TTL expiry)")
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line("markers", "timeout(seconds): per-test time limit")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    default_timeouts(items, config, DEFAULT_TEST_TIMEOUT, under=HERE / "store")


# ---------------------------------------------------------------- small utils


def _lower(items: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in items}


def http_request(
    url: str, method: str = "GET", body: bytes | None = None, timeout: float = 5.0
) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, headers) for a request; HTTP errors are returned, not raised.

    Header names are lower-cased.

    Connection refusals are retried until ``timeout`` (servers that start late).
    """
    deadline = time.monotonic() + timeout
    while True:
        req = urllib.request.Request(url, data=body, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read(), _lower(resp.headers.items())
        except urllib.error.HTTPError as e:
            return e.code, e.read(), _lower(e.headers.items())
        except (urllib.error.URLError, ConnectionError) as e:
            if time.monotonic() >= deadline:
                raise AssertionError(f"{method} {url} failed: {e}") from e
            time.sleep(0.1)


def store_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The records the store binding logged (logger ``mooncake.store``)."""
    return [r for r in caplog.records if r.name == "mooncake.store"]


def check_codes(
    caplog: pytest.LogCaptureFixture,
    calls: list[tuple[Callable[[], Any], Any, str | None]],
    logged: bool = True,
) -> None:
    """Runs each ``(call, codes, reason)``: the call returns ``codes``; with
    ``logged``, it logs one store record containing ``reason``, or none when
    ``reason`` is None."""
    for call, codes, reason in calls:
        caplog.clear()
        assert call() == codes, reason
        recs = store_records(caplog)
        if not logged:
            continue
        if reason is None:
            assert recs == [], [r.getMessage() for r in recs]
        else:
            assert len(recs) == 1, (reason, [r.getMessage() for r in recs])
            assert reason in recs[0].getMessage()


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """``caplog`` capturing the store binding's records from INFO up."""
    caplog.set_level(logging.INFO, logger="mooncake.store")
    return caplog


def master_bin() -> str:
    return console_script("mooncake_master", "MOONCAKE_MASTER_BIN")


def _kill_tree(proc: subprocess.Popen[Any], sig: int = signal.SIGKILL) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


# ---------------------------------------------------------------- master


class Master(LoggedProcess):
    """A real ``mooncake_master`` process on ports the kernel picked.

    The first start binds port 0 on 127.0.0.1 for every listener and reads
    the ports the master got from its effective-configuration line; later
    starts (``restart``) ask for those same ports again."""

    def __init__(self, tmpdir: Path, **flags: Any) -> None:
        self.rpc_port = 0
        self.http_port = 0
        self.metrics_port = 0
        self.flags: dict[str, Any] = {
            "default_kv_lease_ttl": DEFAULT_LEASE_TTL_MS,
        }
        self.flags.update(flags)
        self.tmpdir = tmpdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = tmpdir / f"master-{id(self):x}.log"
        self.start()

    @property
    def rpc_addr(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/metadata"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def argv(self) -> list[str]:
        if self.rpc_port == 0:
            ports = ephemeral_flags()
        else:
            ports = [
                "--rpc_address=127.0.0.1",
                f"--rpc_port={self.rpc_port}",
                "--http_metadata_server_host=127.0.0.1",
                f"--http_metadata_server_port={self.http_port}",
                "--metrics_host=127.0.0.1",
                f"--metrics_port={self.metrics_port}",
            ]
        args = [master_bin(), *ports, "--enable_http_metadata_server=true"]
        for k, v in self.flags.items():
            if isinstance(v, bool):
                v = "true" if v else "false"
            args.append(f"--{k}={v}")
        return args

    def start(self, timeout: float = 10.0) -> None:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        try:
            self.proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            log.close()
        try:
            ports = read_ports(self.log_path, self.proc, timeout, offset)
        except AssertionError:
            self.kill()
            raise
        self.rpc_port = ports["rpc_port"]
        self.http_port = ports["http_metadata_server_port"]
        self.metrics_port = ports["metrics_port"]

    def wait_admin(self, timeout: float = 10.0) -> None:
        assert wait_until(lambda: port_open(self.metrics_port), timeout), "admin port not up"

    def kill(self) -> None:
        if self.proc is not None:
            _kill_tree(self.proc, signal.SIGKILL)

    def restart(self, timeout: float = 10.0) -> None:
        """SIGKILL the master and start it again on the same ports."""
        self.kill()
        # The old listening sockets may linger for a moment; retry binding.
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.start(timeout=max(1.0, deadline - time.monotonic()))
                return
            except AssertionError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    # admin helpers
    def admin_get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes, dict[str, str]]:
        return http_request(self.admin_url + path, timeout=timeout)

    def metric(self, name: str) -> float | None:
        status, body, _ = self.admin_get("/metrics")
        assert status == 200
        for line in body.decode().splitlines():
            if line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) >= 2 and (parts[0] == name or parts[0].startswith(name + "{")):
                return float(parts[1])
        return None

    def segments(self) -> list[str]:
        status, body, _ = self.admin_get("/get_all_segments")
        assert status == 200
        return [s for s in body.decode().splitlines() if s]

    def query_key(self, key: str) -> tuple[int, Any]:
        from urllib.parse import quote

        status, body, _ = self.admin_get("/query_key?key=" + quote(key, safe=""))
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body


@pytest.fixture
def master_factory(tmp_path: Path) -> Iterator[Callable[..., Master]]:
    """``master_factory(**flags)`` starts a fresh master; all are killed at teardown."""
    yield from started_by(lambda **flags: Master(tmp_path, **flags), Master.kill)


@pytest.fixture
def master(master_factory: Callable[..., Master]) -> Master:
    """A fresh master with the suite defaults (lease ttl 500 ms)."""
    return master_factory()


@pytest.fixture(scope="module")
def shared_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Master]:
    """One master per test module, for tests that only touch their own keys."""
    m = Master(tmp_path_factory.mktemp("shared-master"))
    yield m
    m.kill()


# ---------------------------------------------------------------- store


def _store_cls() -> Any:
    from mooncake.store import MooncakeDistributedStore

    return MooncakeDistributedStore


def setup_positional(
    s: Any,
    m: Master,
    global_segment_size: int = SEGMENT_SIZE,
    local_buffer_size: int = LOCAL_BUFFER_SIZE,
    local_hostname: str = "127.0.0.1",
    **kw: Any,
) -> int:
    """``s.setup`` on ``m`` over TCP with upstream's seven positional
    arguments (and ``kw`` as keywords); its return code."""
    return s.setup(
        local_hostname,
        m.metadata_url,
        global_segment_size,
        local_buffer_size,
        "tcp",
        "",
        m.rpc_addr,
        **kw,
    )


def new_store(
    m: Master,
    global_segment_size: int = SEGMENT_SIZE,
    local_buffer_size: int = LOCAL_BUFFER_SIZE,
    local_hostname: str = "127.0.0.1",
) -> tuple[Any, int]:
    s = _store_cls()()
    rc = setup_positional(s, m, global_segment_size, local_buffer_size, local_hostname)
    return s, rc


class StoreFactory:
    def __init__(self, default_master: Callable[[], Master]) -> None:
        self._default_master = default_master
        self.stores: list[Any] = []

    def __call__(
        self,
        m: Master | None = None,
        global_segment_size: int = SEGMENT_SIZE,
        local_buffer_size: int = LOCAL_BUFFER_SIZE,
        local_hostname: str = "127.0.0.1",
        expect_rc: int | None = 0,
    ) -> Any:
        m = m or self._default_master()
        s, rc = new_store(m, global_segment_size, local_buffer_size, local_hostname)
        self.stores.append(s)
        if expect_rc is not None:
            assert rc == expect_rc, f"setup returned {rc}"
        return s

    def raw(self) -> Any:
        s = _store_cls()()
        self.stores.append(s)
        return s

    def close_all(self) -> None:
        for s in reversed(self.stores):
            with contextlib.suppress(Exception):
                s.close()
        self.stores.clear()


@pytest.fixture
def store_factory(
    request: pytest.FixtureRequest, master_factory: Callable[..., Master]
) -> Iterator[StoreFactory]:
    """``store_factory(master=None, global_segment_size=64MiB, local_buffer_size=16MiB)``.

    Without a master argument it uses the module's ``shared_master``. Stores are
    closed before any master started by ``master_factory`` is killed.
    """
    f = StoreFactory(lambda: request.getfixturevalue("shared_master"))
    yield f
    f.close_all()


@pytest.fixture
def store(store_factory: StoreFactory) -> Any:
    """A set-up store (64 MiB segment, 16 MiB local buffer) on the module master."""
    return store_factory()


_key_counter = 0


@pytest.fixture
def key(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``key("k1")`` -> a key unique to this test (tests share module masters)."""
    global _key_counter
    _key_counter += 1
    prefix = f"{request.node.name}-{os.getpid()}-{_key_counter}"

    def k(name: str) -> str:
        return f"{prefix}/{name}"

    return k


# ---------------------------------------------------------------- numpy buffers


class Buffers:
    """Allocates numpy buffers and keeps them alive for the test."""

    def __init__(self) -> None:
        self.arrays: list[Any] = []

    def __call__(self, size: int, fill: int | None = None) -> Any:
        import numpy as np

        arr = np.zeros(size, dtype=np.uint8) if fill is None else np.full(size, fill, np.uint8)
        self.arrays.append(arr)
        return arr


@pytest.fixture
def buf() -> Buffers:
    return Buffers()


def ptr(arr: Any) -> int:
    return int(arr.ctypes.data)


# ---------------------------------------------------------------- child clients


class ChildError(AssertionError):
    pass


class Child(JsonLineChild):
    """A client process (tests/helpers/store_client.py) driven by JSON lines."""

    error = ChildError

    def __init__(self, tmpdir: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="child-", suffix=".log", dir=tmpdir)[1])
        argv = [sys.executable, str(HELPERS / "store_client.py")]
        self._spawn(subprocess.Popen, argv, env, str(REPO), 30.0)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def name(self) -> str:
        return "child"

    def setup(self, m: Master, **kw: Any) -> int:
        args = {
            "local_hostname": "127.0.0.1",
            "metadata_server": m.metadata_url,
            "global_segment_size": SEGMENT_SIZE,
            "local_buffer_size": LOCAL_BUFFER_SIZE,
            "protocol": "tcp",
            "rdma_devices": "",
            "master_server_addr": m.rpc_addr,
        }
        args.update(kw)
        return int(self.call("setup", args=args))

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        _kill_tree(self.proc, sig)

    def stop(self) -> None:
        """Ask the child to close and exit; SIGKILL if it does not within 15 s."""
        self.ask_exit(15.0)
        self.kill()
        self.close_pipes()

    def close_pipes(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                with contextlib.suppress(Exception):
                    f.close()


@pytest.fixture
def child_factory(
    tmp_path: Path, master_factory: Callable[..., Master]
) -> Iterator[Callable[..., Child]]:
    """``child_factory(env={...})`` starts a client child process; all are killed at teardown."""

    def stop(c: Child) -> None:
        c.kill()
        c.close_pipes()

    yield from started_by(lambda env=None: Child(tmp_path, env), stop)


@pytest.fixture
def token_owner(
    master_factory: Callable[..., Master],
    child_factory: Callable[..., Child],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> Callable[..., tuple[Master, Child]]:
    """``token_owner(token_text, **master_flags)`` writes ``token_text`` to a
    token file, starts a master that requires it and an owner child process
    (same-host path off) that holds it, and sets this process's environment
    to hold it too; returns ``(master, owner)``."""

    def start(token_text: str, **master_flags: Any) -> tuple[Master, Child]:
        token = tmp_path / "cluster.token"
        token.write_text(token_text)
        m = master_factory(auth_token_file=str(token), **master_flags)
        owner = child_factory({"MC_AUTH_TOKEN_FILE": str(token), "MC_STORE_SAME_HOST": "off"})
        assert owner.setup(m) == 0
        monkeypatch.setenv("MC_AUTH_TOKEN_FILE", str(token))
        monkeypatch.setenv("MC_STORE_SAME_HOST", "off")
        return m, owner

    return start


def run_script(
    args: list[str], timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``sys.executable`` with ``args`` (bounded); the child is killed on timeout."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=str(REPO),
        stdin=subprocess.DEVNULL,
        check=False,
    )
