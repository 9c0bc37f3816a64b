"""The module's surface as upstream documents it: names, members, argument
names and defaults, return values; the metadata servers (HTTP, etcd); the
CUDA forms without a CUDA driver; the handle a store accepts."""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from typing import Any

import mooncake.engine as me
import numpy as np
import pytest
from conftest import Peer, engine_lines, init_local
from helpers.etcd import running_etcd
from mooncake.engine import InnerTransferEngine, TransferEngine, TransferNotify, TransferOpcode

METHODS = {
    "initialize": "local_hostname, metadata_server, protocol, device_name",
    "initialize_ext": "local_hostname, metadata_server, protocol, device_name, metadata_type",
    "get_rpc_port": "",
    "get_engine": "",
    "get_engine_ptr": "",
    "allocate_managed_buffer": "length",
    "free_managed_buffer": "buffer_addr, length",
    "get_first_buffer_address": "segment_name",
    "transfer_sync_write": "target_hostname, buffer, peer_buffer_address, length, transport_hint=''",
    "transfer_sync_read": "target_hostname, buffer, peer_buffer_address, length, transport_hint=''",
    "transfer_sync": "target_hostname, buffer, peer_buffer_address, length, opcode, notify=None, "
    "transport_hint=''",
    "transfer_submit_write": "target_hostname, buffer, peer_buffer_address, length, "
    "transport_hint=''",
    "transfer_check_status": "batch_id",
    "transfer_write_on_cuda": "target_hostname, buffer, peer_buffer_address, length, "
    "stream_ptr=0, transport_hint=''",
    "transfer_read_on_cuda": "target_hostname, buffer, peer_buffer_address, length, "
    "stream_ptr=0, transport_hint=''",
    "batch_transfer_sync_write": "target_hostname, buffers, peer_buffer_addresses, lengths, "
    "transport_hint=''",
    "batch_transfer_sync_read": "target_hostname, buffers, peer_buffer_addresses, lengths, "
    "transport_hint=''",
    "batch_transfer_sync": "target_hostname, buffers, peer_buffer_addresses, lengths, opcode, "
    "notify=None, transport_hint=''",
    "batch_transfer_async_write": "target_hostname, buffers, peer_buffer_addresses, lengths, "
    "transport_hint=''",
    "batch_transfer_async_read": "target_hostname, buffers, peer_buffer_addresses, lengths, "
    "transport_hint=''",
    "batch_transfer_async": "target_hostname, buffers, peer_buffer_addresses, lengths, opcode, "
    "transport_hint=''",
    "get_batch_transfer_status": "batch_ids",
    "batch_transfer_write_on_cuda": "target_hostname, buffers, peer_buffer_addresses, lengths, "
    "stream_ptr=0, transport_hint=''",
    "batch_transfer_read_on_cuda": "target_hostname, buffers, peer_buffer_addresses, lengths, "
    "stream_ptr=0, transport_hint=''",
    "write_bytes_to_buffer": "dest_address, src_ptr, length",
    "read_bytes_from_buffer": "source_address, length",
    "register_memory": "buffer_addr, capacity, location='*'",
    "unregister_memory": "buffer_addr",
    "batch_register_memory": "buffer_addresses, capacities, location='*'",
    "batch_unregister_memory": "buffer_addresses",
    "get_local_topology": "device_name=None",
    "get_notifies": "",
    "send_probe": "peer_server_name",
    "warmup_efa_segment": "segment_name",
}


def test_module_names_members_and_flags() -> None:
    assert [m for m in ("Read", "Write") if hasattr(TransferOpcode, m)] == ["Read", "Write"]
    assert int(TransferOpcode.Read) == 0 and int(TransferOpcode.Write) == 1
    assert (
        TransferOpcode.Read == TransferOpcode.READ and TransferOpcode.Write == TransferOpcode.WRITE
    )
    assert me.Read == TransferOpcode.Read and me.Write == TransferOpcode.Write
    n = TransferNotify()
    assert (n.name, n.msg) == ("", "")
    n = TransferNotify("a", "b")
    assert (n.name, n.msg) == ("a", "b")
    n.name, n.msg = "c", "d"
    assert (n.name, n.msg) == ("c", "d")
    assert TransferNotify(name="x", msg="y").msg == "y"
    for flag in ("SUPPORT_CUDA", "SUPPORT_EFA", "SUPPORT_HIP", "SUPPORT_MNNVL", "SUPPORT_MUSA"):
        assert isinstance(getattr(me, flag), bool)
    assert me.SUPPORT_INTRA_NVLINK is False
    assert TransferEngine.__module__ == "mooncake.engine"


def test_every_documented_method_with_its_signature() -> None:
    for name, params in METHODS.items():
        sig = inspect.signature(getattr(TransferEngine, name))
        got = ", ".join(str(p) for p in list(sig.parameters.values())[1:])
        assert got == params, name


def test_initialize_forms_and_engine_handles(shared_master: Any) -> None:
    e = TransferEngine()
    assert e.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "tcp", "", "p2p") == 0
    assert 0 < e.get_rpc_port() < 65536
    inner = e.get_engine()
    assert isinstance(inner, InnerTransferEngine)
    assert e.get_engine_ptr() == e.get_engine_ptr() != 0
    name = f"127.0.0.1:{e.get_rpc_port()}"
    assert e.warmup_efa_segment(name) == 0
    assert e.send_probe(peer_server_name=name) == 0
    topo = json.loads(e.get_local_topology())
    assert topo and all(k.startswith("cpu:") and v == [[], []] for k, v in topo.items())
    assert json.loads(e.get_local_topology(device_name="mlx5_0")) == topo
    # The documented split of a metadata string without a scheme: the type
    # names it ("http" + "host:port/metadata").
    h = TransferEngine()
    url = shared_master.metadata_url.removeprefix("http://")
    assert (
        h.initialize_ext(
            local_hostname="127.0.0.1:40123",
            metadata_server=url,
            protocol="tcp",
            device_name="",
            metadata_type="http",
        )
        == 0
    )
    assert h.get_first_buffer_address("127.0.0.1:40123") == 0
    buf = np.zeros(4096, np.uint8)
    assert h.register_memory(buffer_addr=buf.ctypes.data, capacity=4096, location="cpu:0") == 0
    assert h.get_first_buffer_address(segment_name="127.0.0.1:40123") == buf.ctypes.data
    assert e.get_first_buffer_address(name) == 0


def test_managed_buffers_and_bytes() -> None:
    e = TransferEngine()
    init_local(e, "P2PHANDSHAKE")
    a = e.allocate_managed_buffer(length=1 << 20)
    assert a != 0
    assert e.write_bytes_to_buffer(a, b"hello", 5) == 0
    assert e.write_bytes_to_buffer(dest_address=a + 5, src_ptr="world", length=5) == 0
    assert e.read_bytes_from_buffer(a, 10) == b"helloworld"
    assert e.read_bytes_from_buffer(source_address=a + 5, length=5) == b"world"
    assert e.get_first_buffer_address(f"127.0.0.1:{e.get_rpc_port()}") == a
    assert e.unregister_memory(a) == -1  # a managed buffer is freed, not unregistered
    assert e.free_managed_buffer(a, 4096) == -1  # wrong length
    assert e.free_managed_buffer(buffer_addr=a, length=1 << 20) == 0
    assert e.allocate_managed_buffer(0) == 0


def test_cuda_forms_without_a_driver(engine_log: pytest.LogCaptureFixture) -> None:
    if me.SUPPORT_CUDA:
        pytest.skip("a CUDA driver is present")
    e = TransferEngine()
    init_local(e, "P2PHANDSHAKE")
    buf = np.zeros(4096, np.uint8)
    assert e.register_memory(buf.ctypes.data, 4096) == 0
    name = f"127.0.0.1:{e.get_rpc_port()}"
    engine_log.clear()
    calls = [
        ("transfer_write_on_cuda", (name, buf.ctypes.data, buf.ctypes.data, 16)),
        ("transfer_read_on_cuda", (name, buf.ctypes.data, buf.ctypes.data, 16, 0)),
        ("batch_transfer_write_on_cuda", (name, [buf.ctypes.data], [buf.ctypes.data], [16])),
        ("batch_transfer_read_on_cuda", (name, [buf.ctypes.data], [buf.ctypes.data], [16], 0, "")),
    ]
    for method, args in calls:
        with pytest.raises(RuntimeError, match="CUDA driver"):
            getattr(e, method)(*args)
        lines = engine_lines(engine_log)
        assert len(lines) == 1 and method in lines[0] and "CUDA" in lines[0]
        engine_log.clear()
    other = np.zeros(4096, np.uint8)
    assert e.register_memory(other.ctypes.data, 4096, "cuda:0") == -1
    assert "CUDA" in engine_lines(engine_log)[0]


def test_store_setup_engine_argument(shared_master: Any) -> None:
    from mooncake.store import MooncakeDistributedStore

    e = TransferEngine()
    s = MooncakeDistributedStore()
    args = ("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", shared_master.rpc_addr)
    assert s.setup(*args, e.get_engine()) == -600  # not initialized
    assert s.setup(*args, object()) == -600  # not an engine of ours
    init_local(e, "P2PHANDSHAKE")
    assert s.setup(*args, engine=e) == 0
    assert s.put("engine-arg", b"v") == 0
    assert s.get("engine-arg") == b"v"
    s.close()


# ---------------------------------------------------------------- etcd


@pytest.fixture
def etcd() -> Iterator[str]:
    with running_etcd() as addr:
        yield addr


def test_etcd_metadata(peers: Any, etcd: str) -> None:
    """Targets found through etcd, as ``etcd://host:port`` and as a bare
    ``host:port`` (which upstream reads as etcd)."""
    target: Peer = peers()
    tname = target.init(f"etcd://{etcd}", name="127.0.0.1:41001")
    remote = target.array(4096)
    e = TransferEngine()
    assert e.initialize("127.0.0.1:41002", etcd, "tcp", "") == 0
    buf = np.full(4096, 0x5A, np.uint8)
    assert e.register_memory(buf.ctypes.data, 4096) == 0
    assert e.transfer_sync_write(tname, buf.ctypes.data, remote, 4096) == 0
    assert target.read(remote, 4096) == b"\x5a" * 4096
    assert e.get_first_buffer_address(tname) == remote
    assert e.transfer_sync_write("127.0.0.1:49999", buf.ctypes.data, remote, 16) == -1
