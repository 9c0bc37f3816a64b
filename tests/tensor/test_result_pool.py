"""Large read results live in pooled memory (client `result_pool`): a tensor of
at least 4 MiB is built over a block that returns to a bounded pool when the
tensor is freed (``MC_TENSOR_RESULT_POOL`` bytes of idle blocks, default an
eighth of physical memory, ``0`` turns it off). These tests pin what a user can observe: results are
correct, private to each call, outlive the store and the key, and a reused
block never shows an earlier result's bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")

MiB = 1 << 20
ROWS = 8 * MiB // (4 * 1024)  # an 8 MiB float32 [ROWS, 1024] tensor


def big(seed: int) -> Any:
    return torch.arange(ROWS * 1024, dtype=torch.float32).reshape(ROWS, 1024) + seed


def full_target() -> Any:
    from mooncake.store import ParallelAxis, ReadTarget, TensorParallelism

    a = ParallelAxis()
    a.kind, a.rank, a.size, a.split_dim = "tp", 0, 2, 0
    p = TensorParallelism()
    p.axes = [a]
    t = ReadTarget()
    t.mode = "full"
    t.parallelism = p
    return t


def test_large_results_are_private_and_outlive_key_and_store(store_factory, key):
    s = store_factory(global_segment_size=256 * MiB, local_buffer_size=64 * MiB)
    src = big(0)
    assert s.put_tensor(key("a"), src) == 0
    assert s.put_tensor_with_tp(key("tp"), src, 0, 2, 0) == 0
    a = s.get_tensor(key("a"))
    b = s.get_tensor(key("a"))
    c = s.get_tensor_with_parallelism(key("tp"), full_target())
    for t in (a, b, c):
        assert t.dtype == torch.float32 and t.shape == src.shape and t.is_contiguous()
        assert torch.equal(t, src)
    assert len({a.data_ptr(), b.data_ptr(), c.data_ptr()}) == 3
    # Writing one result changes neither the others nor the stored object.
    a.fill_(-1.0)
    assert torch.equal(b, src) and torch.equal(c, src)
    assert torch.equal(s.get_tensor(key("a")), src)
    # Views and numpy arrays share the result's memory and keep it alive.
    view = b[1:3]
    arr = c.numpy()
    del b, c
    assert s.remove(key("a"), True) == 0
    s.close()
    assert torch.equal(view, src[1:3])
    assert (arr == src.numpy()).all()
    assert float(a.sum()) == -float(a.numel())


def test_a_reused_block_holds_only_the_new_result(store_factory, key):
    s = store_factory(global_segment_size=256 * MiB, local_buffer_size=64 * MiB)
    first, second = big(1), big(1000)
    assert s.put_tensor(key("first"), first) == 0
    assert s.put_tensor(key("second"), second) == 0
    t = s.get_tensor(key("first"))
    assert torch.equal(t, first)
    ptr = t.data_ptr()
    del t
    # The freed block is handed out again for the next result of its size.
    u = s.get_tensor(key("second"))
    assert u.data_ptr() == ptr
    assert torch.equal(u, second)
    # A block freed while another result is in use is not shared with it.
    v = s.get_tensor(key("first"))
    assert v.data_ptr() != u.data_ptr()
    assert torch.equal(v, first) and torch.equal(u, second)


@pytest.mark.parametrize(("value", "pooled"), [("0", False), ("bogus", True), ("64MiB", True)])
def test_pool_size_setting(shared_master, value, pooled):
    """``0`` turns the pool off (results are ordinary, resizable torch tensors);
    a value that is not a size falls back to the default; results are right
    either way."""
    code = (
        "import sys, torch\n"
        "from mooncake.store import MooncakeDistributedStore\n"
        f"k = 'pool-setting-{value}'\n"
        "s = MooncakeDistributedStore()\n"
        f"assert s.setup('127.0.0.1', {shared_master.metadata_url!r}, {64 * MiB}, {16 * MiB},"
        f" 'tcp', '', {shared_master.rpc_addr!r}) == 0\n"
        f"src = torch.arange({ROWS * 1024}, dtype=torch.float32).reshape({ROWS}, 1024)\n"
        "assert s.put_tensor(k, src) == 0\n"
        "t = s.get_tensor(k)\n"
        "assert torch.equal(t, src)\n"
        "print(t.untyped_storage().resizable())\n"
        "s.remove(k, True)\n"
        "s.close()\n"
    )
    env = dict(os.environ, MC_TENSOR_RESULT_POOL=value)
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == str(not pooled)
