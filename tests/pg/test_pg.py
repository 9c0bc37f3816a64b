"""Tests of the mooncake-cpu backend with real processes over TCP and shm."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from pg_harness import run_ranks

TRANSPORTS = ["auto", "tcp"]


def test_import_registers_both_backends() -> None:
    import mooncake.pg

    assert "mooncake-cpu" in dist.Backend.backend_list
    assert "mooncake" in dist.Backend.backend_list
    caps = dist.Backend.backend_capability
    assert "cpu" in caps["mooncake-cpu"]
    assert "cuda" in caps["mooncake"]
    import importlib

    importlib.reload(mooncake.pg)  # re-registering is harmless


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world", [1, 2, 4])
def test_collectives(world: int, transport: str) -> None:
    run_ranks("collectives", world, transport=transport, timeout=150)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_p2p(transport: str) -> None:
    run_ranks("p2p", 4, transport=transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_subgroups_and_small_topologies(transport: str) -> None:
    run_ranks("subgroups", 4, transport=transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_inference_topologies_world8(transport: str) -> None:
    run_ranks("topologies8", 8, transport=transport, timeout=150)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_destroy_and_reinit(transport: str) -> None:
    run_ranks("reinit", 2, transport=transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_device_id_init_and_batch_p2p(transport: str) -> None:
    run_ranks("device_id_init", 2, transport=transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bad_input(transport: str) -> None:
    run_ranks("bad_input", 2, transport=transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_crashed_peer_is_excluded(transport: str) -> None:
    run_ranks("crash_survivors", 4, transport=transport)


def test_peer_never_joins() -> None:
    run_ranks("never_joins", 2, ranks=[0], timeout=60)


def test_options_forms() -> None:
    run_ranks("options_forms", 2)


def test_bench_smoke() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mooncake.pg.bench",
            "--collective",
            "all_reduce",
            "--backends",
            "mooncake-cpu,gloo",
            "-g",
            "2",
            "-b",
            "8",
            "-e",
            "1M",
            "-f",
            "4",
            "-n",
            "5",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
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
    run_ranks("cuda_collectives", 2)
