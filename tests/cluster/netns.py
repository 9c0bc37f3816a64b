"""Simulated hosts for the multi-host tests: network namespaces on a bridge,
and the faults the tests inject between them.

Each "host" is a network namespace (``ip netns``) with one veth interface
whose peer is a port of a bridge in the root namespace. The bridge holds the
``.1`` address of a private /24 that the topology picks and owns, so the test
process (in the root namespace) reaches every host, and the hosts reach each
other over real interfaces, not loopback. Everything is removed by
``Net.down()``.

Faults (``Faults``):

- latency: ``tc qdisc ... netem delay`` on the host's interface when the
  kernel has ``sch_netem``; otherwise the host's outgoing packets go to an
  NFQUEUE (``iptables -j NFQUEUE --queue-bypass``) served by
  ``mc_nfq_delay`` (crates/netfault), which holds each packet for the delay.
- reordering: ``netem delay ... reorder`` when available, else the same
  NFQUEUE with ``mc_nfq_delay --hold-pct``: a random share of the packets is
  held, the rest pass at once.
- loss: ``netem loss`` when available, else ``iptables -m statistic --mode
  random --probability p -j DROP`` on the host's outgoing packets.
- partition of a host: its interface's bridge port goes down (and back up).
- a cut between two hosts: iptables DROP rules in the first host for the
  second host's address, both directions.

``Faults.mechanism`` says which of netem / iptables+NFQUEUE ran; the tests
print it so the output says how the fault was made.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _run(
    argv: list[str], check: bool = True, timeout: float = 20.0
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
    )
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} -> {r.returncode}: {r.stderr.strip()}")
    return r


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be used here (None when they can)."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces (CI runs as root)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"needs the '{tool}' command (apt-get install iproute2 iptables)"
    probe = f"mcprobe{os.getpid() % 100000}"
    r = _run(["ip", "netns", "add", probe], check=False)
    if r.returncode != 0:
        return f"'ip netns add' failed: {r.stderr.strip()}"
    try:
        r = _run(["ip", "netns", "exec", probe, "iptables", "-S"], check=False)
        if r.returncode != 0:
            return f"iptables does not work inside a namespace: {r.stderr.strip()}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


def _used_subnets() -> set[int]:
    """Third octets of the 10.231.x.0/24 networks already present on this machine."""
    out = _run(["ip", "-o", "-4", "addr"], check=False).stdout
    used = set()
    for line in out.splitlines():
        for tok in line.split():
            if tok.startswith("10.231."):
                with contextlib.suppress(ValueError, IndexError):
                    used.add(int(tok.split(".")[2]))
    return used


class Net:
    """A bridge plus one namespace per host name, with addresses 10.231.N.2, .3, ..."""

    def __init__(self, hosts: list[str]) -> None:
        self.tag = f"{os.getpid() % 10000:04d}"
        used = _used_subnets()
        start = os.getpid() % 200 + 20
        octet = next(o for o in [*range(start, 250), *range(20, start)] if o not in used)
        self.subnet = f"10.231.{octet}"
        self.bridge = f"mcbr{self.tag}"
        self.hosts: dict[str, dict[str, str]] = {}
        for i, name in enumerate(hosts):
            self.hosts[name] = {
                "ns": f"mc{self.tag}{name}",
                "ip": f"{self.subnet}.{i + 2}",
                "port": f"mcv{self.tag}{i}",  # bridge side (root namespace)
                "dev": "eth0",  # inside the namespace
            }
        self.gateway = f"{self.subnet}.1"
        self._up = False

    # ------------------------------------------------------------ lifecycle
    def up(self) -> Net:
        try:
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
            _run(["ip", "link", "set", self.bridge, "up"])
            self._up = True
            for h in self.hosts.values():
                ns = h["ns"]
                _run(["ip", "netns", "add", ns])
                _run(
                    [
                        "ip",
                        "link",
                        "add",
                        h["port"],
                        "type",
                        "veth",
                        "peer",
                        "name",
                        "mctmp" + self.tag,
                    ]
                )
                _run(["ip", "link", "set", "mctmp" + self.tag, "netns", ns])
                _run(["ip", "-n", ns, "link", "set", "mctmp" + self.tag, "name", h["dev"]])
                _run(["ip", "link", "set", h["port"], "master", self.bridge])
                _run(["ip", "link", "set", h["port"], "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{h['ip']}/24", "dev", h["dev"]])
                _run(["ip", "-n", ns, "link", "set", h["dev"], "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
                _run(["ip", "-n", ns, "route", "add", "default", "via", self.gateway])
        except Exception:
            self.down()
            raise
        return self

    def down(self) -> None:
        for h in self.hosts.values():
            _run(["ip", "netns", "del", h["ns"]], check=False)
            _run(["ip", "link", "del", h["port"]], check=False)
        _run(["ip", "link", "del", self.bridge], check=False)
        self._up = False

    # ------------------------------------------------------------ helpers
    def ip(self, host: str) -> str:
        return self.hosts[host]["ip"]

    def ns(self, host: str) -> str:
        return self.hosts[host]["ns"]

    def wrap(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def exec(
        self, host: str, argv: list[str], check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return _run(self.wrap(host, argv), check=check)

    def popen(self, host: str, argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(self.wrap(host, argv), **kw)

    def tcp_ext(self, host: str, name: str) -> int:
        """The kernel's ``TcpExt`` counter ``name`` in ``host``'s namespace
        (``/proc/net/netstat``), e.g. ``TCPOFOQueue``: segments that arrived
        ahead of a gap and were queued out of order."""
        lines = [
            ln.split() for ln in self.exec(host, ["cat", "/proc/net/netstat"]).stdout.splitlines()
        ]
        for names, values in zip(lines[::2], lines[1::2], strict=False):
            if names and names[0] == "TcpExt:" and name in names:
                return int(values[names.index(name)])
        raise KeyError(f"TcpExt {name} not in {host}'s /proc/net/netstat")


class Faults:
    """Fault injection on a ``Net``; ``clear_all()`` undoes everything."""

    def __init__(self, net: Net) -> None:
        self.net = net
        self._delayers: dict[str, subprocess.Popen[bytes]] = {}
        self._dirty: set[str] = set()
        self._down: set[str] = set()
        self._netem: bool | None = None
        self.mechanism = ""

    # ------------------------------------------------------------ probing
    def netem_available(self) -> bool:
        """Whether ``tc qdisc add ... netem`` works here (probed once)."""
        if self._netem is None:
            host = next(iter(self.net.hosts))
            dev = self.net.hosts[host]["dev"]
            ok = shutil.which("tc") is not None and (
                self.net.exec(
                    host,
                    ["tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", "1ms"],
                    check=False,
                ).returncode
                == 0
            )
            if ok:
                self.net.exec(host, ["tc", "qdisc", "del", "dev", dev, "root"], check=False)
            self._netem = ok
        return self._netem

    def _note(self, what: str) -> None:
        self.mechanism = what
        print(f"[faults] {what}", file=sys.stderr)

    # ------------------------------------------------------------ latency / loss
    def _try_netem(self, host: str, args: list[str], what: str) -> bool:
        """Marks ``host`` for clearing; when the kernel has sch_netem, applies
        netem ``args`` to every packet ``host`` sends (noting ``what``) and
        returns True."""
        self._dirty.add(host)
        if not self.netem_available():
            return False
        dev = self.net.hosts[host]["dev"]
        self.net.exec(host, ["tc", "qdisc", "replace", "dev", dev, "root", "netem", *args])
        self._note(f"netem: {what}")
        return True

    def _output_rule(self, host: str, rule: list[str], what: str) -> None:
        """Appends an iptables OUTPUT ``rule`` for ``host``'s device inside
        ``host`` (the fallback without sch_netem) and notes ``what``."""
        dev = self.net.hosts[host]["dev"]
        self.net.exec(host, ["iptables", "-A", "OUTPUT", "-o", dev, *rule])
        self._note(what)

    def delay(self, host: str, ms: int) -> str:
        """Add ``ms`` of latency to every packet ``host`` sends. Returns the mechanism."""
        if self._try_netem(host, ["delay", f"{ms}ms"], f"{ms} ms delay on {host}"):
            return "netem"
        return self._hold(host, ms, 100, f"{ms} ms delay on {host}")

    def reorder(self, host: str, percent: int, ms: int, seed: int) -> str:
        """Hold ``percent`` % of the packets ``host`` sends, drawn at random
        (``seed``), for ``ms`` while the others pass at once: packets arrive
        out of the order they were sent in. Returns the mechanism."""
        what = f"{percent} % of {host}'s packets held {ms} ms (reordered)"
        # netem's `reorder R%` sends R % at once and delays the rest.
        args = ["delay", f"{ms}ms", "reorder", f"{100 - percent}%"]
        if self._try_netem(host, args, what):
            return "netem"
        return self._hold(host, ms, percent, what, ["--seed", str(seed)])

    def _hold(
        self, host: str, ms: int, percent: int, what: str, extra: list[str] | None = None
    ) -> str:
        """Send ``host``'s outgoing packets to an NFQUEUE served by
        ``mc_nfq_delay``, which holds ``percent`` % of them for ``ms`` (the
        fallback without sch_netem)."""
        queue = 100 + list(self.net.hosts).index(host)
        cmd = [str(delayer_bin()), "--queue", str(queue), "--delay-ms", str(ms)]
        cmd += ["--hold-pct", str(percent), *(extra or [])]
        proc = self.net.popen(
            host, cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        if line != "ready":
            proc.kill()
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"mc_nfq_delay did not start: {line!r} {err}")
        self._delayers[host] = proc
        self._output_rule(
            host,
            ["-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass"],
            f"iptables NFQUEUE + mc_nfq_delay (no sch_netem in this kernel): {what}",
        )
        return "nfqueue"

    def loss(self, host: str, percent: float) -> str:
        """Drop ``percent`` % of the packets ``host`` sends, at random."""
        if self._try_netem(host, ["loss", f"{percent}%"], f"{percent}% loss on {host}"):
            return "netem"
        p = f"{percent / 100:.4f}"
        self._output_rule(
            host,
            ["-m", "statistic", "--mode", "random", "--probability", p, "-j", "DROP"],
            f"iptables statistic DROP (no sch_netem in this kernel): {percent}% loss on {host}",
        )
        return "iptables"

    # ------------------------------------------------------------ partitions
    def partition(self, host: str) -> None:
        """Cut ``host`` off from every other host (its bridge port goes down)."""
        _run(["ip", "link", "set", self.net.hosts[host]["port"], "down"])
        self._down.add(host)
        self._note(f"link down: {host} partitioned")

    def heal(self, host: str) -> None:
        _run(["ip", "link", "set", self.net.hosts[host]["port"], "up"])
        self._down.discard(host)
        self._note(f"link up: {host} healed")

    def cut(self, host: str, other: str) -> None:
        """Drop all traffic between ``host`` and ``other`` (rules inside ``host``)."""
        ip = self.net.ip(other)
        self._dirty.add(host)
        self.net.exec(host, ["iptables", "-A", "OUTPUT", "-d", ip, "-j", "DROP"])
        self.net.exec(host, ["iptables", "-A", "INPUT", "-s", ip, "-j", "DROP"])
        self._note(f"iptables DROP between {host} and {other}")

    def one_way(self, host: str, other: str) -> None:
        """Drop what ``host`` sends to ``other``; ``other``'s packets still
        arrive (rules inside ``host``)."""
        self._dirty.add(host)
        self.net.exec(host, ["iptables", "-A", "OUTPUT", "-d", self.net.ip(other), "-j", "DROP"])
        self._note(f"iptables DROP from {host} to {other} (one way)")

    # ------------------------------------------------------------ undo
    def clear(self, host: str) -> None:
        dev = self.net.hosts[host]["dev"]
        proc = self._delayers.pop(host, None)
        self.net.exec(host, ["iptables", "-F"], check=False)
        if proc is not None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if proc.poll() is None:
                proc.kill()
        if self._netem:
            self.net.exec(host, ["tc", "qdisc", "del", "dev", dev, "root"], check=False)
        self._dirty.discard(host)
        if host in self._down:
            self.heal(host)

    def clear_all(self) -> None:
        for host in list(self._dirty | self._down | set(self._delayers)):
            self.clear(host)


def delayer_bin() -> Path:
    """The ``mc_nfq_delay`` binary, built on first use (``cargo build --release``)."""
    env = os.environ.get("MC_NFQ_DELAY_BIN")
    if env:
        return Path(env)
    path = REPO / "target" / "release" / "mc_nfq_delay"
    if not path.exists():
        _run(["cargo", "build", "--release", "-q", "-p", "mooncake-netfault"], timeout=900)
    return path


def wait_port(net: Net, host: str, port: int, timeout: float = 10.0) -> bool:
    """Whether ``host``'s ``port`` accepts TCP within ``timeout`` (probed from the root namespace)."""
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((net.ip(host), port), timeout=0.3):
                return True
        except OSError:
            time.sleep(0.05)
    return False
