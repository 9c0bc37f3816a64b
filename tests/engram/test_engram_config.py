"""EngramStoreConfig and EngramStore construction: defaults, assignment
rules, validation order and messages, store resolution."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mooncake.store import EngramStore, EngramStoreConfig


def cfg(vocab: Any = (17, 19, 23, 29), dim: int = 8, dtype: str = "float32") -> Any:
    c = EngramStoreConfig()
    c.table_vocab_sizes = list(vocab)
    c.embedding_dim = dim
    c.table_dtype = dtype
    return c


def test_config_defaults_and_copy() -> None:
    c = EngramStoreConfig()
    assert c.table_vocab_sizes == [1024]
    assert c.embedding_dim == 64
    assert c.table_dtype == "float32"
    c.table_vocab_sizes.append(5)
    assert c.table_vocab_sizes == [1024]


def test_config_assignment_sequences() -> None:
    c = EngramStoreConfig()
    c.table_vocab_sizes = np.array([3, 4])
    assert c.table_vocab_sizes == [3, 4]
    c.table_vocab_sizes = (7, 8)
    assert c.table_vocab_sizes == [7, 8]
    with pytest.raises(TypeError):
        c.table_vocab_sizes = [1.5]
    with pytest.raises(TypeError):
        c.embedding_dim = 2.0
    with pytest.raises(TypeError):
        c.embedding_dim = 2**31


def test_config_kwargs_and_dtype_normalisation() -> None:
    c = EngramStoreConfig(table_vocab_sizes=[5], embedding_dim=4, table_dtype=np.float16)
    assert (c.table_vocab_sizes, c.embedding_dim, c.table_dtype) == ([5], 4, "float16")
    c.table_dtype = np.float32
    assert c.table_dtype == "float32"
    c.table_dtype = np.dtype("float16")
    assert c.table_dtype == "float16"


def test_assignment_does_not_validate() -> None:
    c = EngramStoreConfig()
    c.table_vocab_sizes = []
    c.embedding_dim = -1
    c.table_dtype = "int8"


@pytest.mark.parametrize(
    ("vocab", "dim", "dtype", "msg"),
    [
        ([], 8, "float32", "EngramStoreConfig.table_vocab_sizes must not be empty"),
        ([3], 0, "float32", "EngramStoreConfig.embedding_dim must be positive"),
        (
            [3, 0],
            8,
            "float32",
            "EngramStoreConfig.table_vocab_sizes must contain only positive values",
        ),
        ([3, -1], -5, "float32", "EngramStoreConfig.embedding_dim must be positive"),
        (
            [3],
            8,
            "int8",
            "EngramStoreConfig.table_dtype must be one of 'float32', 'float16', 'bfloat16'",
        ),
    ],
)
def test_validation_messages(vocab: list[int], dim: int, dtype: str, msg: str) -> None:
    with pytest.raises(ValueError) as ei:
        EngramStore(1, cfg(vocab, dim, dtype))
    assert str(ei.value) == msg


def test_constructor_type_errors() -> None:
    c = cfg([5])
    with pytest.raises(TypeError):
        EngramStore(2**31, c)
    with pytest.raises(TypeError):
        EngramStore(1.5, c)
    with pytest.raises(TypeError):
        EngramStore(1, None)
    with pytest.raises(TypeError):
        EngramStore(1, "cfg")


def test_bad_store_argument() -> None:
    with pytest.raises(RuntimeError) as ei:
        EngramStore(1, cfg([5]), 5)
    assert str(ei.value) == (
        "EngramStore store parameter must be a PyClient or store wrapper that implements"
        " _get_pyclient_capsule()"
    )


class Wrapper:
    """A store wrapper returning a fixed value from _get_pyclient_capsule()."""

    def __init__(self, value: Any = None, exc: Exception | None = None) -> None:
        self.value = value
        self.exc = exc

    def _get_pyclient_capsule(self) -> Any:
        if self.exc is not None:
            raise self.exc
        return self.value


def test_wrapper_resolution_errors() -> None:
    import ctypes

    with pytest.raises(RuntimeError) as ei:
        EngramStore(1, cfg([5]), Wrapper(value=42))
    assert str(ei.value) == "store wrapper returned a non-capsule PyClient handle"

    make = ctypes.pythonapi.PyCapsule_New
    make.restype = ctypes.py_object
    make.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    name = ctypes.c_char_p(b"other.name")
    buf = ctypes.c_int(1)
    other = make(ctypes.addressof(buf), name, None)
    with pytest.raises(RuntimeError) as ei:
        EngramStore(1, cfg([5]), Wrapper(value=other))
    assert str(ei.value) == "store wrapper returned an unexpected PyClient capsule type"

    with pytest.raises(RuntimeError) as ei:
        EngramStore(1, cfg([5]), Wrapper(exc=ValueError("boom")))
    assert str(ei.value) == "Failed to unwrap store wrapper for EngramStore: boom"

    # None -> metadata-only.
    e = EngramStore(1, cfg([5]), Wrapper(value=None))
    assert e.get_num_heads() == 1


def test_getters_and_config_copy() -> None:
    c = cfg([5])
    e = EngramStore(-3, c)
    assert e.get_store_keys() == ["engram:l-3:h0"]
    e2 = EngramStore(layer_id=4, config=c, store=None)
    assert e2.get_num_heads() == 1
    assert e2.get_layer_id() == 4
    c.table_vocab_sizes = [9, 9]
    c.embedding_dim = 2
    assert e2.get_table_vocab_sizes() == [5]
    assert e2.get_embedding_dim() == 8
    assert e2.get_table_dtype() == "float32"
    keys = EngramStore(7, cfg([1, 2, 3])).get_store_keys()
    assert keys == ["engram:l7:h0", "engram:l7:h1", "engram:l7:h2"]


def test_metadata_only_operations() -> None:
    e = EngramStore(1, cfg([17, 19, 23, 29]))
    tables = [np.zeros((n, 8), np.float32) for n in (17, 19, 23, 29)]
    with pytest.raises(RuntimeError, match="^populate failed$"):
        e.populate(tables)
    with pytest.raises(RuntimeError, match="^EngramStore lookup failed$"):
        e.lookup([[[0, 0, 0, 0]]])
    with pytest.raises(RuntimeError) as ei:
        e.remove_from_store()
    assert str(ei.value) == "remove_from_store failed, rc=-600"
    e1 = EngramStore(1, cfg([5]))
    with pytest.raises(RuntimeError, match="^EngramStore lookup failed$"):
        e1.lookup([[[0]]])
