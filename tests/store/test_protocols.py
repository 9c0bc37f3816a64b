"""``setup`` at the protocols and metadata servers real callers pass.

Every protocol name upstream's store knows runs here: ``tcp`` as asked,
a device protocol (``rdma``, ``efa``, ``barex``, ...) over TCP with one
warning naming the protocol asked for and the one used (none with
``MC_FORCE_TCP=1``); a name upstream does not know is refused with
upstream's code (-1, or -600 when ``local_hostname`` names a port). The
metadata server may be ``P2PHANDSHAKE``, ``http://``, ``etcd://`` or a bare
``host:port`` (etcd), where the segment's record is published and removed on
close; any other scheme is refused.

SGLang's HiCache backend and vLLM's store connector are reproduced at their
default configuration (protocol ``rdma``, no device named), with only the
segment sizes made small for this machine.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    LOCAL_BUFFER_SIZE,
    SEGMENT_SIZE,
    Master,
    StoreFactory,
    free_port,
    store_records,
)
from helpers.common import sglang_warmup
from helpers.etcd import etcd_get, running_etcd

MiB = 1 << 20
K = Callable[[str], str]


@pytest.fixture
def store_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="mooncake.store")
    return caplog


@pytest.fixture(autouse=True)
def _no_forced_tcp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)


def fallback_warnings(log: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in store_records(log)
        if r.levelno == logging.WARNING and 'using "tcp"' in r.getMessage()
    ]


def setup_form(store: Any, form: str, m: Master, protocol: str, host: str = "127.0.0.1") -> int:
    """``setup`` in one of its three call forms."""
    if form == "positional":
        return int(
            store.setup(
                host, m.metadata_url, SEGMENT_SIZE, LOCAL_BUFFER_SIZE, protocol, "", m.rpc_addr
            )
        )
    if form == "keyword":
        return int(
            store.setup(
                local_hostname=host,
                metadata_server=m.metadata_url,
                global_segment_size=SEGMENT_SIZE,
                local_buffer_size=LOCAL_BUFFER_SIZE,
                protocol=protocol,
                rdma_devices="",
                master_server_addr=m.rpc_addr,
            )
        )
    return int(
        store.setup(
            {
                "local_hostname": host,
                "metadata_server": m.metadata_url,
                "global_segment_size": str(SEGMENT_SIZE),
                "local_buffer_size": str(LOCAL_BUFFER_SIZE),
                "protocol": protocol,
                "master_server_addr": m.rpc_addr,
            }
        )
    )


FORMS = ["positional", "keyword", "dict"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("protocol", ["rdma", "efa", "barex"])
def test_device_protocol_runs_over_tcp(
    store_factory: StoreFactory,
    shared_master: Master,
    store_log: pytest.LogCaptureFixture,
    key: K,
    form: str,
    protocol: str,
) -> None:
    s = store_factory.raw()
    assert setup_form(s, form, shared_master, protocol) == 0
    warned = fallback_warnings(store_log)
    assert len(warned) == 1, warned
    assert f"protocol {protocol!r}".replace("'", '"') in warned[0], warned[0]
    k = key("v")
    assert s.put(k, b"over tcp") == 0
    assert s.get(k) == b"over tcp"
    assert s.get_hostname() in shared_master.segments()


def test_forced_tcp_says_nothing(
    store_factory: StoreFactory,
    shared_master: Master,
    store_log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    key: K,
) -> None:
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    s = store_factory.raw()
    assert setup_form(s, "positional", shared_master, "rdma") == 0
    assert fallback_warnings(store_log) == []
    assert s.put(key("f"), b"x") == 0


def test_tcp_says_nothing(
    store_factory: StoreFactory, shared_master: Master, store_log: pytest.LogCaptureFixture
) -> None:
    s = store_factory.raw()
    assert setup_form(s, "positional", shared_master, "tcp") == 0
    assert fallback_warnings(store_log) == []


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("protocol", ["udp", "RDMA", ""])
def test_unknown_protocol_is_refused_with_upstreams_code(
    store_factory: StoreFactory,
    shared_master: Master,
    store_log: pytest.LogCaptureFixture,
    form: str,
    protocol: str,
) -> None:
    s = store_factory.raw()
    assert setup_form(s, form, shared_master, protocol) == -1
    assert s.health_check() == 1
    named = [
        r.getMessage() for r in store_records(store_log) if "is not a transport" in r.getMessage()
    ]
    assert named and repr(protocol).replace("'", '"') in named[0], named
    # With a port in local_hostname upstream's setup fails with INVALID_PARAMS.
    assert setup_form(s, form, shared_master, protocol, host="127.0.0.1:17011") == -600
    assert s.health_check() == 1
    # Nothing was mounted by the refused calls.
    assert not any(seg.startswith("127.0.0.1:17011") for seg in shared_master.segments())


def _setup_with_metadata(s: Any, m: Master, metadata: str) -> int:
    return int(
        s.setup("127.0.0.1", metadata, SEGMENT_SIZE, LOCAL_BUFFER_SIZE, "tcp", "", m.rpc_addr)
    )


@pytest.fixture(scope="module")
def etcd() -> Iterator[str]:
    with running_etcd() as addr:
        yield addr


@pytest.mark.parametrize("form", ["etcd://{}", "{}"], ids=["etcd-scheme", "bare-host-port"])
def test_etcd_metadata_server_publishes_the_segment(
    store_factory: StoreFactory, shared_master: Master, etcd: str, key: K, form: str
) -> None:
    s = store_factory.raw()
    assert _setup_with_metadata(s, shared_master, form.format(etcd)) == 0
    name = s.get_hostname()
    record = etcd_get(etcd, f"mooncake/ram/{name}")
    assert record is not None
    desc = json.loads(record)
    assert desc["name"] == name and desc["protocol"] == "tcp" and desc["size"] == SEGMENT_SIZE
    k = key("e")
    assert s.put(k, b"etcd") == 0 and s.get(k) == b"etcd"
    assert s.close() == 0
    assert etcd_get(etcd, f"mooncake/ram/{name}") is None


def test_http_and_p2p_metadata_servers(
    store_factory: StoreFactory, shared_master: Master, key: K
) -> None:
    for metadata in (shared_master.metadata_url, "P2PHANDSHAKE"):
        s = store_factory.raw()
        assert _setup_with_metadata(s, shared_master, metadata) == 0, metadata
        k = key("m")
        assert s.put(k, b"m") == 0 and s.get(k) == b"m"
        s.close()


def test_unreachable_etcd_fails_setup(store_factory: StoreFactory, shared_master: Master) -> None:
    s = store_factory.raw()
    assert _setup_with_metadata(s, shared_master, f"etcd://127.0.0.1:{free_port()}") == -1
    assert s.health_check() == 1


@pytest.mark.parametrize("metadata", ["redis://127.0.0.1:6379", "consul://127.0.0.1:8500"])
def test_unknown_metadata_backend_is_refused(
    store_factory: StoreFactory,
    shared_master: Master,
    store_log: pytest.LogCaptureFixture,
    metadata: str,
) -> None:
    s = store_factory.raw()
    assert _setup_with_metadata(s, shared_master, metadata) == -1
    scheme = metadata.split("://")[0]
    assert any(f'"{scheme}" backend' in r.getMessage() for r in store_records(store_log)), [
        r.getMessage() for r in store_records(store_log)
    ]
    assert s.health_check() == 1


# ------------------------------------------------------------------ real callers


def test_sglang_hicache_default_configuration(
    store_factory: StoreFactory, shared_master: Master, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's ``MooncakeStore.__init__`` with ``load_from_env`` defaults:
    ``MOONCAKE_PROTOCOL`` unset (``rdma``), ``MOONCAKE_DEVICE`` unset (``""``),
    ``MOONCAKE_TE_META_DATA_SERVER`` unset (``P2PHANDSHAKE``),
    ``MOONCAKE_LOCAL_HOSTNAME`` unset (``localhost``); only the master is
    named, and the segment made small."""
    env = {
        "MOONCAKE_MASTER": shared_master.rpc_addr,
        "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(32 * MiB),
    }
    local_hostname = "localhost"
    metadata_server = "P2PHANDSHAKE"
    protocol = "rdma"
    device_name = ""
    per_rank_global_segment_size = int(env["MOONCAKE_GLOBAL_SEGMENT_SIZE"]) // 1
    default_local_buffer_size = 16 * 1024 * 1024

    store = store_factory.raw()
    ret_code = store.setup(
        local_hostname,
        metadata_server,
        per_rank_global_segment_size,
        default_local_buffer_size,  # Zero copy interface does not need local buffer
        protocol,
        device_name,
        env["MOONCAKE_MASTER"],
        None,
    )
    assert ret_code == 0
    # warmup()
    sglang_warmup(store)


def test_vllm_store_connector_default_configuration(
    store_factory: StoreFactory, shared_master: Master, tmp_path: Path, key: K
) -> None:
    """vLLM's ``MooncakeStoreWorker.__init__``: ``MooncakeStoreConfig.from_file``
    of a config that sets no protocol (``rdma``) and no device (``""``), in
    embedded mode, then the KV blocks written and read back through
    ``batch_put_from_multi_buffers`` / ``batch_get_into_multi_buffers``."""
    torch = pytest.importorskip("torch")
    cfg_path = tmp_path / "mooncake.json"
    cfg_path.write_text(
        json.dumps(
            {
                "metadata_server": "P2PHANDSHAKE",
                "master_server_address": shared_master.rpc_addr,
                "global_segment_size": 32 * MiB,
                "local_buffer_size": 16 * MiB,
            }
        )
    )
    config = json.loads(cfg_path.read_text())
    protocol = config.get("protocol", "rdma")
    device_name = config.get("device_name", "")

    store = store_factory.raw()
    ret = store.setup(
        "127.0.0.1",
        config.get("metadata_server", ""),
        config["global_segment_size"],
        config["local_buffer_size"],
        protocol,
        device_name,
        config.get("master_server_address", ""),
    )
    assert ret == 0

    n, block = 4, 64 * 1024
    kv = torch.randint(0, 255, (2, n, block), dtype=torch.uint8)
    assert store.register_buffer(kv.data_ptr(), kv.numel()) == 0
    keys = [key(f"blk{i}") for i in range(n)]
    addrs = [[kv[0, i].data_ptr(), kv[1, i].data_ptr()] for i in range(n)]
    sizes = [[block, block] for _ in range(n)]
    assert store.batch_put_from_multi_buffers(keys, addrs, sizes) == [0] * n
    out = torch.zeros_like(kv)
    assert store.register_buffer(out.data_ptr(), out.numel()) == 0
    oaddrs = [[out[0, i].data_ptr(), out[1, i].data_ptr()] for i in range(n)]
    assert store.batch_get_into_multi_buffers(keys, oaddrs, sizes) == [2 * block] * n
    assert torch.equal(out, kv)


@pytest.mark.parametrize("env_protocol", ["rdma", "RDMA", None])
def test_mooncake_config_env_form(
    store_factory: StoreFactory,
    shared_master: Master,
    monkeypatch: pytest.MonkeyPatch,
    key: K,
    env_protocol: str | None,
) -> None:
    """``MooncakeConfig.load_from_env()`` then ``setup(*args, **kwargs)``, as
    the store service and config-driven callers do."""
    from mooncake.mooncake_config import MooncakeConfig

    monkeypatch.delenv("MOONCAKE_CONFIG_PATH", raising=False)
    monkeypatch.setenv("MOONCAKE_MASTER", shared_master.rpc_addr)
    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "32MB")
    monkeypatch.setenv("MOONCAKE_LOCAL_BUFFER_SIZE", "16MB")
    if env_protocol is None:
        monkeypatch.delenv("MOONCAKE_PROTOCOL", raising=False)
    else:
        monkeypatch.setenv("MOONCAKE_PROTOCOL", env_protocol)
    cfg = MooncakeConfig.load_from_env()
    s = store_factory.raw()
    assert s.setup(*cfg.setup_args(), **cfg.setup_kwargs()) == 0
    k = key("c")
    assert s.put(k, b"cfg") == 0 and s.get(k) == b"cfg"
