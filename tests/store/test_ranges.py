"""get_into_ranges: buffer-major ranged reads into registered buffers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import Buffers, ptr

K = Callable[[str], str]

DATA1 = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # 36 bytes
DATA2 = b"abcdefghijklmnopqrstuvwxyz!@#$%^&*()"  # 36 bytes
BUF = 32


@pytest.fixture
def two_keys(store: Any, key: K) -> tuple[str, str]:
    k1, k2 = key("r1"), key("r2")
    assert len(DATA1) == len(DATA2) == 36
    assert store.put(k1, DATA1) == 0
    assert store.put(k2, DATA2) == 0
    return k1, k2


@pytest.fixture
def regions(store: Any, buf: Buffers) -> Any:
    b0, b1 = buf(BUF, fill=ord("_")), buf(BUF, fill=ord("_"))
    assert store.register_buffer(ptr(b0), BUF) == 0
    assert store.register_buffer(ptr(b1), BUF) == 0
    yield b0, b1
    store.unregister_buffer(ptr(b0))
    store.unregister_buffer(ptr(b1))


def test_doc_example(store: Any, two_keys: tuple[str, str], regions: Any) -> None:
    k1, k2 = two_keys
    b0, b1 = regions
    r = store.get_into_ranges(
        [ptr(b0), ptr(b1)],
        [[k1, k2], [k2, k1]],
        [[[0, 20], [8]], [[4], [16]]],
        [[[1, 30], [2]], [[0], [10]]],
        [[[4, 3], [5]], [[6], [4]]],
    )
    assert r == [[[4, 3], [5]], [[6], [4]]]
    assert b0[0:4].tobytes() == DATA1[1:5]
    assert b0[8:13].tobytes() == DATA2[2:7]
    assert b0[20:23].tobytes() == DATA1[30:33]
    assert b1[4:10].tobytes() == DATA2[0:6]
    assert b1[16:20].tobytes() == DATA1[10:14]
    # untouched bytes stay as they were
    assert b0[4:8].tobytes() == b"____"
    assert b1[0:4].tobytes() == b"____"


def test_source_overflow(store: Any, two_keys: tuple[str, str], regions: Any) -> None:
    k1, _ = two_keys
    b0, _ = regions
    r = store.get_into_ranges([ptr(b0)], [[k1]], [[[0]]], [[[35]]], [[[4]]])
    assert r[0][0][0] < 0


def test_destination_overflow(store: Any, two_keys: tuple[str, str], regions: Any) -> None:
    k1, _ = two_keys
    b0, _ = regions
    r = store.get_into_ranges([ptr(b0)], [[k1]], [[[31]]], [[[0]]], [[[4]]])
    assert r[0][0][0] < 0


def test_missing_key_group_isolated(
    store: Any, two_keys: tuple[str, str], regions: Any, key: K
) -> None:
    _, k2 = two_keys
    b0, _ = regions
    r = store.get_into_ranges(
        [ptr(b0)], [[key("missing"), k2]], [[[0], [8]]], [[[0], [0]]], [[[4], [4]]]
    )
    assert r[0][0][0] < 0
    assert r[0][1] == [4]
    assert b0[8:12].tobytes() == DATA2[0:4]


def test_mismatched_fragment_lists(store: Any, two_keys: tuple[str, str], regions: Any) -> None:
    k1, k2 = two_keys
    b0, _ = regions
    r = store.get_into_ranges([ptr(b0)], [[k1, k2]], [[[0], []]], [[[0, 1], []]], [[[], []]])
    assert len(r) == 1
    assert len(r[0]) == 2
    assert r[0][0][0] < 0
    assert len(r[0][1]) == 0


def test_unregistered_destination(store: Any, two_keys: tuple[str, str], buf: Buffers) -> None:
    k1, _ = two_keys
    d = buf(64)
    r = store.get_into_ranges([ptr(d)], [[k1]], [[[0, 8]]], [[[0, 4]]], [[[4, 4]]])
    assert r == [[[-600, -600]]]


def test_outer_length_mismatch(store: Any, two_keys: tuple[str, str], regions: Any) -> None:
    k1, _ = two_keys
    b0, b1 = regions
    r = store.get_into_ranges([ptr(b0), ptr(b1)], [[k1]], [[[0]]], [[[0]]], [[[4]]])
    assert len(r) == 2
    assert all(f == -600 for group in r for frag in group for f in frag)


def test_zero_size_fragment(store: Any, two_keys: tuple[str, str], regions: Any) -> None:
    k1, _ = two_keys
    b0, _ = regions
    r = store.get_into_ranges([ptr(b0)], [[k1]], [[[0, 4]]], [[[0, 0]]], [[[0, 4]]])
    assert r == [[[0, 4]]]


def test_many_rows_one_key(store: Any, buf: Buffers, key: K) -> None:
    rows, width = 256, 64
    import numpy as np

    table = np.arange(rows * width, dtype=np.uint32).astype(np.uint8)
    k = key("table")
    assert store.put(k, table) == 0
    out = buf(rows * width)
    assert store.register_buffer(ptr(out), out.nbytes) == 0
    try:
        order = list(reversed(range(rows)))
        r = store.get_into_ranges(
            [ptr(out)],
            [[k]],
            [[[i * width for i in range(rows)]]],
            [[[j * width for j in order]]],
            [[[width] * rows]],
        )
        assert r == [[[width] * rows]]
        expect = b"".join(table[j * width : (j + 1) * width].tobytes() for j in order)
        assert out.tobytes() == expect
    finally:
        store.unregister_buffer(ptr(out))
