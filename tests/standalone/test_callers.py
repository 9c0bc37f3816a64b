"""The standalone calls of real callers, reproduced line for line:

* SGLang's HiCache ``MooncakeStore`` with ``standalone_storage``: its host
  KV pool comes from ``MooncakeHostTensorAllocator`` (``MooncakeHostMemAllocator``
  + ``torch.frombuffer``), then ``setup_dummy(required_bytes, 16 MiB,
  client_server_address)``, the warmup (``put``/``is_exist``/``get``),
  ``register_buffer`` of the pool tensors, and the zero-copy batch calls;
* vLLM's ``MooncakeStoreConnector`` in ``standalone-store`` mode: each rank
  ``setup``s with ``global_segment_size=0`` and writes to the daemon's
  segment through ``ReplicateConfig.preferred_segment``, so the pool
  outlives the engine.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Daemon, MiB
from helpers.common import sglang_warmup

K = Callable[[str], str]
torch = pytest.importorskip("torch")

DEFAULT_LOCAL_BUFFER_SIZE = 16 * 1024 * 1024  # SGLang's


class MooncakeHostTensorAllocator:
    """SGLang's allocator, verbatim in behaviour."""

    def __init__(self) -> None:
        from mooncake.store import MooncakeHostMemAllocator

        self.allocator = MooncakeHostMemAllocator()
        self.ptr = None

    def allocate(self, dims: tuple[int, ...], dtype: Any, device: str = "cpu") -> Any:
        self.dims = dims
        self.dtype = dtype
        size = 1
        for d in dims:
            size *= d
        size *= torch.tensor([], dtype=self.dtype).element_size()
        ptr_int = self.allocator.alloc(size)
        self.ptr = ptr_int
        c_type = ctypes.c_byte * size
        c_array = c_type.from_address(ptr_int)
        tensor = torch.frombuffer(c_array, dtype=torch.uint8, count=size)
        if dtype != torch.uint8:
            element_size = torch.tensor([], dtype=dtype).element_size()
            assert size % element_size == 0, "Size must be divisible by element size"
            tensor = tensor.view(dtype)
        return tensor.view(dims)


def test_sglang_standalone_storage(daemon: Daemon, key: K) -> None:
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    # Host KV pool: layer-first MHA, 4 layers x 32 pages x (k, v) x 8 KiB.
    layers, pages, page_bytes = 4, 32, 8192
    kv = MooncakeHostTensorAllocator().allocate((2, layers, pages, page_bytes), torch.uint8)
    kv.copy_(torch.randint(0, 255, kv.shape, dtype=torch.uint8))
    required_bytes = kv.numel() * kv.element_size()

    store = MooncakeDistributedStore()
    ret_code = store.setup_dummy(
        required_bytes,
        DEFAULT_LOCAL_BUFFER_SIZE,  # Zero copy interface does not need local buffer
        daemon.address,
    )
    assert ret_code == 0

    # warmup()
    warmup_value = sglang_warmup(store)

    # register_mem_pool_host() -> register_buffer(ptr, numel * element_size)
    ptr = kv.data_ptr()
    size = kv.numel() * kv.element_size()
    assert store.register_buffer(ptr, size) == 0

    # batch_set_v1: page keys -> "{key}_{rank}_k"/"_v", one buffer per object
    # (layer 0 page i here), only the keys that do not exist yet.
    page_keys = [key(f"page{i}") for i in range(8)]
    key_strs, ptr_list, size_list = [], [], []
    for i, pk in enumerate(page_keys):
        for kind in (0, 1):
            key_strs.append(f"{pk}_0_{'kv'[kind]}")
            ptr_list.append(kv[kind, 0, i].data_ptr())
            size_list.append(page_bytes)
    exist_result = store.batch_is_exist(key_strs)
    assert exist_result == [0] * len(key_strs)
    put_results = store.batch_put_from(key_strs, ptr_list, size_list)
    assert put_results == [0] * len(key_strs)
    # With group semantics SGLang passes a config.
    config = ReplicateConfig()
    gk = [key("grouped")]
    assert store.batch_put_from(gk, [kv[0, 1, 0].data_ptr()], [page_bytes], config) == [0]
    assert store.batch_is_exist(key_strs + gk) == [1] * (len(key_strs) + 1)

    # batch_get_v1 into other pages (layer 1), then compare.
    get_ptrs = [kv[k % 2, 1, 8 + k // 2].data_ptr() for k in range(len(key_strs))]
    get_results = store.batch_get_into(key_strs, get_ptrs, size_list)
    assert get_results == [page_bytes] * len(key_strs)
    for i in range(8):
        assert torch.equal(kv[0, 1, 8 + i], kv[0, 0, i])
        assert torch.equal(kv[1, 1, 8 + i], kv[1, 0, i])

    # Layer-wise multi-buffer objects (one object per page, a buffer per layer).
    mk = [key(f"ml{i}") for i in range(4)]
    mptrs = [[kv[0, layer, 16 + i].data_ptr() for layer in range(layers)] for i in range(4)]
    msizes = [[page_bytes] * layers for _ in range(4)]
    assert store.batch_put_from_multi_buffers(mk, mptrs, msizes, ReplicateConfig()) == [0] * 4
    gptrs = [[kv[1, layer, 16 + i].data_ptr() for layer in range(layers)] for i in range(4)]
    got = store.batch_get_into_multi_buffers(mk, gptrs, msizes)
    assert got == [page_bytes * layers] * 4
    for i in range(4):
        for layer in range(layers):
            assert torch.equal(kv[1, layer, 16 + i], kv[0, layer, 16 + i])

    # The pool is shared memory: nothing was staged but the warmup's bytes.
    assert store.get_client_stats()["dummy_staged_bytes"] == 2 * len(warmup_value)
    # clear()
    assert store.remove_all() >= 0
    store.close()


def test_vllm_standalone_store_mode(daemon: Daemon, key: K) -> None:
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    m = daemon.master
    (owner_segment,) = m.segments()  # the daemon's: vLLM's preferred_segment
    n, block = 6, 64 * 1024
    kv = torch.randint(0, 255, (2, n, block), dtype=torch.uint8)
    keys = [key(f"blk{i}") for i in range(n)]

    def engine() -> Any:
        store = MooncakeDistributedStore()
        ret = store.setup(
            "127.0.0.1",
            m.metadata_url,
            0,  # standalone-store: the rank contributes no segment
            4 * MiB,
            "tcp",
            "",
            m.rpc_addr,
        )
        assert ret == 0
        return store

    store = engine()
    store_replicate_config = ReplicateConfig()
    store_replicate_config.preferred_segment = owner_segment
    addrs = [[kv[0, i].data_ptr(), kv[1, i].data_ptr()] for i in range(n)]
    sizes = [[block, block] for _ in range(n)]
    assert store.batch_is_exist(keys) == [0] * n
    assert store.batch_put_from_multi_buffers(keys, addrs, sizes, store_replicate_config) == [0] * n
    for k in keys:
        status, body = m.query_key(k)
        assert status == 200 and owner_segment in str(body), body
    # The engine restarts: a new process-level client finds its blocks.
    store.close()
    store = engine()
    out = torch.zeros_like(kv)
    oaddrs = [[out[0, i].data_ptr(), out[1, i].data_ptr()] for i in range(n)]
    res = store.batch_get_into_multi_buffers(keys, oaddrs, sizes)
    assert res == [2 * block] * n
    assert torch.equal(out, kv)
    store.close()
