"""Stress loop for the PG backend's group setup and teardown races.

Runs one launch of 8 worker processes (``tests/pg/pg_harness``) that repeat
the MAIN launch's first three steps (``collectives``, ``p2p``, ``subgroups``,
world 4) ``K`` times over shared memory and ``K`` times over TCP, then prints
how many steps failed. A failing launch's full output is written to
``--report``. Not part of CI (about 2-5 minutes per 40 iterations here);
it found the shared-memory double-offer race and the mask write after
shutdown, both fixed since.

    MC_LOG_LEVEL=info python scripts/pg_stress.py 40
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "pg"))
from pg_harness import Step, run_launch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("iterations", type=int, nargs="?", default=40)
    ap.add_argument("--report", default="pg_stress_failure.log")
    args = ap.parse_args()
    steps = [
        Step(sc, 4, procs, transport=t, label=f"{sc}-{t}-{k}")
        for k in range(args.iterations)
        for sc in ("collectives", "p2p", "subgroups")
        for t, procs in (("auto", [0, 1, 2, 3]), ("tcp", [4, 5, 6, 7]))
    ]
    t0 = time.perf_counter()
    r = run_launch(steps, 8, timeout=60.0 * args.iterations)
    bad = [k for k, ok in r.ok.items() if not ok]
    print(
        f"iterations={args.iterations} seconds={time.perf_counter() - t0:.0f} "
        f"failed_steps={len(bad)} first={bad[:3]}"
    )
    if bad:
        Path(args.report).write_text(r.report)
        print(f"full output: {args.report}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
