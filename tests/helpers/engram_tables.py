"""Reference embedding tables and lookups for the EngramStore tests."""

from __future__ import annotations

from typing import Any

import numpy as np

VOCAB = [17, 19, 23, 29]
D = 8
# Lookup ids of shape (batch 2, tokens 2, one per table).
IDS = [[[0, 1, 2, 3], [4, 5, 6, 7]], [[16, 18, 22, 28], [8, 9, 10, 11]]]


def make_tables(offset: float = 0.0) -> list[np.ndarray]:
    """One float32 table per vocabulary size: row ``r`` of table ``h`` holds
    ``r * D .. r * D + D - 1`` plus ``1000 * h + offset``."""
    return [
        np.arange(n * D, dtype=np.float32).reshape(n, D) + 1000 * h + offset
        for h, n in enumerate(VOCAB)
    ]


def expected(tables: list[np.ndarray], ids: Any) -> np.ndarray:
    """What a lookup of ``ids`` in ``tables`` returns (tables stacked on axis 2)."""
    a = np.asarray(ids)
    return np.stack([tables[h][a[..., h]] for h in range(len(tables))], axis=2)
