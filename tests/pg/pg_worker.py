"""One process of a launch: ``pg_worker.py PROC HUB_PORT PLAN_JSON``.

The plan is a list of steps (see ``pg_harness.Step``); this process runs, in
plan order, every step it is a member of. Each step gets its own store port:
the step's rank 0 picks a free port just before use and publishes it on the
harness's hub store. Results are printed as ``@@STEP <id> ok <seconds>`` or
``@@STEP <id> FAIL`` followed by the traceback; the first failure ends the
process (its peers then fail or time out instead of hanging).
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mooncake.pg as mpg
import pg_elastic
import pg_scenarios
import pg_semantics
import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    proc, hub_port, plan = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    # The harness sends SIGUSR1 to a process it is about to kill: every
    # thread's Python stack goes to the report.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    hub = dist.TCPStore(
        "127.0.0.1", hub_port, is_master=False, timeout=datetime.timedelta(seconds=300)
    )
    base_env = dict(os.environ)
    for step in plan:
        if proc not in step["procs"]:
            continue
        sid = step["id"]
        rank = step["ranks"][step["procs"].index(proc)]
        if rank == 0:
            port = free_port()
            hub.set(f"port/{sid}", str(port))
        else:
            port = int(hub.get(f"port/{sid}"))
        os.environ.clear()
        os.environ.update(base_env)
        os.environ["MOONCAKE_PG_TRANSPORT"] = step["transport"]
        os.environ.update(step["env"])
        os.environ["MCPG_TEST_HUB_PORT"] = str(hub_port)
        os.environ["MCPG_TEST_STEP"] = sid
        t0 = time.monotonic()
        try:
            name = step["scenario"]
            scenario = next(
                getattr(m, name)
                for m in (pg_scenarios, pg_elastic, pg_semantics)
                if hasattr(m, name)
            )
            scenario(rank, step["world"], port)
        except BaseException:  # noqa: BLE001 - reported, then the process ends
            print(f"@@STEP {sid} FAIL", flush=True)
            traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        if dist.is_initialized():
            dist.destroy_process_group()
        # A failed init_process_group leaves torch's group counter advanced;
        # the next step must start from group id "0" like its peers.
        dist.distributed_c10d._world.group_count = 0
        # Process-wide settings a scenario may have changed.
        mpg.set_collective_timeout_us(0)
        mpg.set_p2p_timeout_us(0)
        mpg.set_fault_reconciliation_window_us(0)
        pg_scenarios.STEP_STORES.clear()
        print(f"@@STEP {sid} ok {time.monotonic() - t0:.1f}", flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
