"""The GIL is released during network transfers."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from conftest import HELPERS, Child, Master, run_script

MiB = 1 << 20
SIZE = 256 * MiB


@pytest.mark.slow
def test_gil_released_during_tcp_get_into(
    master: Master, child_factory: Callable[..., Child]
) -> None:
    writer = child_factory()
    assert writer.setup(master, global_segment_size=SIZE + 64 * MiB) == 0
    assert writer.call("put_pattern", key="big", size=SIZE, seed=11, timeout=120) == 0
    # The reader is a pure client in another process with same-host mapping off,
    # so the bytes travel over TCP.
    r = run_script(
        [
            str(HELPERS / "gil_probe.py"),
            master.metadata_url,
            master.rpc_addr,
            "big",
            str(SIZE),
            "11",
            "2",
        ],
        timeout=180,
        env={"MC_STORE_SAME_HOST": "off"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["n"] == [SIZE, SIZE]
    assert out["match"] is True
    # The main thread ran while the reader was inside get_into: the call
    # released the GIL (with it held, no stamp can fall inside the call; see
    # gil_probe.py). Any one trial suffices: a busy 2-core machine may keep
    # the main thread off the CPU for a whole call, a held GIL blocks every trial.
    assert max(out["inside"]) >= 1, out
