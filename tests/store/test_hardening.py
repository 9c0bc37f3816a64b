"""Hardening: a broken or hostile peer on the network must not crash the
master, empty the store, or starve a client.

Three groups: connection and descriptor limits, the cluster token on every
connection, and puts that avoid the segment of a dead owner. Attack traffic
comes from 127.0.0.2 where a per-peer limit matters, so that honest clients
(127.0.0.1) are a different peer.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import hmac
import json
import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Child, Master, http_request, wait_until

MiB = 1 << 20
TCP_ENV = {"MC_STORE_SAME_HOST": "off"}
ATTACKER = "127.0.0.2"
TOKEN = "correct horse battery staple"

pytestmark = pytest.mark.ours


# ---------------------------------------------------------------- helpers


def _port(hostname: str) -> int:
    return int(hostname.rsplit(":", 1)[1])


def _connect(port: int, source: str = ATTACKER) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _closed_by_peer(sk: socket.socket, timeout: float) -> bool:
    """True once the peer closed the connection (EOF or reset) within ``timeout``."""
    sk.settimeout(0.5)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not sk.recv(4096):
                return True
        except (TimeoutError, BlockingIOError):
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


# The wire format of our own protocol (crates/common/src/framing.rs, auth.rs,
# crates/transfer/src/data_path/data_proto.rs), written out so that the test speaks it
# like a foreign peer would.
MAGIC = b"MCRS"
PROTOCOL_VERSION = 4
SERVICE_DATA = 1


def _frame(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def _read_frame(sk: socket.socket) -> bytes:
    head = _recv_exact(sk, 4)
    return _recv_exact(sk, struct.unpack("<I", head)[0])


def _recv_exact(sk: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sk.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def _mac(key: bytes, domain: bytes, *parts: bytes) -> bytes:
    m = hmac.new(key, bytes([len(domain)]) + domain, hashlib.sha256)
    for p in parts:
        m.update(struct.pack("<I", len(p)) + p)
    return m.digest()


def _data_handshake(sk: socket.socket, token: str | None) -> bool:
    """Our client handshake on a data port; True when the session is open."""
    nonce = os.urandom(32)
    hello = MAGIC + struct.pack("<II", PROTOCOL_VERSION, SERVICE_DATA)
    sk.sendall(_frame(hello) + _frame(nonce + bytes([token is not None])))
    _read_frame(sk)  # the server's hello
    server = _read_frame(sk)
    server_nonce, required = server[:32], server[32]
    if not required:
        return True
    if token is None:
        return False
    key = token.encode()
    proof = _mac(key, b"mooncake-auth-v1 client", bytes([SERVICE_DATA]), server_nonce, nonce)
    sk.sendall(_frame(proof))
    result = _read_frame(sk)
    return result[0] == 1


def _write_request(uuid: str, offset: int, payload: bytes, ticket: bytes | None = None) -> bytes:
    u = uuid.encode()
    head = bytes([2, len(u)]) + u if ticket is None else bytes([3, len(u)]) + u + ticket
    return head + struct.pack("<IQI", 1, offset, len(payload)) + payload


def _replica(m: Master, key: str) -> tuple[str, int]:
    status, body = m.query_key(key)
    assert status == 200, body
    (r,) = body["data"]
    return r["transport_endpoint_"], int(r["buffer_address_"])


def _segment_meta(m: Master, segment: str) -> dict[str, Any]:
    status, body, _ = http_request(f"{m.metadata_url}?key=mooncake/ram/{segment}")
    assert status == 200, body
    return json.loads(body)


def _token_file(tmp_path: Path, token: str = TOKEN) -> str:
    p = tmp_path / "cluster.token"
    p.write_text(token + "\n")
    p.chmod(0o600)
    return str(p)


# ------------------------------------------ connection and descriptor limits


@pytest.mark.slow
def test_idle_data_connections_do_not_starve_the_heartbeat(
    master_factory: Callable[..., Master], child_factory: Callable[..., Child]
) -> None:
    """150 idle connections right after setup, with 256 descriptors: the
    owner keeps heartbeating and its objects stay readable."""
    m = master_factory(client_ttl=3)
    owner = child_factory({**TCP_ENV, "MC_TEST_NOFILE": "256"})
    reader = child_factory(TCP_ENV)
    assert owner.setup(m) == 0
    host = owner.call("hostname")
    flood: list[socket.socket] = []
    for _ in range(150):
        try:
            flood.append(_connect(_port(host)))
        except OSError:
            break
    try:
        assert (
            owner.call("put_pattern", key="kept", size=100_000, seed=3, preferred_segment=host) == 0
        )
        assert reader.setup(m, global_segment_size=0) == 0
        # Three client TTLs: an owner whose heartbeat cannot connect expires.
        time.sleep(9)
        assert owner.call("health") == 0
        assert host in m.segments()
        assert reader.call("check_pattern", key="kept", size=100_000, seed=3) == {
            "n": 100_000,
            "match": True,
        }
    finally:
        for sk in flood:
            sk.close()


def test_idle_data_connections_are_closed(
    master: Master, child_factory: Callable[..., Child]
) -> None:
    owner = child_factory({**TCP_ENV, "MC_DATA_IDLE_TIMEOUT_S": "1"})
    assert owner.setup(master) == 0
    port = _port(owner.call("hostname"))
    silent = [_connect(port) for _ in range(3)]
    greeted = _connect(port)
    assert _data_handshake(greeted, None)
    for sk in [*silent, greeted]:
        assert _closed_by_peer(sk, 15.0), "an idle data connection was never closed"
        sk.close()


def test_data_connections_per_peer_are_capped(
    master: Master, child_factory: Callable[..., Child]
) -> None:
    owner = child_factory({**TCP_ENV, "MC_DATA_MAX_CONNS_PER_PEER": "8"})
    reader = child_factory(TCP_ENV)
    assert owner.setup(master) == 0
    host = owner.call("hostname")
    assert owner.call("put_pattern", key="capped", size=50_000, seed=4, preferred_segment=host) == 0
    held = [_connect(_port(host)) for _ in range(8)]
    extra = _connect(_port(host))
    try:
        assert _closed_by_peer(extra, 15.0), "a connection over the per-peer cap was kept"
        # Another peer is not affected.
        assert reader.setup(master, global_segment_size=0) == 0
        assert reader.call("check_pattern", key="capped", size=50_000, seed=4)["match"]
    finally:
        for sk in [*held, extra]:
            sk.close()


@pytest.mark.slow
def test_accept_backs_off_when_descriptors_run_out(
    master: Master, child_factory: Callable[..., Child]
) -> None:
    """With every descriptor taken, pending connections must not make the
    accept loop spin; once descriptors free up they are served."""
    owner = child_factory({**TCP_ENV, "MC_TEST_NOFILE": "256"})
    reader = child_factory(TCP_ENV)
    assert owner.setup(master) == 0
    assert reader.setup(master, global_segment_size=0) == 0
    host = owner.call("hostname")
    assert owner.call("put_pattern", key="bo", size=50_000, seed=5, preferred_segment=host) == 0
    assert owner.call("hog_fds") > 0
    pending = [_connect(_port(host)) for _ in range(5)]
    try:
        before = _cpu_seconds(owner.pid)
        time.sleep(3)
        used = _cpu_seconds(owner.pid) - before
        # A loop retrying accept() without a pause burns a whole core.
        assert used < 1.0, f"owner used {used:.2f} s of CPU in 3 s with no descriptors"
    finally:
        assert owner.call("release_fds") == 0
        for sk in pending:
            sk.close()
    assert reader.call("check_pattern", key="bo", size=50_000, seed=5)["match"]


@pytest.mark.slow
def test_heartbeat_reconnects_with_no_descriptor_left(
    master_factory: Callable[..., Master], child_factory: Callable[..., Child]
) -> None:
    """The heartbeat's reserved path: the master goes away, the heartbeat
    drops its connection, every descriptor of the owner is taken meanwhile;
    when the master is back the heartbeat still reconnects and remounts (it
    keeps a socket in reserve for that)."""
    m = master_factory(client_ttl=3)
    owner = child_factory({**TCP_ENV, "MC_TEST_NOFILE": "256"})
    assert owner.setup(m) == 0
    host = owner.call("hostname")
    m.kill()
    assert wait_until(lambda: owner.call("health") == 2, 10.0)
    assert owner.call("hog_fds") > 0
    try:
        m.restart()
        assert wait_until(lambda: host in m.segments(), 15.0), "owner never remounted"
        assert wait_until(lambda: owner.call("health") == 0, 10.0)
    finally:
        assert owner.call("release_fds") == 0


# ----------------------------------------- the cluster token on every connection


def test_token_required_on_every_connection(
    master_factory: Callable[..., Master], child_factory: Callable[..., Child], tmp_path: Path
) -> None:
    token_file = _token_file(tmp_path)
    m = master_factory(auth_token_file=token_file)
    good = child_factory({**TCP_ENV, "MC_AUTH_TOKEN_FILE": token_file})
    same = child_factory({**TCP_ENV, "MC_AUTH_TOKEN": TOKEN})
    none = child_factory(TCP_ENV)
    wrong = child_factory({**TCP_ENV, "MC_AUTH_TOKEN": "not the token"})
    assert good.setup(m) == 0
    assert same.setup(m, global_segment_size=0) == 0
    assert none.setup(m) == -1
    assert wrong.setup(m) == -1
    host = good.call("hostname")
    assert good.call("put_pattern", key="a1", size=300_000, seed=1, preferred_segment=host) == 0
    assert same.call("check_pattern", key="a1", size=300_000, seed=1)["match"]
    # Writes over TCP from the other client land (with a ticket).
    assert same.call("put_pattern", key="a2", size=200_000, seed=2, preferred_segment=host) == 0
    assert good.call("check_pattern", key="a2", size=200_000, seed=2)["match"]
    # A client with a token does not talk to a master without one.
    plain = master_factory()
    assert child_factory({**TCP_ENV, "MC_AUTH_TOKEN": TOKEN}).setup(plain) == -1


def test_data_port_refuses_writes_without_token_or_ticket(
    master_factory: Callable[..., Master], child_factory: Callable[..., Child], tmp_path: Path
) -> None:
    """Item 6: the segment uuid and offsets are public; with a token a peer
    still cannot overwrite stored bytes."""
    token_file = _token_file(tmp_path)
    m = master_factory(auth_token_file=token_file)
    owner = child_factory({**TCP_ENV, "MC_AUTH_TOKEN_FILE": token_file})
    assert owner.setup(m) == 0
    host = owner.call("hostname")
    assert owner.call("put_pattern", key="victim", size=4096, seed=9, preferred_segment=host) == 0
    endpoint, addr = _replica(m, "victim")
    meta = _segment_meta(m, host)
    offset = addr - int(meta["base_addr"])
    evil = b"\xee" * 4096

    # No token: the handshake does not open a session; a write anyway is dropped.
    sk = _connect(_port(endpoint))
    assert not _data_handshake(sk, None)
    with contextlib.suppress(OSError):
        sk.sendall(_write_request(meta["uuid"], offset, evil))
    assert _closed_by_peer(sk, 15.0)
    sk.close()

    # With the token but no ticket, and with a forged ticket: dropped.
    forged = struct.pack("<QQQ", offset, 4096, int(time.time() * 1000) + 60_000) + b"\x00" * 32
    for ticket in (None, forged):
        sk = _connect(_port(endpoint))
        assert _data_handshake(sk, TOKEN)
        try:
            sk.sendall(_write_request(meta["uuid"], offset, evil, ticket))
            status = _recv_exact(sk, 4)
            assert struct.unpack("<i", status)[0] != 0
        except (ConnectionError, OSError):
            pass
        sk.close()
    assert owner.call("check_pattern", key="victim", size=4096, seed=9)["match"]


def test_mapping_socket_requires_the_token(
    master_factory: Callable[..., Master], child_factory: Callable[..., Child], tmp_path: Path
) -> None:
    token_file = _token_file(tmp_path)
    m = master_factory(auth_token_file=token_file)
    owner = child_factory({"MC_AUTH_TOKEN_FILE": token_file})
    reader = child_factory({"MC_AUTH_TOKEN": TOKEN})
    assert owner.setup(m) == 0
    assert reader.setup(m, global_segment_size=0) == 0
    host = owner.call("hostname")
    assert owner.call("put_pattern", key="m1", size=1 * MiB, seed=2, preferred_segment=host) == 0
    before = reader.call("stats")
    assert reader.call("check_pattern", key="m1", size=1 * MiB, seed=2)["match"]
    after = reader.call("stats")
    assert after["bytes_read_same_host"] - before["bytes_read_same_host"] == 1 * MiB

    uuid = _segment_meta(m, host)["uuid"].encode()
    sk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sk.settimeout(5)
    sk.connect(b"\0mooncake-seg-" + uuid)
    sk.sendall(bytes([len(uuid)]) + uuid + b"\x00" + os.urandom(32) + b"\x00" * 64)
    fds = array.array("i")
    try:
        while True:
            data, anc, _, _ = sk.recvmsg(4096, socket.CMSG_SPACE(4 * fds.itemsize))
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
            if not data:
                break
    except OSError:
        pass
    for fd in fds:
        os.close(fd)
    sk.close()
    assert len(fds) == 0, "the owner handed its segment to a peer without the token"


def test_metadata_writes_need_the_token(
    master_factory: Callable[..., Master], tmp_path: Path
) -> None:
    m = master_factory(auth_token_file=_token_file(tmp_path))
    url = f"{m.metadata_url}?key=k"
    status, _, _ = http_request(url, "PUT", b"v")
    assert status == 401
    status, _, _ = http_request(url, "DELETE")
    assert status == 401
    base = m.metadata_url.rsplit("/", 1)[0]
    status, nonce, _ = http_request(base + "/auth/challenge")
    assert status == 200
    proof = _mac(
        TOKEN.encode(), b"mooncake-http-v1", b"PUT", b"k", b"v", bytes.fromhex(nonce.decode())
    )
    req_headers = {"X-Mooncake-Auth": f"{nonce.decode()}:{proof.hex()}"}
    import urllib.request

    req = urllib.request.Request(url, data=b"v", method="PUT", headers=req_headers)
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200
    # A nonce is good for one request only.
    req = urllib.request.Request(url, data=b"v", method="PUT", headers=req_headers)
    try:
        urllib.request.urlopen(req, timeout=5)
        raise AssertionError("a replayed proof was accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 401
    status, body, _ = http_request(url)
    assert (status, body) == (200, b"v")


# ------------------------------------------------- puts avoid dead owners' segments


@pytest.mark.slow
def test_puts_after_sigkill_land_on_live_segments(
    master_factory: Callable[..., Master], child_factory: Callable[..., Child]
) -> None:
    """Item 7: while a SIGKILLed client's segment is not yet expired, puts
    that would land there are placed on a live segment within the call."""
    m = master_factory(client_ttl=60)
    a = child_factory(TCP_ENV)
    b = child_factory(TCP_ENV)
    assert a.setup(m) == 0
    assert b.setup(m) == 0
    b.kill()
    for replicas in (1, 2):
        for i in range(20):
            k = f"after-kill-{replicas}-{i}"
            assert a.call("put_pattern", key=k, size=20_000, seed=i, replica_num=replicas) == 0, k
            assert a.call("check_pattern", key=k, size=20_000, seed=i)["match"], k
    assert wait_until(lambda: len(m.segments()) == 2, 1.0)
