"""``MooncakeWork``: a ``torch.distributed`` Work over a Rust op handle."""

from __future__ import annotations

import datetime
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch._C._distributed_c10d import Work

from mooncake import _native


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
    """Handle of one op. Keeps every tensor the op touches alive until it completes.

    Once the op completed (seen by ``wait``, ``is_completed`` or the group's
    shutdown) the Work is finalized, once: on success the ``finish``
    callbacks copy results back into the caller's tensors, the kept tensors
    are released, and ``on_done(work)`` tells the owner (the group drops the
    Work from its in-flight table). ``capacity`` reads the owning group's
    current slot count, the length of a failed-ranks hint.
    """

    def __init__(
        self,
        native: _native.PgWork,
        keep: list[Any],
        finish: list[Callable[[], None]],
        result: list[torch.Tensor],
        capacity: Callable[[], int],
        on_done: Callable[[MooncakeWork], None] | None = None,
    ) -> None:
        super().__init__()
        self._native = native
        self._keep = keep
        self._finish = finish
        self._result = result
        self._capacity = capacity
        self._on_done = on_done
        self._finalized = False

    def _group_capacity(self) -> int:
        """The owning group's current capacity (slots)."""
        return self._capacity()

    def _finalize(self) -> None:
        if self._finalized:
            return
        self._finalized = True
        if self._finish and self._native.error() is None:
            for f in self._finish:
                f()
        if self._on_done is not None:
            self._on_done(self)
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
