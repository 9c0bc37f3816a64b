"""Plain tensor API: put/get, batches, ``_from``/``_into``, upsert and pub forms,
and the pub check.

Every failing call is checked for its ``mooncake.store`` log record, and every
failed write for leaving nothing stored.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import rpcs
from helpers.tensor_dtypes import tensor_dtypes
from helpers.tensor_format import decode_header
from mooncake.store import ReplicateConfig, _deserialize_tensor, _serialize_tensor

torch = pytest.importorskip("torch")

DTYPES = tensor_dtypes()


def make(dtype: torch.dtype, shape: tuple[int, ...] = (2, 3)) -> torch.Tensor:
    n = int(np.prod(shape)) if shape else 1
    base = torch.arange(n, dtype=torch.int64).reshape(shape) % 7
    if dtype == torch.bool:
        return base % 2 == 1
    return base.to(torch.float32).to(dtype) if dtype.is_floating_point else base.to(dtype)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (works for dtypes without comparison kernels)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(
        torch.equal(
            a.contiguous().reshape(-1).view(torch.uint8),
            b.contiguous().reshape(-1).view(torch.uint8),
        )
    )


def test_put_tensor_stored_format(tstore, key, logs):
    k = key("T")
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert tstore.put_tensor(k, t) == 0
    raw = tstore.get(k)
    assert len(raw) == 352
    h = decode_header(raw)
    assert h["magic_bytes"] == b"NOOM"
    assert (h["version"], h["header_size"]) == (1, 304)
    assert (h["dtype"], h["ndim"], h["layout"], h["flags"]) == (0, 2, 0, 0)
    assert (h["data_offset"], h["data_bytes"]) == (304, 48)
    assert h["global"] == h["local"] == (3, 4, -1, -1, -1, -1, -1, -1)
    assert h["axis_count"] == 0 and h["unused_axes_zero"]
    assert raw[304:] == t.numpy().tobytes()
    logs.none()


def test_put_is_write_once_and_upsert_replaces(tstore, key):
    k = key("T")
    first = torch.ones(3, 4)
    assert tstore.put_tensor(k, first) == 0
    assert tstore.put_tensor(k, torch.zeros(5)) == 0
    assert torch.equal(tstore.get_tensor(k), first)
    assert tstore.upsert_tensor(k, torch.full((2, 2), 7.0)) == 0
    assert torch.equal(tstore.get_tensor(k), torch.full((2, 2), 7.0))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips(tstore, key, dtype):
    k = key("d")
    t = make(dtype)
    assert tstore.put_tensor(k, t) == 0
    back = tstore.get_tensor(k)
    assert back is not None and same(back, t)
    assert decode_header(tstore.get(k))["dtype"] == DTYPES.index(dtype)


@pytest.mark.filterwarnings("ignore:.*quantized tensor creation.*:UserWarning")
def test_rejected_inputs_log_and_write_nothing(tstore, key, keys_of, logs):
    prefix = key("bad")
    cases = {
        "complex": torch.zeros(2, dtype=torch.complex64),
        "nine_d": torch.zeros([1] * 9),
        "numpy": np.zeros(3),
        "int": 3,
        "quantized": torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.qint8),
    }
    for name, value in cases.items():
        assert tstore.put_tensor(f"{prefix}/{name}", value) == -600, name
        logs.expect("put_tensor", f"{prefix}/{name}", "INVALID_PARAMS (-600)")
    assert keys_of(prefix) == []
    eight = torch.arange(2**8, dtype=torch.float32).reshape([2] * 8)
    assert tstore.put_tensor(key("eight"), eight) == 0
    assert torch.equal(tstore.get_tensor(key("eight")), eight)


def test_zero_d_reads_back_with_shape_empty(tstore, key):
    k = key("Z")
    assert tstore.put_tensor(k, torch.tensor(3.5)) == 0
    back = tstore.get_tensor(k)
    assert back.shape == () and back.item() == 3.5
    h = decode_header(tstore.get(k))
    assert h["ndim"] == 0 and h["global"] == h["local"] == (-1,) * 8


def test_parameter_non_contiguous_and_empty(tstore, key):
    p = torch.nn.Parameter(torch.ones(2, 2))
    assert tstore.put_tensor(key("P"), p) == 0
    back = tstore.get_tensor(key("P"))
    assert type(back) is torch.Tensor and torch.equal(back, torch.ones(2, 2))
    nc = torch.arange(12).reshape(3, 4).t()
    assert not nc.is_contiguous()
    assert tstore.put_tensor(key("NC"), nc) == 0
    assert torch.equal(tstore.get_tensor(key("NC")), nc)
    assert tstore.put_tensor(key("E"), torch.empty(0, 4)) == 0
    e = tstore.get_tensor(key("E"))
    assert e.shape == (0, 4) and e.dtype == torch.float32


def test_get_failures_return_none_and_log(tstore, key, logs):
    assert tstore.get_tensor(key("missing")) is None
    logs.expect("get_tensor", "missing", "OBJECT_NOT_FOUND")
    assert tstore.put(key("raw"), b"x" * 400) == 0
    assert tstore.get_tensor(key("raw")) is None
    logs.expect("get_tensor", "not a tensor object")
    assert tstore.get_tensor("") is None
    logs.expect("get_tensor")


def test_get_tensor_into(tstore, key, logs):
    k = key("T")
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert tstore.put_tensor(k, t) == 0
    buf = torch.zeros(4096, dtype=torch.uint8)
    p = buf.data_ptr()
    out = tstore.get_tensor_into(k, p, 4096)
    assert out.data_ptr() == p + 304
    assert bytes(buf[:4].numpy()) == b"NOOM"
    assert torch.equal(out, t)
    assert bytes(buf[:352].numpy()) == tstore.get(k)
    assert tstore.get_tensor_into(k, p, 100) is None
    logs.expect("get_tensor_into", "smaller")
    assert tstore.get_tensor_into(k, 0, 4096) is None
    logs.expect("get_tensor_into")
    assert tstore.get_tensor_into(key("missing"), p, 4096) is None
    logs.expect("get_tensor_into", "OBJECT_NOT_FOUND")


def test_put_tensor_from(tstore, key, keys_of, logs):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert tstore.put_tensor(key("T"), t) == 0
    raw = tstore.get(key("T"))
    buf = torch.frombuffer(bytearray(raw) + bytearray(8), dtype=torch.uint8)
    p = buf.data_ptr()
    assert tstore.put_tensor_from(key("T2"), p, len(raw)) == 0
    assert tstore.get(key("T2")) == raw
    assert torch.equal(tstore.get_tensor(key("T2")), t)
    assert tstore.put_tensor_from(key("T3"), p, len(raw) + 4) == -600
    logs.expect("put_tensor_from", "INVALID_PARAMS")
    assert tstore.put_tensor_from(key("T4"), p + 1, len(raw)) == -600
    logs.expect("put_tensor_from", "bad magic")
    assert tstore.put_tensor_from(key("T5"), p, 200) == -600
    logs.expect("put_tensor_from", "smaller than the 304-byte")
    assert tstore.put_tensor_from(key("T6"), 0, len(raw)) == -600
    logs.expect("put_tensor_from", "null")
    assert tstore.batch_put_tensor_from([key("B1"), key("B2")], [p, p + 1], [len(raw)] * 2) == [
        -600,
        -600,
    ]
    logs.expect("batch_put_tensor_from", "item 1")
    assert tstore.batch_put_tensor_from([key("B1")], [p], [len(raw), 3]) == [-600]
    logs.expect("batch_put_tensor_from", "differ in length")
    assert tstore.batch_put_tensor_from([], [], []) == []
    for k in ("T3", "T4", "T5", "T6", "B1", "B2"):
        assert keys_of(key(k)) == [], k
    assert tstore.batch_put_tensor_from([key("B3"), key("B4")], [p, p], [len(raw)] * 2) == [0, 0]
    assert tstore.upsert_tensor_from(key("B3"), p, len(raw)) == 0
    assert tstore.batch_upsert_tensor_from([key("B3")], [p + 1], [len(raw)]) == [-600]
    logs.expect("batch_upsert_tensor_from")


def test_batch_get_tensor_into_argument_errors(tstore, key, logs):
    buf = torch.zeros(2048, dtype=torch.uint8)
    p = buf.data_ptr()
    assert tstore.batch_get_tensor_into([key("T"), key("x")], [p], [1024, 1024]) == [-600, -600]
    logs.expect("batch_get_tensor_into", "differ in length")
    assert tstore.batch_get_tensor_into([key("T"), key("x")], [p, 0], [1024, 1024]) == [-600, -600]
    logs.expect("batch_get_tensor_into", "null")
    t = torch.arange(6.0)
    assert tstore.put_tensor(key("T"), t) == 0
    got = tstore.batch_get_tensor_into([key("T"), key("x")], [p, p + 1024], [1024, 1024])
    assert torch.equal(got[0], t) and got[0].data_ptr() == p + 304
    assert got[1] is None
    logs.expect("batch_get_tensor_into", "1 of 2 items failed", "OBJECT_NOT_FOUND")


def test_batch_put_and_get(tstore, key, logs):
    ks = [key(f"b{i}") for i in range(4)]
    ts = [torch.full((i + 1, 3), float(i)) for i in range(4)]
    assert tstore.batch_put_tensor(ks, ts) == [0, 0, 0, 0]
    got = tstore.batch_get_tensor([*ks, key("missing")])
    assert all(torch.equal(a, b) for a, b in zip(got[:4], ts, strict=True))
    assert got[4] is None
    logs.expect("batch_get_tensor", "1 of 5 items failed")
    assert tstore.batch_put_tensor([key("x"), key("y")], [ts[0]]) == [-600, -600]
    logs.expect("batch_put_tensor", "differ in length")
    assert tstore.batch_put_tensor([key("x"), key("y")], [ts[0], "no"]) == [0, -600]
    logs.expect("batch_put_tensor", "expected a torch.Tensor")
    assert tstore.batch_put_tensor([], []) == []
    assert tstore.batch_get_tensor([]) == []
    assert tstore.batch_upsert_tensor([ks[0]], [ts[3]]) == [0]
    assert torch.equal(tstore.get_tensor(ks[0]), ts[3])


def test_batch_calls_use_constant_master_rpcs(tstore, key):
    ks = [key(f"r{i}") for i in range(64)]
    ts = [torch.full((4, 4), float(i)) for i in range(64)]
    before = rpcs(tstore)
    assert tstore.batch_put_tensor(ks, ts) == [0] * 64
    assert rpcs(tstore) - before <= 2
    before = rpcs(tstore)
    got = tstore.batch_get_tensor(ks)
    assert rpcs(tstore) - before <= 3
    assert all(torch.equal(a, b) for a, b in zip(got, ts, strict=True))


def test_pub_tensor_preferred_segments_check(tstore, key, keys_of, logs):
    cfg = ReplicateConfig()
    cfg.preferred_segments = ["a", "b"]
    cfg.replica_num = 1
    t = torch.ones(4)
    assert tstore.pub_tensor(key("p"), t, cfg) == -600
    logs.expect("pub_tensor", "preferred_segments")
    assert tstore.upsert_pub_tensor(key("p"), t, cfg) == -600
    logs.expect("upsert_pub_tensor", "preferred_segments")
    assert tstore.batch_pub_tensor([key("p"), key("q")], [t, t], cfg) == [-600, -600]
    logs.expect("batch_pub_tensor")
    assert tstore.batch_upsert_pub_tensor([key("p")], [t], cfg) == [-600]
    assert keys_of(key("p")) == [] and keys_of(key("q")) == []
    cfg.replica_num = 2
    assert tstore.pub_tensor(key("p"), t, cfg) == 0
    assert tstore.pub_tensor(key("d"), t) == 0
    assert tstore.pub_tensor(key("n"), t, None) == 0
    good = ReplicateConfig()
    good.with_hard_pin = True
    assert tstore.batch_pub_tensor([key("h")], [t], good) == [0]
    assert torch.equal(tstore.get_tensor(key("h")), t)


def test_group_ids_length_rule(tstore, key, logs):
    cfg = ReplicateConfig()
    cfg.group_ids = ["g1", "g2"]
    t = torch.ones(2)
    assert tstore.batch_pub_tensor([key("a"), key("b")], [t, t], cfg) == [0, 0]
    assert tstore.batch_pub_tensor([key("c")], [t], cfg) == [-600]
    logs.expect("batch_pub_tensor", "group_ids")
    assert tstore.pub_tensor(key("c"), t, cfg) == -600


def test_prefer_alloc_in_same_node_is_a_hint_for_tensors(tstore, key):
    cfg = ReplicateConfig()
    cfg.prefer_alloc_in_same_node = True
    assert tstore.pub_tensor(key("a"), torch.ones(3), cfg) == 0
    assert torch.equal(tstore.get_tensor(key("a")), torch.ones(3))


def test_module_helpers():
    from mooncake.store import _tensor_metadata_size

    assert _tensor_metadata_size() == 304
    t = torch.arange(6, dtype=torch.int16).reshape(2, 3).t()
    header, data_ptr, nbytes, owner = _serialize_tensor(t)
    assert len(header) == 304 and nbytes == 12 and owner.data_ptr() == data_ptr
    h = decode_header(header)
    assert h["dtype"] == 4 and h["global"][:2] == (3, 2)
    payload = bytes(owner.contiguous().view(torch.uint8).numpy())
    back = _deserialize_tensor(header + payload)
    assert torch.equal(back, t)
    with pytest.raises(ValueError):
        _deserialize_tensor(header + payload[:-1])
    with pytest.raises(ValueError):
        _deserialize_tensor(b"nope")
    with pytest.raises(ValueError):
        _serialize_tensor(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(ValueError):
        _serialize_tensor(np.zeros(2))


def test_tensor_objects_are_ordinary_objects(tstore, key):
    k = key("o")
    assert tstore.put_tensor(k, torch.ones(4)) == 0
    assert tstore.is_exist(k) == 1
    assert tstore.get_size(k) == 304 + 16
    assert tstore.remove(k, True) == 0
    assert tstore.get_tensor(k) is None


def test_cuda_input_is_copied_to_host(tstore, key):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    t = torch.arange(6.0, device="cuda")
    assert tstore.put_tensor(key("c"), t) == 0
    back = tstore.get_tensor(key("c"))
    assert back.device.type == "cpu" and torch.equal(back, t.cpu())


def test_closed_store_returns_errors(store_factory, key, logs):
    s = store_factory.raw()
    t = torch.ones(2)
    assert s.put_tensor(key("a"), t) == -600
    logs.expect("put_tensor", "not set up")
    assert s.get_tensor(key("a")) is None
    assert s.batch_put_tensor([key("a")], [t]) == [-600]
    assert s.batch_get_tensor([key("a"), key("b")]) == [None, None]
    assert s.get_tensor_with_parallelism(key("a")) is None
    assert s.put_tensor_with_tp(key("a"), t) == -600


def test_without_torch_the_extension_imports_and_tensor_methods_raise():
    """The extension does not link libtorch; torch is imported on first use."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "from mooncake.store import MooncakeDistributedStore\n"
        "s = MooncakeDistributedStore()\n"
        "for call in (lambda: s.get_tensor('k'), lambda: s.put_tensor('k', 1),\n"
        "             lambda: s.batch_get_tensor(['k'])):\n"
        "    try:\n"
        "        call()\n"
        "    except ImportError:\n"
        "        print('ImportError')\n"
        "print('torch' in sys.modules and sys.modules['torch'] is not None)\n"
    )
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ImportError", "ImportError", "ImportError", "False"]
