"""Client lifecycle: setup variants, hostname, health_check, close."""

from __future__ import annotations

import ctypes
import re
import subprocess
import textwrap
from typing import Any
from urllib.parse import quote

import pytest
from conftest import (
    LOCAL_BUFFER_SIZE,
    SEGMENT_SIZE,
    Master,
    StoreFactory,
    free_port,
    http_request,
    run_script,
    setup_positional,
    wait_until,
)

MiB = 1 << 20


def _dict_cfg(m: Master, **kw: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "local_hostname": "127.0.0.1",
        "metadata_server": m.metadata_url,
        "protocol": "tcp",
        "master_server_addr": m.rpc_addr,
    }
    cfg.update(kw)
    return cfg


def test_setup_hostname_in_client_port_range(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master, global_segment_size=16 * MiB, local_buffer_size=16 * MiB)
    host = s.get_hostname()
    mt = re.fullmatch(r"127\.0\.0\.1:(\d+)", host)
    assert mt, host
    assert 12300 <= int(mt.group(1)) <= 14300
    assert host in master.segments()


def test_setup_by_keyword(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory.raw()
    rc = s.setup(
        local_hostname="127.0.0.1",
        metadata_server=master.metadata_url,
        global_segment_size=SEGMENT_SIZE,
        local_buffer_size=LOCAL_BUFFER_SIZE,
        protocol="tcp",
        rdma_devices="",
        master_server_addr=master.rpc_addr,
    )
    assert rc == 0
    assert s.put("kw", b"x") == 0
    assert s.get("kw") == b"x"


def test_setup_publishes_and_unpublishes_metadata(
    store_factory: StoreFactory, master: Master
) -> None:
    s = store_factory(master)
    seg = s.get_hostname()
    # Clients send the key URL-encoded (upstream's server stores it verbatim).
    url = f"{master.metadata_url}?key={quote('mooncake/ram/' + seg, safe='')}"
    status, body, _ = http_request(url)
    assert status == 200
    assert len(body) > 0
    assert s.close() == 0
    status, _, _ = http_request(url)
    assert status == 404


def test_dict_setup_missing_metadata_server(store_factory: StoreFactory) -> None:
    s = store_factory.raw()
    assert s.setup({"local_hostname": "127.0.0.1"}) == -600


def test_dict_setup_human_sizes(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory.raw()
    cfg = _dict_cfg(master, global_segment_size="16 MB", local_buffer_size="16MB")
    assert s.setup(cfg) == 0
    assert s.put("dict", b"abc") == 0
    assert s.get("dict") == b"abc"


def test_dict_setup_non_string_values_are_converted(
    store_factory: StoreFactory, master: Master
) -> None:
    s = store_factory.raw()
    cfg = _dict_cfg(master, global_segment_size=16 * MiB, local_buffer_size=16 * MiB)
    assert s.setup(cfg) == 0


def test_dict_setup_percent_size_rejected(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory.raw()
    assert s.setup(_dict_cfg(master, global_segment_size="50%")) != 0


def test_segment_size_too_small(store_factory: StoreFactory, master: Master) -> None:
    store_factory(master, global_segment_size=100, expect_rc=-600)


@pytest.mark.ours
def test_segment_size_above_mappable_rejected(
    store_factory: StoreFactory, master: Master, caplog: pytest.LogCaptureFixture
) -> None:
    """A segment above 2^47 bytes (more than a client can map) is INVALID_PARAMS
    from the client's own config check, with the reason logged; the master
    never sees a mount and the store stays usable for a proper setup."""
    import logging

    s = store_factory.raw()
    with caplog.at_level(logging.INFO, logger="mooncake.store"):
        rc = setup_positional(s, master, (1 << 47) + 1)
    assert rc == -600
    recs = [r for r in caplog.records if r.name == "mooncake.store"]
    assert any(
        r.levelno == logging.WARNING
        and "setup" in r.getMessage()
        and "global_segment_size" in r.getMessage()
        and str(1 << 47) in r.getMessage()
        for r in recs
    ), [r.getMessage() for r in recs]
    assert master.segments() == []
    assert s.get_hostname() == ""


@pytest.mark.ours
def test_local_buffer_size_too_small(store_factory: StoreFactory, master: Master) -> None:
    store_factory(master, local_buffer_size=100, expect_rc=-600)


def test_pure_client_segment_zero(store_factory: StoreFactory, master: Master) -> None:
    owner = store_factory(master)
    reader = store_factory(master, global_segment_size=0)
    assert master.segments() == [owner.get_hostname()]
    assert reader.put("pc", b"from-pure-client") == 0
    assert reader.get("pc") == b"from-pure-client"
    assert owner.get("pc") == b"from-pure-client"


def test_same_explicit_hostname_twice(store_factory: StoreFactory, master: Master) -> None:
    port = free_port()
    store_factory(master, local_hostname=f"127.0.0.1:{port}")
    store_factory(master, local_hostname=f"127.0.0.1:{port}", expect_rc=-600)


def test_explicit_hostname_used_as_is(store_factory: StoreFactory, master: Master) -> None:
    port = free_port()
    s = store_factory(master, local_hostname=f"127.0.0.1:{port}")
    assert s.get_hostname() == f"127.0.0.1:{port}"
    assert f"127.0.0.1:{port}" in master.segments()


def test_health_check_lifecycle(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory.raw()
    assert s.health_check() == 1
    s2 = store_factory(master)
    assert s2.health_check() == 0
    assert s2.close() == 0
    assert s2.health_check() == 1


def test_health_check_reports_dead_master(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    assert s.health_check() == 0
    master.kill()
    # The bound is the behaviour under test (a dead master is reported
    # within the 3 s the health check promises), so it is real time.
    assert wait_until(lambda: s.health_check() == 2, 3.0), s.health_check()


def test_close_idempotent_and_never_set_up(store_factory: StoreFactory, master: Master) -> None:
    assert store_factory.raw().close() == 0
    s = store_factory(master)
    assert s.close() == 0
    assert s.close() == 0


def test_close_unmounts_segment(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    seg = s.get_hostname()
    assert seg in master.segments()
    assert s.close() == 0
    assert seg not in master.segments()


def test_capsule(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    cap = s._get_pyclient_capsule()
    assert type(cap).__name__ == "PyCapsule"
    is_valid = ctypes.pythonapi.PyCapsule_IsValid
    is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    is_valid.restype = ctypes.c_int
    assert is_valid(cap, b"mooncake.PyClient.shared_ptr") == 1


def test_capsule_none_when_not_set_up(store_factory: StoreFactory) -> None:
    assert store_factory.raw()._get_pyclient_capsule() is None


@pytest.mark.ours
def test_setup_twice_closes_previous(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory(master)
    first = s.get_hostname()
    assert s.put("old", b"1") == 0
    rc = setup_positional(s, master)
    assert rc == 0
    assert wait_until(lambda: first not in master.segments(), 3.0)
    assert s.get_hostname() in master.segments()
    assert s.get("old") == b""
    assert s.put("new", b"2") == 0
    assert s.get("new") == b"2"


@pytest.mark.ours
def test_engine_argument_rejected(store_factory: StoreFactory, master: Master) -> None:
    s = store_factory.raw()
    rc = setup_positional(s, master, engine=object())
    assert rc == -600


@pytest.mark.ours
@pytest.mark.parametrize(("tenant", "rc"), [("other", 0), ("", 0), ("_other", -600)])
def test_tenant_id_is_checked_at_setup(
    store_factory: StoreFactory, master: Master, tenant: str, rc: int
) -> None:
    s = store_factory.raw()
    assert setup_positional(s, master, tenant_id=tenant) == rc


# ---------------------------------------------------------------- child-process setups

_SETUP_SNIPPET = textwrap.dedent(
    """
    import sys, time, json
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    t0 = time.monotonic()
    rc = s.setup(sys.argv[1], sys.argv[2], 16 << 20, 16 << 20, sys.argv[3], "", sys.argv[4])
    dt = time.monotonic() - t0
    host = s.get_hostname() if rc == 0 else ""
    print(json.dumps({"rc": rc, "dt": dt, "host": host}), flush=True)
    s.close()
    """
)


def _setup_in_child(
    host: str, meta: str, proto: str, rpc: str, timeout: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    import json

    try:
        r = run_script(["-c", _SETUP_SNIPPET, host, meta, proto, rpc], timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"setup did not return within {timeout}s")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"rc={r.returncode} stderr={r.stderr[-2000:]}"
    return json.loads(lines[-1])


@pytest.mark.ours
@pytest.mark.slow
def test_master_not_running_fails_fast() -> None:
    dead = free_port()
    out = _setup_in_child("127.0.0.1", "P2PHANDSHAKE", "tcp", f"127.0.0.1:{dead}", timeout=20.0)
    assert out["rc"] != 0
    assert out["dt"] < 10.0


@pytest.mark.ours
def test_master_connect_timeout_env() -> None:
    dead = free_port()
    out = _setup_in_child(
        "127.0.0.1",
        "P2PHANDSHAKE",
        "tcp",
        f"127.0.0.1:{dead}",
        timeout=20.0,
        env={"MC_MASTER_CONNECT_TIMEOUT_MS": "500"},
    )
    assert out["rc"] == -1
    assert out["dt"] < 4.0


def test_p2p_handshake_metadata(master: Master) -> None:
    out = _setup_in_child("127.0.0.1", "P2PHANDSHAKE", "tcp", master.rpc_addr, timeout=60.0)
    assert out["rc"] == 0


def test_rdma_protocol_runs_over_tcp(master: Master) -> None:
    out = _setup_in_child("127.0.0.1", master.metadata_url, "rdma", master.rpc_addr, timeout=30.0)
    assert out["rc"] == 0


def test_unknown_protocol_rejected(master: Master) -> None:
    out = _setup_in_child("127.0.0.1", master.metadata_url, "udp", master.rpc_addr, timeout=30.0)
    assert out["rc"] == -1


@pytest.mark.ours
def test_force_tcp_env_accepts_any_protocol(master: Master) -> None:
    out = _setup_in_child(
        "127.0.0.1",
        master.metadata_url,
        "rdma",
        master.rpc_addr,
        timeout=30.0,
        env={"MC_FORCE_TCP": "1"},
    )
    assert out["rc"] == 0


def test_client_port_range_env(master: Master) -> None:
    port = 13000 + free_port() % 1000
    out = _setup_in_child(
        "127.0.0.1",
        master.metadata_url,
        "tcp",
        master.rpc_addr,
        timeout=30.0,
        env={"MC_STORE_CLIENT_MIN_PORT": str(port), "MC_STORE_CLIENT_MAX_PORT": str(port)},
    )
    assert out["rc"] == 0
    assert out["host"] == f"127.0.0.1:{port}"


def test_unreachable_metadata_server(master: Master) -> None:
    dead = free_port()
    out = _setup_in_child(
        "127.0.0.1", f"http://127.0.0.1:{dead}/metadata", "tcp", master.rpc_addr, timeout=30.0
    )
    assert out["rc"] == -1
