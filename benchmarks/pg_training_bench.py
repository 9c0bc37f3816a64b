#!/usr/bin/env python3
"""Real training on the PG backends: gloo vs ``mooncake-cpu`` in one run.

    python benchmarks/pg_training_bench.py                 # every workload, setting, world 2 and 4
    python benchmarks/pg_training_bench.py --workloads fsdp2-mlp --settings busy --worlds 2
    python benchmarks/pg_training_bench.py --json out.json

Each cell trains the same model from the same seed for ``--steps`` steps on
every listed backend, one after the other, with ``world`` fresh rank
processes per run. Workloads are ``MODE-MODEL``:

- models: ``mlp``, an MLP 256 -> 1024 -> 1024 -> LayerNorm -> 256 with GELU
  (``--extra-layers`` adds 1024 -> 1024 blocks), batch 64 per rank; and
  ``transformer``, a 3-layer ``nn.TransformerEncoder`` (d_model 256, 4
  heads, feed-forward 768), 8 sequences of 64 tokens per rank; AdamW, MSE
  against a fixed random target;
- ``ddp``: ``DistributedDataParallel`` (gradient buckets all-reduced while
  backward runs, completed through ``Work.get_future()``);
- ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` on every ``Linear`` (or
  encoder layer), then on the whole model (parameters all-gathered per
  layer, gradients reduce-scattered).

CPU settings (``--settings``): ``one`` (one torch thread per rank, as
torchrun starts ranks), ``default`` (nothing set: torch's one thread per CPU
in every rank, as ``torch.multiprocessing.spawn`` leaves it) and ``busy``
(one thread per rank and one busy process per CPU beside the job).

Per cell and backend it prints the p50 of the per-step wall time (a step's
time is the slowest rank's: forward, backward, optimizer step) and the CPU
seconds per step (user + system of all rank processes, every thread,
over the timed steps). The ratio columns are mooncake-cpu / gloo: the target
is step time <= 1.0x in every cell. ``losses`` compares every
rank's loss at every step with gloo's: ``bitwise`` or the largest relative
difference.

The backends run alternately ``--repeats`` times (default 1) and each cell
reports the median run, so a burst of load from other work on the machine
hits both sides alike.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_json

HERE = Path(__file__).resolve()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ worker
def build_model(
    extra_layers: int, features: int = 256, hidden: int = 1024, model: str = "mlp"
) -> Any:
    from torch import nn

    if model == "transformer":
        layer = nn.TransformerEncoderLayer(
            d_model=features, nhead=4, dim_feedforward=768, dropout=0.0, batch_first=True
        )
        # Every input is dense: no nested-tensor fast path, on any torch version.
        return nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False)
    if model != "mlp":
        raise ValueError(f"unknown model {model!r}")

    layers: list[nn.Module] = [
        nn.Linear(features, hidden),
        nn.GELU(),
        nn.Linear(hidden, hidden),
        nn.GELU(),
    ]
    for _ in range(extra_layers):
        layers += [nn.Linear(hidden, hidden), nn.GELU()]
    layers += [nn.LayerNorm(hidden), nn.Linear(hidden, features)]
    return nn.Sequential(*layers)


def train(
    mode: str,
    rank: int,
    world: int,
    steps: int,
    extra_layers: int = 0,
    batch: int = 64,
    features: int = 256,
    hidden: int = 1024,
    model_name: str = "mlp",
) -> dict[str, Any]:
    """Trains in an initialised process group; returns per-step times, CPU
    seconds over the steps and the losses. Shared with the loss-equality
    tests (``tests/pg``), which run it at small sizes."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = build_model(extra_layers, features, hidden, model_name)
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
    elif mode == "fsdp2":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:  # torch < 2.6 keeps it under _composable
            from torch.distributed._composable.fsdp import fully_shard  # type: ignore[no-redef]

        # Each Linear of the MLP, each encoder layer of the transformer.
        units = model.layers if model_name == "transformer" else model
        for m in units:
            if isinstance(m, (torch.nn.Linear, torch.nn.TransformerEncoderLayer)):
                fully_shard(m)
        fully_shard(model)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1000 + rank)
    # The transformer reads batch/8 sequences of 64 tokens (as many tokens
    # as the MLP's batch rows times 8).
    shape = (batch // 8, 64, features) if model_name == "transformer" else (batch, features)
    xs = [torch.randn(*shape, generator=gen) for _ in range(4)]
    ys = [torch.randn(*shape, generator=gen) for _ in range(4)]
    dist.barrier()
    times, losses = [], []
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for i in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(xs[i % 4]), ys[i % 4])
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    dist.barrier()
    return {"times": times, "cpu": cpu, "losses": losses}


def worker(args: argparse.Namespace) -> None:
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    import torch.distributed as dist

    if args.backend.startswith("mooncake"):
        import mooncake.pg  # noqa: F401 - registers the backends

    dist.init_process_group(
        args.backend,
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=args.rank,
        world_size=args.world,
    )
    res = train(
        args.mode, args.rank, args.world, args.steps, args.extra_layers, model_name=args.model
    )
    dist.destroy_process_group()
    print("@@RESULT " + json.dumps(res), flush=True)


# ------------------------------------------------------------------ driver
SETTINGS = {
    "one": "one torch thread per rank",
    "default": "torch's default threads (one per CPU in every rank, as mp.spawn leaves them)",
    "busy": "one torch thread per rank, one busy process per CPU beside the job",
}


def busy_loop() -> None:
    """A process that wants a whole core, as another job on the host does."""
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def run_cell(
    backend: str, mode: str, world: int, model: str, setting: str, args: argparse.Namespace
) -> dict[str, Any]:
    port = free_port()
    threads = 0 if setting == "default" else 1
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # "default" means nothing set, so neither variable the ranks read.
    env.pop("OMP_NUM_THREADS", None)
    env.pop("MKL_NUM_THREADS", None)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if args.transport:
        env["MOONCAKE_PG_TRANSPORT"] = args.transport
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE),
                "--worker",
                f"--backend={backend}",
                f"--mode={mode}",
                f"--world={world}",
                f"--rank={r}",
                f"--port={port}",
                f"--steps={args.steps}",
                f"--extra-layers={args.extra_layers}",
                f"--threads={threads}",
                f"--model={model}",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    hogs = []
    if setting == "busy":
        hogs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    (
                        f"import sys; sys.path.insert(0, {str(HERE.parent)!r}); "
                        "from pg_training_bench import busy_loop; busy_loop()"
                    ),
                ],
                stdin=subprocess.DEVNULL,
            )
            for _ in range(os.cpu_count() or 1)
        ]
    try:
        return collect(backend, mode, world, procs, args)
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def collect(
    backend: str,
    mode: str,
    world: int,
    procs: list[subprocess.Popen[str]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    results = []
    for r, p in enumerate(procs):
        out, _ = p.communicate(timeout=args.timeout)
        line = next((x for x in out.splitlines() if x.startswith("@@RESULT ")), None)
        if p.returncode != 0 or line is None:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            raise RuntimeError(f"{backend} {mode} world {world} rank {r} failed:\n{out}")
        results.append(json.loads(line[len("@@RESULT ") :]))
    steps = [max(res["times"][i] for res in results) for i in range(args.steps)]
    return {
        "p50_ms": statistics.median(steps) * 1e3,
        "cpu_per_step": sum(res["cpu"] for res in results) / args.steps,
        "losses": [res["losses"] for res in results],
    }


def compare_losses(a: list[list[float]], b: list[list[float]]) -> str:
    worst = 0.0
    for la, lb in zip(a, b, strict=True):
        for x, y in zip(la, lb, strict=True):
            if x != y:
                worst = max(worst, abs(x - y) / max(abs(x), abs(y), 1e-30))
    return "bitwise" if worst == 0.0 else f"rel {worst:.1e}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="gloo", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="ddp", help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--backends", default="gloo,mooncake-cpu")
    ap.add_argument(
        "--workloads",
        default="ddp-mlp,fsdp2-mlp,fsdp2-transformer",
        help="MODE-MODEL: MODE ddp or fsdp2, MODEL mlp or transformer",
    )
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--extra-layers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
    ap.add_argument(
        "--settings",
        default="one,default,busy",
        help="; ".join(f"{k}: {v}" for k, v in SETTINGS.items()),
    )
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--transport", default="", help="MOONCAKE_PG_TRANSPORT for mooncake-cpu")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    backends = args.backends.split(",")
    import torch

    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}; {args.steps} steps, batch 64"
    )
    cells: list[dict[str, Any]] = []
    for setting in args.settings.split(","):
        if setting not in SETTINGS:
            raise SystemExit(f"unknown setting {setting!r} (known: {', '.join(SETTINGS)})")
        for workload in args.workloads.split(","):
            mode, _, model = workload.partition("-")
            for world in (int(w) for w in args.worlds.split(",")):
                runs: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
                for _ in range(args.repeats):
                    for b in backends:
                        runs[b].append(run_cell(b, mode, world, model or "mlp", setting, args))
                cell: dict[str, Any] = {
                    "setting": setting,
                    "mode": mode,
                    "model": model or "mlp",
                    "world": world,
                }
                for b in backends:
                    rs = sorted(runs[b], key=lambda r: r["p50_ms"])
                    cell[b] = rs[len(rs) // 2]
                cells.append(cell)
                print(
                    f"  [{setting}] {workload} world {world}: "
                    + ", ".join(
                        f"{b} {cell[b]['p50_ms']:.1f} ms {cell[b]['cpu_per_step'] * 1e3:.0f} ms-cpu"
                        for b in backends
                    ),
                    flush=True,
                )
    ref = backends[0]
    head = "| setting | workload | " + " | ".join(
        f"{b} step p50 (ms) | {b} CPU s/step" for b in backends
    )
    others = backends[1:]
    head += "".join(f" | {b} / {ref} step | {b} / {ref} CPU | losses" for b in others) + " |"
    print()
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    names = {"mlp": "MLP", "transformer": "TransformerEncoder"}
    for c in cells:
        row = f"| {c['setting']} | {'FSDP2' if c['mode'] == 'fsdp2' else 'DDP'} {names[c['model']]}"
        row += f", world {c['world']} | "
        row += " | ".join(f"{c[b]['p50_ms']:.1f} | {c[b]['cpu_per_step']:.3f}" for b in backends)
        for b in others:
            row += (
                f" | {c[b]['p50_ms'] / c[ref]['p50_ms']:.2f}x"
                f" | {c[b]['cpu_per_step'] / c[ref]['cpu_per_step']:.2f}x"
                f" | {compare_losses(c[ref]['losses'], c[b]['losses'])}"
            )
        print(row + " |")
    write_json(args.json, cells)


if __name__ == "__main__":
    main()
