"""The cross-host data path over real interfaces (network namespaces on a bridge).

Processes in different network namespaces stand for different hosts: their
reads and writes must go over TCP between the hosts' addresses, never through
the same-host mapping (whose abstract Unix socket does not even exist across
namespaces), and the segment names carry the host's own address.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import tcp_sockets

MiB = 1 << 20


def _delta(after: dict[str, int], before: dict[str, int], name: str) -> int:
    return after[name] - before[name]


def test_reads_between_hosts_use_tcp(net: Any, masters: Any, clients: Any) -> None:
    m = masters("ctl")
    env = {"MC_LOG_LEVEL": "info"}
    a = clients("c1", env)
    b = clients("c2", env)
    assert a.setup(m.rpc_addr)["rc"] == 0
    assert b.setup(m.rpc_addr)["rc"] == 0
    seg_a = a.call("hostname")
    assert seg_a.startswith(net.ip("c1") + ":"), seg_a
    assert b.call("hostname").startswith(net.ip("c2") + ":")

    for size in (16 * MiB, 4096):
        key = f"x{size}"
        assert a.call("put", key=key, size=size, seed=size, preferred=seg_a)["rc"] == 0
        before = b.call("stats")
        assert b.call("get", key=key, size=size, seed=size)["rc"] == size
        after = b.call("stats")
        assert _delta(after, before, "bytes_read_tcp") == size
        assert _delta(after, before, "bytes_read_same_host") == 0
        assert _delta(after, before, "bytes_read_local") == 0
    assert b.call("stats")["same_host_mappings"] == 0
    # Writes from c2 into c1's segment cross the bridge too.
    before = b.call("stats")
    assert b.call("put", key="w", size=MiB, seed=7, preferred=seg_a)["rc"] == 0
    after = b.call("stats")
    assert _delta(after, before, "bytes_written_tcp") == MiB
    assert _delta(after, before, "bytes_written_same_host") == 0
    assert a.call("get", key="w", size=MiB, seed=7)["rc"] == MiB
    # No mapping was even attempted: the other namespace is another host.
    assert "same-host mapping unavailable" not in b.log_tail(1 << 20)


# ---------------------------------------------------------------- congestion control


def _data_connections(net: Any, owner: Any, reader: Any) -> tuple[list[str], list[str]]:
    """Congestion algorithms of the reader's connections to the owner's data
    server (in the reader's host), and of the owner's ends of them."""
    ports = {
        loc.rsplit(":", 1)[1]
        for loc, _, _ in tcp_sockets(net, owner.host, owner.proc.pid, "listening")
        if loc.startswith(owner.ip)
    }
    assert ports, "the owner listens for data connections on its address"
    client = [
        cc
        for _, peer, cc in tcp_sockets(net, reader.host, reader.proc.pid, "established")
        if peer == f"{owner.ip}:{peer.rsplit(':', 1)[1]}" and peer.rsplit(":", 1)[1] in ports
    ]
    server = [
        cc
        for loc, peer, cc in tcp_sockets(net, owner.host, owner.proc.pid, "established")
        if loc.rsplit(":", 1)[1] in ports and peer.startswith(reader.ip + ":")
    ]
    return client, server


@pytest.mark.parametrize(
    ("default", "setting", "want", "parts_1mib"),
    [
        ("bbr", "auto", "cubic", 1),
        ("cubic", "auto", "cubic", 1),
        ("reno", "auto", "reno", 1),
        ("bbr", "system", "bbr", 4),
    ],
)
def test_cross_host_connections_choose_their_congestion_control_and_parts(
    net: Any,
    masters: Any,
    clients: Any,
    default_cc: Callable[[str], None],
    default: str,
    setting: str,
    want: str,
    parts_1mib: int,
) -> None:
    """Both ends of a data connection between hosts run ``want``: a pacing
    system default (bbr) is replaced by cubic, any other one is kept, and
    ``MC_TCP_CONGESTION=system`` keeps the system's. A 1 MiB read goes over
    one connection unless the connections pace (then four 256 KiB parts on
    four); a 16 MiB read is four parts on four connections."""
    default_cc(default)
    m = masters("ctl")
    env = {"MC_TCP_CONGESTION": setting}
    owner = clients("c1", env)
    reader = clients("c2", env)
    assert owner.setup(m.rpc_addr)["rc"] == 0
    assert reader.setup(m.rpc_addr, global_segment_size=0)["rc"] == 0
    seg = owner.call("hostname")
    for size in (4096, MiB, 16 * MiB):
        assert owner.call("put", key=f"cc{size}", size=size, seed=size, preferred=seg)["rc"] == 0
    # A first small read opens one connection (and tells the pool how it paces).
    assert reader.call("get", key="cc4096", size=4096, seed=4096)["rc"] == 4096
    client, server = _data_connections(net, owner, reader)
    assert len(client) == 1 and set(client) == {want} and set(server) == {want}, (client, server)
    # The owner's data listener carries the algorithm itself, so accepted
    # connections start under it (one switched from bbr after its handshake
    # would keep bbr's pacing timer).
    listening = [
        cc
        for loc, _, cc in tcp_sockets(net, owner.host, owner.proc.pid, "listening")
        if loc.startswith(owner.ip)
    ]
    assert listening and set(listening) == {want}, listening

    before = reader.call("stats")
    assert reader.call("get", key=f"cc{MiB}", size=MiB, seed=MiB)["rc"] == MiB
    after = reader.call("stats")
    assert _delta(after, before, "tcp_read_requests") == 1  # one call, one owner
    client, server = _data_connections(net, owner, reader)
    # One part reuses the idle connection; four parts need more of them (how
    # many depends on whether a part's thread starts before another part
    # returned its connection to the pool).
    if parts_1mib == 1:
        assert len(client) == 1, client
    else:
        assert 2 <= len(client) <= parts_1mib, client
    assert set(client) == {want} and set(server) == {want}, (client, server)

    before = reader.call("stats")
    assert reader.call("get", key=f"cc{16 * MiB}", size=16 * MiB, seed=16 * MiB)["rc"] == 16 * MiB
    after = reader.call("stats")
    assert _delta(after, before, "tcp_read_requests") == 1
    client, server = _data_connections(net, owner, reader)
    # Four parts, on as many connections as were in use at once.
    assert 2 <= len(client) <= 4 and len(server) == len(client), (client, server)
    assert set(client) == {want} and set(server) == {want}, (client, server)
