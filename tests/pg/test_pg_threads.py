"""Compute threads of ranks that share a host's CPUs: a rank whose launcher
left the thread count to torch runs its share of the CPUs (as torchrun's
ranks do), and a rank whose user set ``OMP_NUM_THREADS`` keeps its threads;
both say once what they found."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

# Each rank starts with one torch thread per CPU of the host (torch's
# default, set explicitly so that the test does not depend on how torch
# counts cores), joins a world of 2 and reports its threads after init.
RANK = textwrap.dedent(
    """
    import json, os, sys, warnings
    import torch, torch.distributed as dist
    import mooncake.pg  # noqa: F401
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    cpus = len(os.sched_getaffinity(0))
    torch.set_num_threads(cpus)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        dist.init_process_group(
            "mooncake-cpu", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
        )
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    out = {
        "cpus": cpus,
        "threads": torch.get_num_threads(),
        "sum": t.tolist(),
        "warnings": [str(w.message) for w in seen if "torch threads" in str(w.message)],
    }
    dist.destroy_process_group()
    print("@@" + json.dumps(out), flush=True)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _world(env_extra: dict[str, str]) -> list[dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(env_extra)
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(r), str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
        line = next(x for x in out.splitlines() if x.startswith("@@"))
        outs.append(json.loads(line[2:]))
    return outs


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs 2 CPUs: one thread per rank cannot oversubscribe one CPU",
)
def test_a_rank_left_at_torchs_default_runs_its_share_of_the_cpus() -> None:
    for r in _world({}):
        share = max(1, int(r["cpus"]) // 2)  # type: ignore[call-overload]
        assert r["threads"] == share
        assert r["sum"] == [3.0] * 4
        (msg,) = r["warnings"]  # type: ignore[misc]
        assert f"torch.set_num_threads({share})" in msg
        assert "OMP_NUM_THREADS" in msg


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs 2 CPUs: one thread per rank cannot oversubscribe one CPU",
)
def test_omp_num_threads_set_by_the_user_keeps_the_threads_and_warns() -> None:
    for r in _world({"OMP_NUM_THREADS": "2"}):
        assert r["threads"] == r["cpus"]
        assert r["sum"] == [3.0] * 4
        (msg,) = r["warnings"]  # type: ignore[misc]
        assert "OMP_NUM_THREADS is set, so the threads stay" in msg


def test_ranks_share_cpus_by_machine_and_affinity_not_by_network_namespace() -> None:
    from mooncake.pg._host import cpu_mask, machine_identity
    from mooncake.pg._rendezvous import shares_cpus

    me, mine = machine_identity(), cpu_mask()
    lowest = mine & -mine  # one CPU this process may run on
    other_cpus = (1 << 4096) & ~mine  # a CPU it may not run on
    here = (me, mine)
    # Same machine and overlapping affinity: shares, whatever its host
    # (another network namespace or container).
    assert shares_cpus({"host": "elsewhere", "machine": me, "cpus": hex(lowest)}, "here", here)
    # Same machine, disjoint affinity (each pinned to its own cores): no.
    assert not shares_cpus({"host": "here", "machine": me, "cpus": hex(other_cpus)}, "here", here)
    # Another machine: no, even with the same CPU numbers.
    assert not shares_cpus(
        {"host": "elsewhere", "machine": me + "x", "cpus": hex(mine)}, "here", here
    )
    # A record without the fields (an older peer) counts when its host is ours.
    assert shares_cpus({"host": "here"}, "here", here)
    assert not shares_cpus({"host": "elsewhere"}, "here", here)
