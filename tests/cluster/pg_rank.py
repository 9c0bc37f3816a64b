"""One rank of a ``mooncake-cpu`` process group, run inside a simulated host by
the multi-host suite: ``python pg_rank.py RANK WORLD INIT_METHOD [THREADS]``.

It joins the group through ``init_method`` alone (no ``MASTER_ADDR``), runs an
``all_reduce`` of 4 MiB, prints one JSON line with the result, then keeps the
group (and its connections) open until its stdin closes. It runs one torch
thread, or with ``THREADS`` = ``default`` one per CPU it may use (torch's
default), and then also reports its threads after joining.
"""

from __future__ import annotations

import json
import os
import sys

import mooncake.pg  # noqa: F401  (registers the backend)
import torch
import torch.distributed as dist


def main() -> None:
    rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    os.environ.pop("MASTER_ADDR", None)
    default_threads = sys.argv[4:5] == ["default"]
    torch.set_num_threads(len(os.sched_getaffinity(0)) if default_threads else 1)
    dist.init_process_group("mooncake-cpu", init_method=init, rank=rank, world_size=world)
    t = torch.full((1 << 20,), float(rank + 1))
    dist.all_reduce(t)
    out: dict[str, object] = {"sum": float(t[0]), "all_equal": bool(torch.all(t == t[0]))}
    if default_threads:
        out["threads"] = torch.get_num_threads()
    print(json.dumps(out), flush=True)
    sys.stdin.read()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
