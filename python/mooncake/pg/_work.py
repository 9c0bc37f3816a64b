"""``MooncakeWork``: a ``torch.distributed`` Work over a Rust op handle."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch._C._distributed_c10d import Work

if TYPE_CHECKING:
    from mooncake.pg._backend import MooncakeProcessGroup


def _seconds(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        s = timeout.total_seconds()
    else:
        s = float(timeout)
    return s if s > 0 else None


class MooncakeWork(Work):
    """Handle of one op. Keeps every tensor the op touches alive until it completes."""

    def __init__(
        self,
        native: Any,
        group: MooncakeProcessGroup,
        keep: list[Any],
        finish: list[Callable[[], None]],
        result: list[torch.Tensor],
    ) -> None:
        super().__init__()
        self._native = native
        self._group = group
        self._keep = keep
        self._finish = finish
        self._result = result
        self._finalized = False

    def _finalize(self) -> None:
        if self._finalized:
            return
        self._finalized = True
        if self._finish and self._native.error() is None:
            for f in self._finish:
                f()
        self._group._inflight.pop(id(self), None)
        self._keep = []

    def wait(self, timeout: Any = None) -> bool:
        """Blocks with the GIL released; copies results back; raises on error or timeout."""
        try:
            self._native.wait(None if timeout is None else _seconds(timeout))
        finally:
            if not self._finalized and self._native.is_completed():
                self._finalize()
        return True

    def is_completed(self) -> bool:
        if self._native.is_completed():
            self._finalize()
            return True
        return False

    def is_success(self) -> bool:
        return self._native.is_completed() and self._native.error() is None

    def exception(self) -> Exception | None:  # type: ignore[override]
        err = self._native.error()
        return RuntimeError(err) if err else None

    def result(self) -> list[torch.Tensor]:
        return self._result

    def _source_rank(self) -> int:
        return int(self._native.source_rank())

    def source_rank(self) -> int:
        return self._source_rank()

    def synchronize(self) -> None:
        self.wait()

    # Failure reporting (spec §5.3).
    def failed_mask(self) -> int:
        """Bitmap of ranks whose contribution this rank could not obtain."""
        return int(self._native.failed_mask())
