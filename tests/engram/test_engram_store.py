"""EngramStore against a real master (lease 500 ms): populate, lookup,
lookup_into, remove, invalidation, dtypes."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers.engram_tables import IDS, VOCAB, D, expected, make_tables
from mooncake.store import EngramStore, EngramStoreConfig

_layers = itertools.count(100)


def make_store(client: Any, dtype: str = "float32", layer: int | None = None) -> Any:
    cfg = EngramStoreConfig(table_vocab_sizes=VOCAB, embedding_dim=D, table_dtype=dtype)
    return EngramStore(next(_layers) if layer is None else layer, cfg, client)


@pytest.fixture()
def populated(client: Any) -> tuple[Any, Any, list[np.ndarray]]:
    e = make_store(client)
    t = make_tables()
    assert e.populate(t) is None
    return client, e, t


def test_populate_layout_and_plain_get(populated: Any) -> None:
    client, e, t = populated
    keys = e.get_store_keys()
    for h in range(4):
        assert client.get(keys[h]) == t[h].tobytes()


def test_lookup_nested_and_numpy(populated: Any) -> None:
    _, e, t = populated
    out = e.lookup(IDS)
    assert out.shape == (2, 2, 4, 8)
    assert out.dtype == np.float32
    assert out.flags.c_contiguous and out.flags.writeable
    exp = expected(t, IDS)
    assert np.array_equal(out, exp)
    a = np.array(IDS, np.int64)
    for v in (a, a.astype(np.int32), a.astype(np.uint8)):
        assert np.array_equal(e.lookup(v), exp)
    rev = np.ascontiguousarray(a[:, ::-1, :])[:, ::-1, :]
    assert not rev.flags.c_contiguous
    assert np.array_equal(e.lookup(rev), exp)
    assert np.array_equal(e.lookup(a[:, ::-1, :]), expected(t, a[:, ::-1, :]))
    assert e.lookup((((0, 1, 2, 3),),)).shape == (1, 1, 4, 8)
    assert np.array_equal(e.lookup([[[np.int64(1), True, 2, 3]]]), expected(t, [[[1, 1, 2, 3]]]))


def test_lookup_torch_ids(populated: Any) -> None:
    torch = pytest.importorskip("torch")
    _, e, t = populated
    out = e.lookup(torch.zeros((1, 1, 4), dtype=torch.int64))
    assert np.array_equal(out, expected(t, [[[0, 0, 0, 0]]]))


def test_populate_create_only(populated: Any) -> None:
    client, e, t = populated
    with pytest.raises(RuntimeError, match="^populate failed$"):
        e.populate(make_tables(0.5))
    for h, k in enumerate(e.get_store_keys()):
        assert client.get(k) == t[h].tobytes()


def test_populate_partial_existing(populated: Any) -> None:
    client, e, t = populated
    keys = e.get_store_keys()
    assert client.remove(keys[2], True) == 0
    with pytest.raises(RuntimeError, match="^populate failed$"):
        e.populate(t)
    assert list(client.batch_is_exist(keys)) == [1, 1, 0, 1]


def test_populate_input_errors(client: Any) -> None:
    e = make_store(client)
    t = make_tables()

    def err(arg: Any, msg: str) -> None:
        with pytest.raises(RuntimeError) as ei:
            e.populate(arg)
        assert str(ei.value) == msg

    err(t[:3], "embedding_buffers size must match num_heads")
    err([x.tolist() for x in t], "embedding_buffers must be NumPy arrays")
    err([t[0].astype(object)] + t[1:], "embedding_buffers must be float32 arrays")
    err([t[0].astype(str)] + t[1:], "embedding_buffers must be float32 arrays")
    err([t[0].ravel()] + t[1:], "each embedding buffer must be 2D [N_h, D]")
    err([t[0][None]] + t[1:], "each embedding buffer must be 2D [N_h, D]")
    err(
        [t[0][:-1]] + t[1:],
        "embedding buffer shape does not match get_table_vocab_sizes()/get_embedding_dim()",
    )
    assert list(client.batch_is_exist(e.get_store_keys())) == [0, 0, 0, 0]


def test_populate_conversions(client: Any) -> None:
    t = make_tables()
    e = make_store(client)
    e.populate([x.astype(np.float64) for x in t])
    assert client.get(e.get_store_keys()[1]) == t[1].tobytes()
    e2 = make_store(client)
    e2.populate(tuple(np.asfortranarray(x) for x in t))
    assert client.get(e2.get_store_keys()[3]) == t[3].tobytes()
    e3 = make_store(client)
    e3.populate([x.astype(np.int32) for x in t])
    assert np.array_equal(e3.lookup(IDS), expected(t, IDS))


@pytest.mark.parametrize(
    ("ids", "msg"),
    [
        (np.zeros((2, 4), np.int64), "row_ids array must have shape [B, L, H]"),
        (np.zeros((1, 1, 3), np.int64), "row_ids last dimension must match num_heads"),
        (np.zeros((0, 1, 4), np.int64), "EngramStore lookup failed"),
        (np.zeros((1, 0, 4), np.int64), "EngramStore lookup failed"),
        ([[[17, 0, 0, 0]]], "EngramStore lookup failed"),
        ([[[-1, 0, 0, 0]]], "EngramStore lookup failed"),
        (np.array([[[0, 0, 0, 29]]]), "EngramStore lookup failed"),
        (np.array([[[0, 0, 0, 2**63 + 5]]], np.uint64), "EngramStore lookup failed"),
        ([], "row_ids must not be empty"),
        ([[]], "row_ids must not be empty"),
        ([[[]]], "EngramStore lookup failed"),
        ([[[0, 1, 2, 3]], [[0, 1, 2, 3], [0, 1, 2, 3]]], "EngramStore lookup failed"),
        ([[[0, 1, 2]]], "EngramStore lookup failed"),
    ],
)
def test_lookup_errors(populated: Any, ids: Any, msg: str) -> None:
    _, e, _ = populated
    with pytest.raises(RuntimeError) as ei:
        e.lookup(ids)
    assert str(ei.value) == msg


def test_lookup_non_integer_ids(populated: Any) -> None:
    _, e, _ = populated
    with pytest.raises(RuntimeError, match="integers"):
        e.lookup([[[0.5, 1, 2, 3]]])
    with pytest.raises(RuntimeError, match="integers"):
        e.lookup([[["a", 1, 2, 3]]])
    with pytest.raises(TypeError):
        e.lookup(5)
    with pytest.raises(RuntimeError) as ei:
        e.lookup(np.array([[[2.7, 1, 2, 3]]], np.float64))
    assert "integer" in str(ei.value) and "float64" in str(ei.value)
    with pytest.raises(RuntimeError, match="integer"):
        e.lookup(np.ones((1, 1, 4), bool))
    with pytest.raises(RuntimeError, match="integer"):
        e.lookup(np.ones((1, 1, 4), object))


def test_forced_remove_through_same_client_seen(populated: Any) -> None:
    client, e, _ = populated
    e.lookup(IDS)  # warm cache
    assert client.remove(e.get_store_keys()[3], True) == 0
    with pytest.raises(RuntimeError, match="^EngramStore lookup failed$"):
        e.lookup(IDS)


def test_remove_from_store_lease(populated: Any) -> None:
    _, e, _ = populated
    e.lookup(IDS)
    with pytest.raises(RuntimeError) as ei:
        e.remove_from_store()
    assert str(ei.value) == "remove_from_store failed, rc=-706"
    assert e.remove_from_store(True) == 4
    assert e.remove_from_store(True) == 0
    assert e.remove_from_store() == 0


def test_invalidation_after_repopulate(populated: Any) -> None:
    _, e, t = populated
    assert np.array_equal(e.lookup(IDS), expected(t, IDS))
    assert e.remove_from_store(True) == 4
    t2 = make_tables(0.5)
    e.populate(t2)
    assert np.array_equal(e.lookup(IDS), expected(t2, IDS))


def test_store_set_up_after_construction(master: Any, client_factory: Callable[..., Any]) -> None:
    class Late:
        """A wrapper whose client appears after the EngramStore exists."""

        def __init__(self) -> None:
            self.inner: Any = None

        def _get_pyclient_capsule(self) -> Any:
            return None if self.inner is None else self.inner._get_pyclient_capsule()

    w = Late()
    e = make_store(w)
    with pytest.raises(RuntimeError, match="^populate failed$"):
        e.populate(make_tables())
    w.inner = client_factory()
    t = make_tables()
    e.populate(t)
    assert np.array_equal(e.lookup(IDS), expected(t, IDS))
    w.inner.close()
    with pytest.raises(RuntimeError, match="^EngramStore lookup failed$"):
        e.lookup(IDS)


def test_lookup_outlasting_lease(populated: Any) -> None:
    _, e, t = populated
    for _ in range(3):
        assert np.array_equal(e.lookup(IDS), expected(t, IDS))
        time.sleep(0.6)  # past the 500 ms lease: refresh, no spurious failure
    assert np.array_equal(e.lookup(IDS), expected(t, IDS))


def test_lookup_into(populated: Any) -> None:
    _, e, t = populated
    out = np.empty((2, 2, 4, 8), np.float32)
    r = e.lookup_into(IDS, out)
    assert r is out
    assert np.array_equal(out, expected(t, IDS))

    bad = np.full((2, 2, 4, 7), 7.0, np.float32)
    with pytest.raises(RuntimeError) as ei:
        e.lookup_into(IDS, bad)
    assert str(ei.value) == (
        "out must be a C-contiguous writable array of shape (B, L, H, D)=(2, 2, 4, 8)"
        " and dtype float32"
    )
    assert (bad == 7.0).all()
    nc = np.full((2, 2, 4, 16), 7.0, np.float32)[..., ::2]
    with pytest.raises(RuntimeError, match="C-contiguous"):
        e.lookup_into(IDS, nc)
    assert (nc == 7.0).all()
    ro = np.zeros((2, 2, 4, 8), np.float32)
    ro.flags.writeable = False
    with pytest.raises(RuntimeError, match="writable"):
        e.lookup_into(IDS, ro)
    with pytest.raises(RuntimeError, match="dtype float32"):
        e.lookup_into(IDS, np.zeros((2, 2, 4, 8), np.float64))
    with pytest.raises(RuntimeError, match="C-contiguous"):
        e.lookup_into(IDS, [[0.0]])

    out = np.full((1, 1, 4, 8), 3.0, np.float32)
    with pytest.raises(RuntimeError, match="^EngramStore lookup failed$"):
        e.lookup_into([[[0, 0, 0, 29]]], out)
    assert (out == 0).all()


def test_float16_tables(client: Any) -> None:
    e = make_store(client, "float16")
    t = make_tables()
    e.populate(t)
    for h, k in enumerate(e.get_store_keys()):
        assert len(client.get(k)) == VOCAB[h] * 8 * 2
    out = e.lookup(IDS)
    assert out.dtype == np.float16
    assert np.array_equal(out, expected([x.astype(np.float16) for x in t], IDS))
    o32 = np.empty((2, 2, 4, 8), np.float32)
    e.lookup_into(IDS, o32)
    assert np.array_equal(o32, expected([x.astype(np.float16).astype(np.float32) for x in t], IDS))
    with pytest.raises(RuntimeError, match="dtype float16 or float32"):
        e.lookup_into(IDS, np.empty((2, 2, 4, 8), np.uint16))


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bits (NumPy reference)."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def test_bfloat16_tables(client: Any) -> None:
    e = make_store(client, "bfloat16")
    t = [x * 1.001 for x in make_tables()]
    e.populate(t)
    bits = [bf16_bits(x) for x in t]
    assert client.get(e.get_store_keys()[0]) == bits[0].tobytes()
    out = e.lookup(IDS)
    assert out.dtype == np.float32
    rounded = [(b.astype(np.uint32) << 16).view(np.float32) for b in bits]
    assert np.array_equal(out, expected(rounded, IDS))
    raw = np.empty((2, 2, 4, 8), np.uint16)
    assert e.lookup_into(IDS, raw) is raw
    assert np.array_equal(raw, expected(bits, IDS))
    # uint16 input is taken as raw bits.
    e2 = make_store(client, "bfloat16")
    e2.populate(bits)
    assert np.array_equal(e2.lookup(IDS), out)


def test_size_check(client: Any) -> None:
    layer = next(_layers)
    e16 = make_store(client, "float16", layer=layer)
    e16.populate(make_tables())
    e32 = make_store(client, "float32", layer=layer)
    with pytest.raises(RuntimeError, match="^EngramStore lookup failed$"):
        e32.lookup(IDS)


def test_duplicates_and_large_batch(populated: Any) -> None:
    _, e, t = populated
    rng = np.random.default_rng(0)
    ids = np.stack([rng.integers(0, n, (64, 3)) for n in VOCAB], axis=-1)
    assert np.array_equal(e.lookup(ids), expected(t, ids))
    z = e.lookup(np.zeros((256, 1, 4), np.int64))
    assert np.array_equal(z, expected(t, np.zeros((256, 1, 4), np.int64)))


def test_populate_dtype_message_names_table_dtype(client: Any) -> None:
    e = make_store(client, "float16")
    t = make_tables()
    with pytest.raises(RuntimeError) as ei:
        e.populate([t[0].astype(object)] + t[1:])
    assert str(ei.value) == "embedding_buffers must be float16 arrays"
    e = make_store(client, "bfloat16")
    with pytest.raises(RuntimeError) as ei:
        e.populate([t[0].astype(str)] + t[1:])
    assert str(ei.value) == "embedding_buffers must be bfloat16 arrays"


def test_metadata_only_store_not_set_up() -> None:
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()  # never set up
    e = make_store(s)
    assert e.get_num_heads() == 4
    with pytest.raises(RuntimeError) as ei:
        e.populate(make_tables())
    assert str(ei.value) == "populate failed"
    with pytest.raises(RuntimeError) as ei:
        e.lookup(IDS)
    assert str(ei.value) == "EngramStore lookup failed"
    out = np.full((2, 2, 4, 8), 5.0, np.float32)
    with pytest.raises(RuntimeError, match="^EngramStore lookup failed$"):
        e.lookup_into(IDS, out)
    assert (out == 0).all()
    with pytest.raises(RuntimeError) as ei:
        e.remove_from_store()
    assert str(ei.value) == "remove_from_store failed, rc=-600"


def test_closed_store_behaves_as_metadata_only(client_factory: Callable[..., Any]) -> None:
    c = client_factory()
    e = make_store(c)
    t = make_tables()
    e.populate(t)
    assert np.array_equal(e.lookup(IDS), expected(t, IDS))
    c.close()
    with pytest.raises(RuntimeError, match="^EngramStore lookup failed$"):
        e.lookup(IDS)
    with pytest.raises(RuntimeError, match="^populate failed$"):
        make_store(c).populate(t)
    with pytest.raises(RuntimeError) as ei:
        e.remove_from_store(True)
    assert str(ei.value) == "remove_from_store failed, rc=-600"


def test_populate_rolls_back_on_partial_failure() -> None:
    """Three of four tables fit the only segment: the put of the fourth
    fails, the three written keys are removed again."""
    from conftest import Master, make_client

    m = Master(lease_ms=500)
    try:
        rows = 1 << 16  # 2 MiB per float32 table
        c = make_client(m.addr, segment=7 << 20)
        other = make_client(m.addr, segment=0)
        try:
            cfg = EngramStoreConfig(table_vocab_sizes=[rows] * 4, embedding_dim=8)
            e = EngramStore(1, cfg, c)
            tables = [np.full((rows, 8), h, np.float32) for h in range(4)]
            with pytest.raises(RuntimeError) as ei:
                e.populate(tables)
            assert str(ei.value) == "populate failed"
            assert list(other.batch_is_exist(e.get_store_keys())) == [0, 0, 0, 0]
            # With room for all four, the same populate succeeds.
            big = make_client(m.addr, segment=16 << 20)
            try:
                e2 = EngramStore(2, cfg, big)
                e2.populate(tables)
                assert list(other.batch_is_exist(e2.get_store_keys())) == [1, 1, 1, 1]
                out = e2.lookup([[[0, 1, 2, rows - 1]]])
                assert np.array_equal(out[0, 0, :, 0], [0, 1, 2, 3])
            finally:
                big.close()
        finally:
            other.close()
            c.close()
    finally:
        m.stop()


def test_lookup_outlasting_tiny_lease(master_tiny_lease: Any) -> None:
    """With a 1 ms lease every lookup outlives the lease it was granted
    (and most start with an expired one): none may fail, values stay exact,
    and a non-forced remove succeeds once no lease is held."""
    from conftest import make_client

    c = make_client(master_tiny_lease.addr)
    try:
        e = make_store(c)
        t = make_tables()
        e.populate(t)
        rng = np.random.default_rng(3)
        big = np.stack([rng.integers(0, n, (512, 16)) for n in VOCAB], axis=-1)
        for i in range(30):
            ids = big if i % 3 == 0 else np.array(IDS)
            assert np.array_equal(e.lookup(ids), expected(t, ids))
            out = np.empty((2, 2, 4, 8), np.float32)
            assert e.lookup_into(IDS, out) is out
            assert np.array_equal(out, expected(t, IDS))
            if i % 10 == 0:
                time.sleep(0.01)
        time.sleep(0.01)
        assert e.remove_from_store() == 4
    finally:
        c.close()


def test_float16_populate_rounds_like_numpy(client: Any) -> None:
    """float32 input narrowed to float16 (in Rust) matches NumPy's cast bit
    for bit, including ties, subnormals, overflow to infinity and NaN;
    float64 input goes through NumPy's own cast."""
    rng = np.random.default_rng(11)
    t = [(rng.standard_normal((n, D)) * 10.0 ** rng.integers(-8, 6, (n, D))) for n in VOCAB]
    t = [x.astype(np.float32) for x in t]
    t[0][0, :4] = [np.nan, np.inf, 65520.0, 2.0**-25]
    e = make_store(client, "float16")
    e.populate(t)
    with np.errstate(over="ignore"):
        want = [x.astype(np.float16).tobytes() for x in t]
    for h, k in enumerate(e.get_store_keys()):
        assert client.get(k) == want[h]
    t64 = [x.astype(np.float64) for x in make_tables(0.3)]
    e2 = make_store(client, "float16")
    e2.populate(t64)
    assert client.get(e2.get_store_keys()[2]) == t64[2].astype(np.float16).tobytes()


def test_lookup_into_rejects_a_non_native_byte_order(populated: Any) -> None:
    # '>f4' is not float32: the gather would write native-order values into it.
    _, e, _ = populated
    out = np.full((2, 2, 4, 8), 7.0, ">f4")
    with pytest.raises(RuntimeError, match="and dtype float32$"):
        e.lookup_into(IDS, out)
    assert (out == 7.0).all()


def test_float16_and_bfloat16_raw_inputs_and_outputs(client: Any) -> None:
    # float16 tables given as float16 arrays, bfloat16 tables given as raw
    # uint16 bits; lookup_into their raw dtypes returns the stored bits.
    t = make_tables()
    e16 = make_store(client, "float16")
    e16.populate([x.astype(np.float16) for x in t])
    out16 = np.empty((2, 2, 4, 8), np.float16)
    assert e16.lookup_into(IDS, out16) is out16
    assert np.array_equal(out16, expected([x.astype(np.float16) for x in t], IDS))
    bits = [(x.view(np.uint32) >> 16).astype(np.uint16) for x in t]  # truncated bf16
    eb = make_store(client, "bfloat16")
    eb.populate(bits)
    raw = np.empty((2, 2, 4, 8), np.uint16)
    eb.lookup_into(IDS, raw)
    assert np.array_equal(raw, expected(bits, IDS))
    wide = eb.lookup(IDS)
    assert wide.dtype == np.float32
    assert np.array_equal(wide.view(np.uint32) >> 16, expected(bits, IDS).astype(np.uint32))
