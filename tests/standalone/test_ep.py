"""``mooncake.ep``: the ``mooncake.pg`` names SGLang's elastic EP imports from
it (the same objects), and upstream's CUDA-only EP classes, which exist and
raise a clear error without CUDA."""

from __future__ import annotations

import pytest
from helpers.pg_surface import UPSTREAM_PG_NAMES

torch = pytest.importorskip("torch")


def test_pg_names_are_reexported() -> None:
    from mooncake import ep, pg

    for name in UPSTREAM_PG_NAMES:
        assert getattr(ep, name) is getattr(pg, name), name
        assert name in ep.__all__


def test_sglang_elastic_ep_imports() -> None:
    # The lines SGLang runs (python/sglang/srt/distributed/parallel_state.py,
    # elastic EP): options for new groups, active-rank queries, recovery.
    from mooncake import ep
    from mooncake.ep import (  # noqa: F401
        MooncakeBackendOptions,
        get_active_ranks,
        get_peer_state,
        recover_ranks,
        set_device_filter,
        set_host_ip,
    )

    active_ranks_cpu = torch.ones(4, dtype=torch.int32)
    opts = MooncakeBackendOptions(active_ranks_cpu, False)
    assert opts.is_extension is False
    assert ep.MAX_QP_COUNT == 256


@pytest.mark.parametrize(
    "make",
    [
        lambda ep: ep.Buffer(0, 2, 1 << 20),
        lambda ep: ep.Buffer(rank=0, num_ranks=2, num_ep_buffer_bytes=1 << 20, disable_p2p=True),
        lambda ep: ep.ElasticBuffer(
            0, 2, 1 << 20, 128, 4096, 8, False, False, False, False, False, 0, 1, 100, 100
        ),
        lambda ep: ep.EventHandle(),
        lambda ep: ep.get_ep_buffer_size_hint(128, 4096, 8, 64),
        lambda ep: ep.calculate_elastic_buffer_size(8, 128, 4096, 8),
        lambda ep: ep.ElasticBuffer.calculate_buffer_size(8, 128, 4096, 8),
    ],
)
def test_cuda_only_names_raise_clearly(make: object) -> None:
    from mooncake import ep

    with pytest.raises(RuntimeError, match="needs CUDA.*no CUDA support"):
        make(ep)  # type: ignore[operator]
