"""Capture objects written by upstream Mooncake 0.3.13's tensor methods as golden bytes.

Run with the upstream venv (``bash benchmarks/upstream_env.sh``)::

    /work/venv-upstream/bin/python benchmarks/upstream_tensor_golden.py \
        crates/tensor/tests/data/upstream_golden.json

The upstream wheel imports torch lazily; when its venv has no torch, the
torch of this repository's ``.venv`` is appended to ``sys.path`` (after the
upstream packages, so upstream's ``mooncake`` still wins). The output maps
every stored key to its raw bytes (hex), plus a few read results; the Rust
test ``crates/tensor/tests/upstream_golden.rs`` checks that our write planner
produces the same keys and bytes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import types
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A project venv of this Python version to borrow torch from, when this
# venv has none (benchmarks/upstream_env.sh installs torch itself).
_PY = f"python{sys.version_info[0]}.{sys.version_info[1]}"
TORCH_SITE = os.environ.get(
    "MOONCAKE_TORCH_SITE",
    next(
        (
            p
            for v in (".venv", ".venv-py310")
            for p in [os.path.join(ROOT, v, "lib", _PY, "site-packages")]
            if os.path.isdir(p)
        ),
        "",
    ),
)


def _import_torch():
    try:
        import torch
    except ImportError:
        sys.path.append(TORCH_SITE)
        import torch
    return torch


torch = _import_torch()
import mooncake
import mooncake.store as ms


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ax(kind, rank, size, split_dim=None, expert_id=None, stage_id=None):
    a = ms.ParallelAxis()
    a.kind, a.rank, a.size = kind, rank, size
    if split_dim is not None:
        a.split_dim = split_dim
    if expert_id is not None:
        a.expert_id = expert_id
    if stage_id is not None:
        a.stage_id = stage_id
    return a


def par(*axes):
    p = ms.TensorParallelism()
    p.axes = list(axes)
    return p


def main(out_path: str) -> None:
    master_bin = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")
    rpc, http, metrics = free_port(), free_port(), free_port()
    master = subprocess.Popen(
        [
            master_bin,
            f"--rpc_port={rpc}",
            "--enable_http_metadata_server=true",
            f"--http_metadata_server_port={http}",
            f"--metrics_port={metrics}",
            "--rpc_address=127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(2)
        s = ms.MooncakeDistributedStore()
        rc = s.setup(
            "127.0.0.1",
            f"http://127.0.0.1:{http}/metadata",
            256 << 20,
            128 << 20,
            "tcp",
            "",
            f"127.0.0.1:{rpc}",
        )
        assert rc == 0, rc
        full = torch.arange(24, dtype=torch.float32).reshape(4, 6)
        res = {}
        res["T"] = s.put_tensor("T", torch.arange(12, dtype=torch.float32).reshape(3, 4))
        res["Z"] = s.put_tensor("Z", torch.tensor(3.5))
        res["BF"] = s.put_tensor("BF", torch.arange(6, dtype=torch.bfloat16).reshape(2, 3))
        res["BOOL"] = s.put_tensor("BOOL", torch.tensor([True, False, True]))
        f8 = torch.arange(6, dtype=torch.float32).reshape(2, 3).to(torch.float8_e4m3fn)
        res["F8"] = s.put_tensor("F8", f8)
        u16 = torch.arange(6, dtype=torch.int32).to(torch.uint16)
        res["U16"] = s.put_tensor("U16", u16)
        res["A1"] = s.put_tensor_with_parallelism("A", full[2:4], par(ax("tp", 1, 2, 0)))
        res["A0"] = s.put_tensor_with_parallelism("A", full[0:2], par(ax("tp", 0, 2, 0)))
        res["B"] = s.put_tensor_with_parallelism("B", full, par(ax("tp", 1, 3, 1), ax("dp", 1, 2)))
        res["C"] = s.put_tensor_with_parallelism("C", full, par(ax("ep", 1, 2, expert_id=7)))
        pp_dp = par(ax("pp", 0, 4, stage_id=2), ax("dp", 1, 2))
        res["D"] = s.put_tensor_with_parallelism("D", full, pp_dp)
        wp = types.SimpleNamespace(rank=1, size=2, split_dim=1)
        res["W"] = s.put_tensor_with_parallelism("W", full, writer_partition=wp)
        res["G"] = s.put_tensor_with_tp("G", full, 1, 3, 1)
        res["H"] = s.put_tensor_with_tp("H", full)
        hdr, _ptr, n, _owner = ms._serialize_tensor(full)
        buf = torch.empty(304 + n, dtype=torch.uint8)
        buf[:304] = torch.frombuffer(bytearray(hdr), dtype=torch.uint8)
        buf[304:] = full.view(-1).view(torch.uint8)
        tp_par = par(ax("tp", 1, 2, 0))
        res["X"] = s.put_tensor_with_parallelism_from("X", buf.data_ptr(), buf.numel(), tp_par)
        dp_tp = par(ax("dp", 0, 2), ax("tp", 1, 2, 1))
        res["K2"] = s.put_tensor_with_parallelism("K2", full, dp_tp)
        url = f"http://127.0.0.1:{metrics}/get_all_keys"
        keys = urllib.request.urlopen(url).read().decode().split()
        objects = {k: s.get(k).hex() for k in sorted(keys)}

        def desc(t):
            if t is None:
                return None
            return {"shape": list(t.shape), "values": t.float().flatten().tolist()}

        res["get_Z"] = desc(s.get_tensor("Z"))
        res["tp_G_0_2"] = desc(s.get_tensor_with_tp("G", 0, 2))
        res["tp_A_1_2"] = desc(s.get_tensor_with_tp("A", 1, 2))
        with open(out_path, "w") as f:
            json.dump({"results": res, "objects": objects}, f, indent=1, sort_keys=True)
        s.close()
        print(f"wrote {len(objects)} objects to {out_path}")
    finally:
        master.terminate()
        master.wait()


if __name__ == "__main__":
    main(sys.argv[1])
