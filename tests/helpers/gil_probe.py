"""Count how often the main thread runs while another thread is inside ``get_into``.

usage: gil_probe.py METADATA_URL MASTER_ADDR KEY SIZE SEED TRIALS
Prints one JSON line: {"n": [...], "match": bool, "inside": [...], "max_gap_ms": [...]}.

The interpreter's switch interval is raised to 100 s, so a thread holding
the GIL is never asked to drop it: the main thread (which yields the GIL at
every ``time.sleep(0)``) can take a stamp between the reader's entry into
``get_into`` and its return only if ``get_into`` releases the GIL itself.
``inside`` counts those stamps per trial (0 when the GIL is held throughout).
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time

import numpy as np
from common import pattern_array
from mooncake.store import MooncakeDistributedStore


def main() -> int:
    meta, master, key = sys.argv[1], sys.argv[2], sys.argv[3]
    size, seed, trials = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", meta, 0, 16 << 20, "tcp", "", master)
    if rc != 0:
        print(json.dumps({"setup": rc}), flush=True)
        return 1
    dst = np.zeros(size, np.uint8)
    dst[:] = 1  # fault the pages in before timing
    results: list[int] = []
    gaps: list[float] = []
    inside: list[int] = []
    for _ in range(trials):
        done = threading.Event()

        span: list[float] = []

        def reader(done: threading.Event = done, span: list[float] = span) -> None:
            span.append(time.perf_counter())
            results.append(s.get_into(key, int(dst.ctypes.data), size))
            span.append(time.perf_counter())
            done.set()

        stamps: list[float] = []
        old = sys.getswitchinterval()
        sys.setswitchinterval(100.0)
        try:
            t = threading.Thread(target=reader)
            t.start()
            while not done.is_set():
                stamps.append(time.perf_counter())
                time.sleep(0)  # yields the GIL
            t.join()
        finally:
            sys.setswitchinterval(old)
        inside.append(sum(1 for x in stamps if span[0] < x < span[1]))
        gap = max((b - a for a, b in itertools.pairwise(stamps)), default=0.0)
        gaps.append(gap * 1000.0)
        time.sleep(0.6)  # let the read lease lapse between trials
    match = bool(np.array_equal(dst, pattern_array(size, seed)))
    print(
        json.dumps({"n": results, "match": match, "inside": inside, "max_gap_ms": gaps}), flush=True
    )
    s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
