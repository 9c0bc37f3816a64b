"""Simulated hosts for the cross-host benchmarks: network namespaces joined
by a veth pair (two hosts) or a bridge (any number), created and removed by
the benchmark itself (root needed). The system default congestion control
can be set inside the namespaces only, so the machine's own stays as it is.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ALLOWED = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")


def run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


@contextlib.contextmanager
def veth_pair(ip_a: str = "10.77.0.1", ip_b: str = "10.77.0.2") -> Iterator[tuple[str, str]]:
    """Two namespaces joined by one veth pair; yields their names."""
    tag = f"{os.getpid() % 100000}"
    a, b = f"xha{tag}", f"xhb{tag}"
    try:
        run(["ip", "netns", "add", a])
        run(["ip", "netns", "add", b])
        run(
            ["ip", "link", "add", f"va{tag}", "netns", a, "type", "veth", "peer", "name",
             f"vb{tag}", "netns", b]
        )  # fmt: skip
        for ns, dev, ip in ((a, f"va{tag}", ip_a), (b, f"vb{tag}", ip_b)):
            run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev])
            run(["ip", "-n", ns, "link", "set", dev, "up"])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
        yield a, b
    finally:
        run(["ip", "netns", "del", a], check=False)
        run(["ip", "netns", "del", b], check=False)


@contextlib.contextmanager
def bridged(n: int, subnet: str = "10.78.0") -> Iterator[list[tuple[str, str]]]:
    """``n`` namespaces on one bridge; yields ``(namespace, address)`` per host."""
    tag = f"{os.getpid() % 10000}"
    br = f"xbr{tag}"
    hosts = [(f"xh{tag}n{i}", f"{subnet}.{i + 2}") for i in range(n)]
    try:
        run(["ip", "link", "add", br, "type", "bridge"])
        run(["ip", "link", "set", br, "up"])
        for i, (ns, ip) in enumerate(hosts):
            port = f"xp{tag}n{i}"
            run(["ip", "netns", "add", ns])
            run(["ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
            run(["ip", "link", "set", port, "master", br])
            run(["ip", "link", "set", port, "up"])
            run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"])
            run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
        yield hosts
    finally:
        for i, (ns, _) in enumerate(hosts):
            run(["ip", "netns", "del", ns], check=False)
            run(["ip", "link", "del", f"xp{tag}n{i}"], check=False)
        run(["ip", "link", "del", br], check=False)


@contextlib.contextmanager
def cubic_allowed() -> Iterator[None]:
    """Let namespaces make cubic their default (a namespace may only pick an
    algorithm from the allowed list); the list is restored afterwards."""
    before = ALLOWED.read_text().split()
    if "cubic" not in before:
        ALLOWED.write_text(" ".join([*before, "cubic"]))
    try:
        yield
    finally:
        ALLOWED.write_text(" ".join(before))


def set_default_cc(namespaces: list[str], cc: str) -> None:
    for ns in namespaces:
        run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv4.tcp_congestion_control={cc}"])


def free_port_in(ns: str) -> int:
    code = "import socket;s=socket.socket();s.bind(('',0));print(s.getsockname()[1])"
    return int(run(["ip", "netns", "exec", ns, sys.executable, "-c", code]).stdout)
