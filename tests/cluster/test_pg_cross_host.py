"""The ``mooncake-cpu`` process group between hosts (network namespaces):
ranks that meet through ``init_method="tcp://host:port"`` alone advertise the
address on their route to that host (not loopback), reach each other over
TCP, and their rank links follow the data-connection congestion rule. Ranks
in different namespaces of one machine still share its CPUs, and fit their
compute threads to them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import tcp_sockets

HERE = Path(__file__).resolve().parent
pytest.importorskip("torch")


@pytest.fixture
def ranks(net: Any) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def start_ranks(
    net: Any, ranks: list[subprocess.Popen[str]], *args: str, env: dict[str, str] | None = None
) -> None:
    """Starts rank 0 on host c1 and rank 1 on c2 (``pg_rank.py`` with
    ``args`` after its own), meeting through a free port on c1."""
    port = int(
        net.exec(
            "c1",
            [
                sys.executable,
                "-c",
                "import socket;s=socket.socket();s.bind(('',0));print(s.getsockname()[1])",
            ],
        ).stdout
    )
    init = f"tcp://{net.ip('c1')}:{port}"
    for rank, host in enumerate(("c1", "c2")):
        ranks.append(
            net.popen(
                host,
                [sys.executable, str(HERE / "pg_rank.py"), str(rank), "2", init, *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )


def results(ranks: list[subprocess.Popen[str]]) -> list[Any]:
    """Each rank's JSON result line."""
    out = []
    for p in ranks:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line:
            for q in ranks:
                q.kill()
            errs = [(q.wait(), q.stderr.read() if q.stderr else "") for q in ranks]
            raise AssertionError(f"a rank printed no result: {errs}")
        out.append(json.loads(line))
    return out


def finish(ranks: list[subprocess.Popen[str]]) -> None:
    """Closes the ranks' stdin (they leave the group) and checks their exits."""
    for p in ranks:
        assert p.stdin is not None
        p.stdin.close()
    for p in ranks:
        assert p.wait(timeout=60) == 0, p.stderr.read() if p.stderr else ""


def test_ranks_on_two_hosts_meet_through_init_method_and_links_avoid_pacing(
    net: Any, default_cc: Any, ranks: list[subprocess.Popen[str]]
) -> None:
    default_cc("bbr")
    start_ranks(net, ranks)
    for r in results(ranks):
        assert r == {"sum": 3.0, "all_equal": True}
    # The rank links run between the hosts' addresses, with cubic at both ends.
    peers = {
        "c1": [(loc, peer, cc) for loc, peer, cc in tcp_sockets(net, "c1", ranks[0].pid, "established")
               if peer.startswith(net.ip("c2") + ":")],
        "c2": [(loc, peer, cc) for loc, peer, cc in tcp_sockets(net, "c2", ranks[1].pid, "established")
               if peer.startswith(net.ip("c1") + ":")],
    }  # fmt: skip
    links = peers["c1"] + peers["c2"]
    assert peers["c1"] and peers["c2"], peers
    assert not [x for x in links if x[0].startswith("127.")], links
    # Rank links (not the TCP store's connections, which torch owns) are cubic.
    ours = [cc for _, _, cc in links if cc == "cubic"]
    assert len(ours) >= 2, links
    # Each rank's link listener is set to cubic before it accepts anything,
    # so no rank link starts under bbr (whose pacing timer would survive a
    # later switch).
    for host, p in zip(("c1", "c2"), ranks, strict=True):
        listening = [cc for _, _, cc in tcp_sockets(net, host, p.pid, "listening")]
        assert "cubic" in listening, (host, listening)
    finish(ranks)


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs 2 CPUs: one thread per rank cannot oversubscribe one CPU",
)
def test_ranks_in_two_namespaces_of_one_machine_share_its_cpus(
    net: Any, ranks: list[subprocess.Popen[str]]
) -> None:
    # Each rank starts with one torch thread per CPU (torch's default): two
    # such ranks on one machine oversubscribe its cores although they are
    # different hosts to the network, so each runs its share.
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    start_ranks(net, ranks, "default", env=env)
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    for r in results(ranks):
        assert r == {"sum": 3.0, "all_equal": True, "threads": share}
    finish(ranks)
