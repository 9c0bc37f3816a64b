"""A client process that stores one tensor as a TP shard set and keeps serving it.

usage: tensor_writer.py METADATA_URL MASTER_ADDR KEY ROWS COLS TP
Writes ``torch.arange(ROWS*COLS, dtype=float32).reshape(ROWS, COLS)`` as
``TP`` shards along dim 0 (``put_tensor_with_parallelism`` with
``[TP(r, TP, 0)]``, each rank's shard) into its own segment, prints one JSON
line ``{"rc": [codes], "hostname": ...}``, then keeps its segment mounted
until stdin closes.
"""

from __future__ import annotations

import json
import sys

import torch
from mooncake.store import TP, MooncakeDistributedStore, TensorParallelism


def main() -> int:
    meta, master, key = sys.argv[1], sys.argv[2], sys.argv[3]
    rows, cols, tp = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", meta, rows * cols * 4 + (64 << 20), 16 << 20, "tcp", "", master)
    if rc != 0:
        print(json.dumps({"setup": rc}), flush=True)
        return 1
    full = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)
    step = rows // tp
    codes = [
        s.put_tensor_with_parallelism(
            key, full[r * step : (r + 1) * step], TensorParallelism([TP(r, tp, 0)])
        )
        for r in range(tp)
    ]
    print(json.dumps({"rc": codes, "hostname": s.get_hostname()}), flush=True)
    sys.stdin.read()
    s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
