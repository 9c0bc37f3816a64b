"""List-length mismatches in every batch form: each
fails every item (``-600`` per key for writes and ``batch_get_tensor_into``-style
reads, ``None`` per key for the unified reads), logs one ``mooncake.store``
record, and writes nothing."""

from __future__ import annotations

import pytest
from helpers.tensor_buffer import obj_buffer
from mooncake.store import TP, ReadTarget, ReplicateConfig, TensorParallelism

torch = pytest.importorskip("torch")


T = torch.ones(4, 6)
BUF = obj_buffer(T)
P, N = BUF.data_ptr(), BUF.numel()
CFG = ReplicateConfig()
PAR = TensorParallelism([TP(0, 2, 0)])

# method -> the arguments after the two keys (one list is one entry short or long)
WRITES = {
    "batch_put_tensor": lambda: ([T],),
    "batch_upsert_tensor": lambda: ([T],),
    "batch_pub_tensor": lambda: ([T], CFG),
    "batch_upsert_pub_tensor": lambda: ([T], CFG),
    "batch_put_tensor_with_tp": lambda: ([T], 0, 2, 0),
    "batch_pub_tensor_with_tp": lambda: ([T], CFG, 0, 2, 0),
    "batch_put_tensor_from": lambda: ([P, P], [N]),
    "batch_upsert_tensor_from": lambda: ([P], [N, N]),
    "batch_put_tensor_with_tp_from": lambda: ([P], [N, N], 0, 2, 0),
    "batch_put_tensor_with_parallelism": lambda: ([T],),
    "batch_upsert_tensor_with_parallelism": lambda: ([T, T], [PAR]),
    "batch_put_tensor_with_parallelism_from": lambda: ([P, P], [N]),
    "batch_upsert_tensor_with_parallelism_from": lambda: ([P, P], [N, N], [PAR]),
}


@pytest.mark.parametrize("method", sorted(WRITES))
def test_batch_write_length_mismatch(tstore, key, keys_of, logs, method):
    keys = [key("a"), key("b")]
    assert getattr(tstore, method)(keys, *WRITES[method]()) == [-600, -600]
    logs.expect(method, "INVALID_PARAMS")
    assert keys_of(keys[0]) == [] and keys_of(keys[1]) == []


def test_batch_read_length_mismatch(tstore, key, logs):
    keys = [key("a"), key("b")]
    out = torch.zeros(8192, dtype=torch.uint8)
    p = out.data_ptr()
    assert tstore.batch_get_tensor_into(keys, [p], [4096, 4096]) == [-600, -600]
    logs.expect("batch_get_tensor_into")
    assert tstore.batch_get_tensor_with_tp_into(keys, [p, p], [4096], 0, 2) == [-600, -600]
    logs.expect("batch_get_tensor_with_tp_into")
    res = tstore.batch_get_tensor_with_parallelism_into(keys, [p, p + 4096], [4096])
    assert res == [None, None]
    logs.expect("batch_get_tensor_with_parallelism_into")
    full = ReadTarget(mode="full")
    assert tstore.batch_get_tensor_with_parallelism(keys, [full]) == [None, None]
    logs.expect("batch_get_tensor_with_parallelism")
    res = tstore.batch_get_tensor_with_parallelism_into(keys, [p, p + 4096], [4096, 4096], [full])
    assert res == [None, None]
    logs.expect("batch_get_tensor_with_parallelism_into")
