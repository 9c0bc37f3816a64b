"""Entry point of one rank process: ``pg_worker.py SCENARIO RANK WORLD PORT``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pg_scenarios
import torch


def main() -> None:
    name, rank, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    getattr(pg_scenarios, name)(rank, world, port)
    print(f"rank {rank}: {name} ok", flush=True)


if __name__ == "__main__":
    main()
