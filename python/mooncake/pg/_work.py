"""``MooncakeWork``: a ``torch.distributed`` Work over a Rust op handle."""

from __future__ import annotations

import datetime
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch._C._distributed_c10d import Work

if TYPE_CHECKING:
    from mooncake.pg._backend import MooncakeProcessGroup


def _seconds(timeout: Any) -> float | None:
    if timeout is None:
        return None
    s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return s if s > 0 else None


_futures: queue.SimpleQueue[tuple[MooncakeWork, torch.futures.Future[Any]]] = queue.SimpleQueue()
_callback_thread: threading.Thread | None = None
_callback_lock = threading.Lock()


def _complete_futures() -> None:
    """The one thread that completes ``get_future()`` futures (so their
    callbacks never run on a caller's thread or on a Rust thread)."""
    while True:
        work, fut = _futures.get()
        try:
            work.wait()
        except BaseException as e:  # noqa: BLE001 - handed to the future
            fut.set_exception(e)
        else:
            fut.set_result(work.result())


def _future_of(work: MooncakeWork) -> torch.futures.Future[Any]:
    global _callback_thread
    with _callback_lock:
        if _callback_thread is None or not _callback_thread.is_alive():
            _callback_thread = threading.Thread(
                target=_complete_futures, name="mooncake-pg-futures", daemon=True
            )
            _callback_thread.start()
    fut: torch.futures.Future[Any] = torch.futures.Future()
    _futures.put((work, fut))
    return fut


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

    def exception(self) -> Exception | None:
        err = self._native.error()
        return RuntimeError(err) if err else None

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future[Any]:
        """A future completed with ``result()`` (or the op's error) by a
        dedicated callback thread; used by ``all_reduce_coalesced(async_op=True)``
        and DDP communication hooks."""
        return _future_of(self)

    def _source_rank(self) -> int:
        return int(self._native.source_rank())

    def source_rank(self) -> int:
        return self._source_rank()

    def synchronize(self) -> None:
        self.wait()

    # Failure reporting: which ranks' contributions this op could not obtain.
    def failed_mask(self) -> int:
        """Bitmap of ranks whose contribution this rank could not obtain."""
        return int(self._native.failed_mask())
