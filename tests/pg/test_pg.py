"""Tests of the mooncake-cpu backend with real processes over shm and TCP.

Every multi-process scenario runs twice, with the default transport (shm
between same-host ranks) and with ``MOONCAKE_PG_TRANSPORT=tcp``. To keep the
suite inside its CI budget the scenarios share few process launches (see
``pg_harness``); each still reports as its own test.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from conftest import run_script
from pg_harness import LaunchResult, Step, run_launch

TRANSPORTS = ["auto", "tcp"]
BENCH_ARGS = (
    "-m mooncake.pg.bench --collective all_reduce --backends mooncake-cpu,gloo "
    "-g 2 -b 8 -e 1M -f 4 -n 5"
)
# Silence timeout T for the failure scenarios: 2 s, so survivors finish within
# 2·T = 4 s of a failure.
FAULT_ENV = {
    "MOONCAKE_PG_COLLECTIVE_TIMEOUT_US": "2000000",
    "MOONCAKE_PG_P2P_TIMEOUT_US": "2000000",
}


def _pairs(scenario: str, world: int, groups: list[list[int]], **kw: object) -> list[Step]:
    """``scenario`` once per transport, on two disjoint process sets (concurrently)."""
    return [
        Step(scenario, world, procs, transport=t, **kw)  # type: ignore[arg-type]
        for t, procs in zip(TRANSPORTS, groups, strict=True)
    ]


# A cluster token for every rank of a step: PG ranks authenticate like the
# store's clients.
TOKEN_ENV = {"MC_AUTH_TOKEN": "pg-cluster-secret"}

LO4, HI4 = [0, 1, 2, 3], [4, 5, 6, 7]
MAIN: list[Step] = [
    *_pairs("collectives", 4, [LO4, HI4]),
    *_pairs("p2p", 4, [LO4, HI4]),
    *_pairs("subgroups", 4, [LO4, HI4]),
    *(Step("topologies8", 8, list(range(8)), transport=t) for t in TRANSPORTS),
    *_pairs("collectives", 2, [[0, 1], [2, 3]]),
    *_pairs("reinit", 2, [[4, 5], [6, 7]]),
    *_pairs("bad_input", 2, [[0, 1], [2, 3]]),
    *_pairs("device_id_init", 2, [[4, 5], [6, 7]]),
    *_pairs("options_forms", 2, [[0, 1], [2, 3]]),
    *_pairs("futures", 2, [[4, 5], [6, 7]]),
    *_pairs("collectives", 1, [[0], [1]]),
    # Only rank 0 of a 2-rank group ever starts.
    *_pairs("never_joins", 2, [[2], [3]]),
    *_pairs("refused_connect", 2, [[4, 5], [6, 7]]),
    # With a cluster token, every link and coordinator session is authenticated.
    *_pairs("cluster_token", 3, [[0, 1, 2], [4, 5, 6]], env=TOKEN_ENV),
]


# Each failure scenario ends (or freezes) its top rank(s); later steps reuse
# the survivors. Two lanes of eight processes, one per transport, run side by
# side.
def _fault_lane(t: str, p: list[int]) -> list[Step]:
    return [
        Step("crash_survivors", 4, p[:4], t, FAULT_ENV, dies=[p[1]]),
        Step("pull_recovery", 4, [p[0], p[2], p[6], p[7]], t, FAULT_ENV, dies=[p[6], p[7]]),
        Step("exit_mid_send", 3, [p[0], p[2], p[4]], t, FAULT_ENV, dies=[p[4]]),
        Step("manual_evict", 3, [p[0], p[2], p[5]], t, FAULT_ENV, dies=[p[5]]),
        Step("freeze", 3, [p[0], p[2], p[3]], t, FAULT_ENV, freezes=[p[3]]),
        Step("drop_link", 2, [p[0], p[2]], t, FAULT_ENV),
    ]


FAULTS: list[Step] = [
    s
    for pair in zip(
        _fault_lane("auto", list(range(8))), _fault_lane("tcp", list(range(8, 16))), strict=True
    )
    for s in pair
]


# Elastic membership: two lanes of seven processes, one per transport. Steps
# on q0-q3 and q4-q6 run side by side; the steps that kill or freeze a
# process come last in each process's plan.
ADMISSION_ENV = {"MOONCAKE_PG_ADMISSION_TIMEOUT_US": "2000000"}


def _elastic_lane(t: str, q: list[int]) -> list[Step]:
    return [
        Step("scale_up", 4, q[:4], t),
        Step("racing_threads", 3, q[4:7], t),
        Step("scale_down", 4, q[:4], t),
        Step("subgroups_ext", 4, q[:4], t),
        Step("elastic_bad_input", 4, q[:4], t, ADMISSION_ENV),
        Step("partial_activation", 4, q[:4], t, ADMISSION_ENV),
        Step("failure_modes", 4, q[:4], t, dies=[q[3]]),
        Step("replace", 4, [q[0], q[1], q[2], q[4], q[5]], t, ranks=[0, 1, 2, 3, 101], dies=[q[1]]),
        Step("extend_join", 4, [q[0], q[2], q[4], q[5]], t),
        Step(
            "replace_after_destroy",
            3,
            [q[0], q[2], q[4], q[5]],
            t,
            ranks=[0, 1, 2, 102],
            dies=[q[4]],
        ),
        Step("sigstop", 3, [q[0], q[2], q[6]], t, FAULT_ENV, freezes=[q[6]]),
        Step("coordinator_lost", 3, [q[0], q[2], q[5]], t, dies=[q[0]]),
    ]


ELASTIC: list[Step] = [
    s
    for pair in zip(
        _elastic_lane("auto", list(range(7))), _elastic_lane("tcp", list(range(7, 14))), strict=True
    )
    for s in pair
]


# Real training and failure semantics: two lanes of seven processes, one per
# transport. A step's victim (``dies``) is never reused; ``101`` is the
# process that replaces rank 1.
def _semantics_lane(t: str, p: list[int]) -> list[Step]:
    return [
        Step("reinit_env", 4, p[:4], t),
        Step("reinit_env", 2, p[4:6], t),
        Step("training_losses", 4, p[:4], t),
        Step("training_losses", 2, p[4:6], t),
        Step("p2p_dead_peer", 3, p[:3], t, dies=[p[1]]),
        Step("send_to_departed", 3, [p[0], p[2], p[3], p[4]], t, ranks=[0, 1, 2, 101], dies=[p[2]]),
        Step(
            "gather_scatter_top_exit",
            4,
            [p[0], p[3], p[5], p[4], p[6]],
            t,
            ranks=[0, 1, 2, 3, 103],
            dies=[p[4]],
        ),
        Step(
            "gather_scatter_recover",
            3,
            [p[0], p[3], p[5], p[6]],
            t,
            ranks=[0, 1, 2, 101],
            dies=[p[3]],
        ),
    ]


SEMANTICS: list[Step] = [
    s
    for pair in zip(
        _semantics_lane("auto", list(range(7))),
        _semantics_lane("tcp", list(range(7, 14))),
        strict=True,
    )
    for s in pair
]

LAUNCHES = {
    "main": (MAIN, 8),
    "faults": (FAULTS, 16),
    "elastic": (ELASTIC, 14),
    "semantics": (SEMANTICS, 14),
}


@functools.cache
def _launch(name: str) -> LaunchResult:
    steps, nprocs = LAUNCHES[name]
    return run_launch(steps, nprocs, timeout=480)


def _params(name: str) -> list[object]:
    steps, _ = LAUNCHES[name]
    return [pytest.param(name, s.id, id=s.id) for s in steps]


@pytest.mark.parametrize(
    ("launch", "step"),
    _params("main") + _params("faults") + _params("elastic") + _params("semantics"),
)
def test_scenario(launch: str, step: str) -> None:
    _launch(launch).check(step)


def test_import_registers_both_backends() -> None:
    import importlib

    import mooncake.pg

    assert "mooncake-cpu" in dist.Backend.backend_list
    assert "mooncake" in dist.Backend.backend_list
    caps = dist.Backend.backend_capability
    assert "cpu" in caps["mooncake-cpu"]
    assert "cuda" in caps["mooncake"]
    importlib.reload(mooncake.pg)  # re-registering is harmless


def test_fault_rules_parse_and_inert_without_rules() -> None:
    """G1: rules parse (bad ones raise, adding nothing); with none the hook is inert."""
    from mooncake.pg import _testing

    _testing.clear_faults()
    assert _testing.fault_stats() == {}
    rules = "exit@group=0,seq=3,point=mid_send,code=7;freeze@seq=2;delay@slot=1,ms=5"
    _testing.inject_fault(rules)
    assert _testing.fault_stats() == dict.fromkeys(rules.split(";"), 0)
    for bad in ("explode", "exit@point=sideways", "delay@slot=1", "exit@seq=x;freeze"):
        with pytest.raises(ValueError):
            _testing.inject_fault(bad)
    assert len(_testing.fault_stats()) == 3
    _testing.clear_faults()
    assert _testing.fault_stats() == {}


def test_bench_smoke() -> None:
    """G2: the benchmark runs both backends in one invocation with ``#wrong = 0``."""
    out = subprocess.run(
        [
            sys.executable,
            *BENCH_ARGS.split(),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "speedup" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 9
    for row in rows:
        cols = [c.split() for c in row.split("|")]
        assert cols[1][-1] == "0" and cols[2][-1] == "0", row  # #wrong per backend


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device: the `mooncake` backend on GPU tensors is tested only on a GPU machine",
)
def test_cuda_backend() -> None:
    res = run_launch([Step("cuda_collectives", 2, [0, 1])], 2)
    res.check("cuda_collectives-w2-auto")


def test_codes_come_from_the_core() -> None:
    """The dtype/op code table is the Rust core's (no hand copy to drift)."""
    from mooncake import _native
    from mooncake.pg import _codes

    dtypes = dict(_native.pg_dtype_codes())
    assert len(set(dtypes.values())) == len(dtypes) == 14
    for name, code in dtypes.items():
        if name == "raw":
            assert code == _codes.RAW
        elif hasattr(torch, name):
            assert _codes.dtype_code(getattr(torch, name)) == code, name
    for name in ("float32", "bfloat16", "int64", "bool"):
        assert name in dtypes
    assert _codes.dtype_code(torch.complex64) == _codes.RAW
    ops = dict(_native.pg_reduce_op_codes())
    assert set(ops) == {"SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"}
    for name, code in ops.items():
        assert _codes.op_code(getattr(dist.ReduceOp, name)) == code
    with pytest.raises(ValueError):
        _codes.op_code("not an op")


def _run(
    args: list[str], timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_script(args, timeout, {"OMP_NUM_THREADS": "1", **(env or {})})


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_elastic_serving_example(transport: str) -> None:
    """examples/elastic_serving.py: a rank is SIGKILLed, the survivors keep
    serving, a replacement joins and the loop is back to four ranks."""
    out = _run(
        ["examples/elastic_serving.py", "--steps", "3", "--kill-at", "3"],
        env={"MOONCAKE_PG_TRANSPORT": transport},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "SIGKILL" in text and "lost rank(s) [2]" in text, text
    assert "join_group returned, epoch 2" in text, text
    assert "activate_ranks([2]) -> Applied, epoch 2" in text, text
    assert "served by 4 ranks" in text.split("join_group returned")[1], text
    assert "back to 4 ranks" in text, text


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_elastic_bench_smoke(transport: str) -> None:
    """python -m mooncake.pg.elastic_bench prints kill-to-continue and join
    latency rows with figures for every trial."""
    out = _run(
        [
            "-m",
            "mooncake.pg.elastic_bench",
            "--trials",
            "2",
            "--skip-collectives",
            "--transport",
            transport,
        ]
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {line.split("|")[1].strip(): line for line in out.stdout.splitlines() if "|" in line}
    kill = next(v for k, v in rows.items() if k.startswith("kill-to-continue"))
    join = next(v for k, v in rows.items() if k.startswith("join latency"))
    assert kill.rstrip(" |").endswith("2"), kill
    assert join.rstrip(" |").endswith("1"), join
