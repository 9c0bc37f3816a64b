#!/usr/bin/env python3
"""Two builds of this project in one run: a benchmark's own figures for an
earlier build ("before") and the current one ("after"), in alternating rounds.

    python benchmarks/ab_build.py --save /tmp/before      # keep this build
    # ... change and rebuild ...
    python benchmarks/ab_build.py --before /tmp/before --rounds 3 -- \\
        benchmarks/te_bench.py --quick --only ours

``--save DIR`` copies the installed ``mooncake`` package (with its native
module, which also runs the master) to ``DIR/mooncake``. A run then starts
the benchmark command with this interpreter ``rounds`` times per build, the
order of the two builds swapped in every second round, "before" with
``PYTHONPATH=DIR`` (so every process the benchmark starts imports the saved
package) and "after" without. Each printed row of the benchmark's tables
(markdown rows or whitespace-separated columns) is identified by its leading
cells that are not numbers and measured by its first number; the table
printed here is the median of each row per build and after/before. A row
that changed by less than the spread between the rounds of one build is
noise.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


def cells(line: str) -> list[str]:
    """The cells of one table row: between ``|`` in a markdown row, else the
    whitespace-separated words."""
    s = line.strip()
    if s.startswith("|"):
        return [c.strip() for c in s.strip("|").split("|")]
    return s.split()


def row_figure(line: str) -> tuple[tuple[str, ...], float] | None:
    """``(key, value)`` of a table row: its leading non-numeric cells and the
    first number after them; ``None`` for anything else (headers, rules,
    prose)."""
    key: list[str] = []
    for c in cells(line):
        if c == "|":
            # A column separator inside a whitespace-separated row.
            continue
        if NUMBER.match(c):
            return (tuple(key), float(c)) if key else None
        if not c or set(c) <= set("-|: "):
            return None
        key.append(c)
    return None


def figures(text: str) -> dict[tuple[str, ...], float]:
    """Every row figure in a benchmark's output, its key led by the last
    ``## `` heading above it when there is one (a benchmark that prints one
    table per setting, e.g. per congestion control); a repeated key keeps
    its first figure."""
    out: dict[tuple[str, ...], float] = {}
    section: tuple[str, ...] = ()
    for line in text.splitlines():
        if line.startswith("## "):
            section = (line[3:].strip(),)
            continue
        if line.startswith("#"):
            # A comment (a ceiling, a timing note), not a row.
            continue
        got = row_figure(line)
        if got and section + got[0] not in out:
            out[section + got[0]] = got[1]
    return out


def run_once(cmd: list[str], before: Path | None) -> dict[tuple[str, ...], float]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if before is not None:
        env["PYTHONPATH"] = str(before)
    r = subprocess.run(
        [sys.executable, *cmd], env=env, stdout=subprocess.PIPE, text=True, check=False
    )
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}")
    return figures(r.stdout)


def save(dest: Path) -> int:
    import mooncake

    src = Path(mooncake.__file__).resolve().parent
    target = dest / "mooncake"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
    print(f"saved {src} as {target}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save", type=Path, help="copy the installed build to DIR and exit")
    ap.add_argument("--before", type=Path, help="DIR of a build saved with --save")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the benchmark and its options")
    args = ap.parse_args()
    if args.save:
        return save(args.save)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not args.before or not cmd:
        ap.error("--before DIR and a benchmark command are needed")
    if not (args.before / "mooncake").is_dir():
        ap.error(f"{args.before} holds no saved build (mooncake/)")
    runs: dict[str, list[dict[tuple[str, ...], float]]] = {"before": [], "after": []}
    for rnd in range(args.rounds):
        order = ["before", "after"] if rnd % 2 == 0 else ["after", "before"]
        for side in order:
            print(f"== round {rnd + 1}: {side}", file=sys.stderr, flush=True)
            runs[side].append(run_once(cmd, args.before if side == "before" else None))
    keys = [k for k in runs["after"][0] if all(k in r for rs in runs.values() for r in rs)]
    width = max((len(" ".join(k)) for k in keys), default=4)
    print(
        f"{'row':<{width}} | {'before':>10} {'spread':>7} | {'after':>10} {'spread':>7} | after/before"
    )
    for k in keys:
        cols = []
        for side in ("before", "after"):
            v = [r[k] for r in runs[side]]
            med = statistics.median(v)
            spread = (max(v) - min(v)) / med if med else 0.0
            cols.append((med, spread))
        (b, bs), (a, as_) = cols
        ratio = f"{a / b:.2f}" if b else "-"
        print(f"{' '.join(k):<{width}} | {b:10.3f} {bs:6.0%} | {a:10.3f} {as_:6.0%} | {ratio}")
    print(f"# {args.rounds} rounds per build, alternating; spread = (max - min) / median")
    return 0


if __name__ == "__main__":
    sys.exit(main())
