"""Mooncake EP (upstream's ``mooncake.ep``): the elastic expert-parallel API.

Upstream's module is the union of two native modules: the process-group
API of ``mooncake.pg`` (SGLang's elastic EP imports ``MooncakeBackendOptions``,
``set_host_ip``, ``set_device_filter``, ``get_active_ranks``,
``get_peer_state``, ``recover_ranks`` and the rest from here), and the GPU
expert-parallel kernels (``Buffer``, ``ElasticBuffer``, ``EventHandle``,
``get_ep_buffer_size_hint``, ``calculate_elastic_buffer_size``).

Here the process-group names are ``mooncake.pg``'s own objects, re-exported
unchanged. The GPU kernels need CUDA, which this build does not drive: the
classes and functions exist (so imports and ``isinstance`` checks work) and
raise ``RuntimeError`` naming the missing CUDA support when used.
"""

from __future__ import annotations

from typing import Any, NoReturn

from mooncake import pg as _pg
from mooncake.pg import *  # the process-group API, re-exported unchanged

__all__ = [
    "MAX_QP_COUNT",
    "Buffer",
    "ElasticBuffer",
    "EventHandle",
    "calculate_elastic_buffer_size",
    "get_ep_buffer_size_hint",
]
__all__ += _pg.__all__

#: Queue pairs per peer of upstream's EP kernels (a compile-time constant there).
MAX_QP_COUNT = 256


def _no_cuda(what: str) -> NoReturn:
    raise RuntimeError(
        f"mooncake.ep.{what} needs CUDA (GPU expert-parallel kernels); this build of "
        "Mooncake has no CUDA support. The process-group API of mooncake.ep "
        "(MooncakeBackendOptions, get_peer_state, recover_ranks, ...) works without it."
    )


class EventHandle:
    """A CUDA event of the EP kernels (needs CUDA)."""

    def __init__(self, stream_ptr: int = 0) -> None:
        _no_cuda("EventHandle")

    def current_stream_wait(self, stream_ptr: int) -> None:
        _no_cuda("EventHandle.current_stream_wait")

    def synchronize(self) -> None:
        _no_cuda("EventHandle.synchronize")


class Buffer:
    """The EP dispatch/combine buffer (needs CUDA)."""

    def __init__(
        self,
        rank: int,
        num_ranks: int,
        num_ep_buffer_bytes: int,
        disable_p2p: bool = False,
    ) -> None:
        _no_cuda("Buffer")


class ElasticBuffer:
    """The elastic EP buffer (needs CUDA)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _no_cuda("ElasticBuffer")

    @staticmethod
    def calculate_buffer_size(*args: Any, **kwargs: Any) -> int:
        _no_cuda("ElasticBuffer.calculate_buffer_size")


def get_ep_buffer_size_hint(
    num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int
) -> int:
    """Bytes of an EP buffer for these sizes (a property of the CUDA kernels; needs CUDA)."""
    _no_cuda("get_ep_buffer_size_hint")


def calculate_elastic_buffer_size(*args: Any, **kwargs: Any) -> int:
    """Bytes of an elastic EP buffer (a property of the CUDA kernels; needs CUDA)."""
    _no_cuda("calculate_elastic_buffer_size")
