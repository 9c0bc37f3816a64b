"""The cross-host data path over real interfaces (network namespaces on a bridge).

Processes in different network namespaces stand for different hosts: their
reads and writes must go over TCP between the hosts' addresses, never through
the same-host mapping (whose abstract Unix socket does not even exist across
namespaces), and the segment names carry the host's own address.
"""

from __future__ import annotations

from typing import Any

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
