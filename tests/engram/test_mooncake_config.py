"""MooncakeConfig: JSON file, environment variables, size parsing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers.common import write_config
from mooncake.mooncake_config import (
    DEFAULT_GLOBAL_SEGMENT_SIZE,
    DEFAULT_LOCAL_BUFFER_SIZE,
    MooncakeConfig,
    parse_size,
)

ENV = (
    "MOONCAKE_CONFIG_PATH",
    "MOONCAKE_MASTER",
    "MOONCAKE_LOCAL_HOSTNAME",
    "MOONCAKE_TE_META_DATA_SERVER",
    "MOONCAKE_GLOBAL_SEGMENT_SIZE",
    "MOONCAKE_LOCAL_BUFFER_SIZE",
    "MOONCAKE_PROTOCOL",
    "MOONCAKE_DEVICE",
    "MOONCAKE_OFFLOAD_ENABLED",
    "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
    "MOONCAKE_TENANT_ID",
    "MOONCAKE_ENABLE_CLIENT_HTTP_SERVER",
    "MOONCAKE_CLIENT_HTTP_PORT",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ENV:
        monkeypatch.delenv(k, raising=False)


def test_load_from_file(tmp_path: Path) -> None:
    p = write_config(
        tmp_path / "c.json",
        "h1",
        "http://m:8080/metadata",
        "m:50051",
        global_segment_size="4GB",
        local_buffer_size=1024,
        protocol="tcp",
        device_name="",
    )
    c = MooncakeConfig.load_from_file(p)
    assert c.local_hostname == "h1"
    assert c.global_segment_size == 4 << 30
    assert c.local_buffer_size == 1024
    assert c.setup_args()[-1] == "m:50051"
    assert MooncakeConfig.from_file(str(p)) == c


def test_file_defaults_and_missing(tmp_path: Path) -> None:
    p = write_config(tmp_path / "c.json", "h", "P2PHANDSHAKE", "m:1")
    c = MooncakeConfig.load_from_file(p)
    assert c.global_segment_size == DEFAULT_GLOBAL_SEGMENT_SIZE
    assert c.local_buffer_size == DEFAULT_LOCAL_BUFFER_SIZE
    assert (c.protocol, c.device_name) == ("tcp", "")
    write_config(p, "h", "x", None)
    with pytest.raises(ValueError, match="master_server_address"):
        MooncakeConfig.load_from_file(p)


def test_load_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="MOONCAKE_MASTER"):
        MooncakeConfig.load_from_env()
    monkeypatch.setenv("MOONCAKE_MASTER", "10.0.0.1:50051")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "512MB")
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "tcp")
    c = MooncakeConfig.load_from_env()
    assert c.master_server_address == "10.0.0.1:50051"
    assert c.global_segment_size == 512 << 20
    assert c.local_hostname == "localhost"
    assert c.metadata_server == "P2PHANDSHAKE"
    p = write_config(tmp_path / "c.json", "f", "P2PHANDSHAKE", "file:1")
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(p))
    assert MooncakeConfig.load_from_env().master_server_address == "file:1"


def test_extra_setup_fields_from_env_and_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MOONCAKE_MASTER", "m:1")
    c = MooncakeConfig.load_from_env()
    assert c.setup_kwargs() == {
        "enable_ssd_offload": False,
        "ssd_offload_path": "",
        "tenant_id": "default",
        "enable_client_http_server": False,
        "client_http_port": 9300,
    }
    monkeypatch.setenv("MOONCAKE_OFFLOAD_ENABLED", "on")
    monkeypatch.setenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "/nvme/x")
    monkeypatch.setenv("MOONCAKE_TENANT_ID", "t1")
    monkeypatch.setenv("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "1")
    monkeypatch.setenv("MOONCAKE_CLIENT_HTTP_PORT", "9400")
    c = MooncakeConfig.load_from_env()
    assert (c.enable_ssd_offload, c.ssd_offload_path, c.tenant_id) == (True, "/nvme/x", "t1")
    assert (c.enable_client_http_server, c.client_http_port) == (True, 9400)
    monkeypatch.setenv("MOONCAKE_OFFLOAD_ENABLED", "maybe")
    with pytest.raises(ValueError, match="maybe"):
        MooncakeConfig.load_from_env()
    p = write_config(
        tmp_path / "c.json",
        "h",
        "P2PHANDSHAKE",
        "m:1",
        enable_ssd_offload="false",
        ssd_offload_path=None,
        tenant_id=None,
        client_http_port="9500",
    )
    c = MooncakeConfig.load_from_file(p)
    assert (c.enable_ssd_offload, c.ssd_offload_path, c.tenant_id) == (False, "", "default")
    assert c.client_http_port == 9500


@pytest.mark.parametrize("protocol", ["RDMA", " Tcp ", "EFA"])
def test_protocol_is_lowercased(protocol: str) -> None:
    c = MooncakeConfig("h", "P2PHANDSHAKE", 0, 0, protocol, "", "m:1")
    assert c.protocol == protocol.strip().lower()
    assert c.setup_args()[4] == c.protocol


def test_unknown_protocol_is_warned_and_kept(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="mooncake.mooncake_config")
    c = MooncakeConfig("h", "P2PHANDSHAKE", 0, 0, "Carrier-Pigeon", "", "m:1")
    assert c.protocol == "carrier-pigeon"
    assert any("carrier-pigeon" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("protocol", "", "Invalid protocol"),
        ("protocol", None, "Invalid protocol"),
        ("global_segment_size", -1, "global_segment_size"),
        ("local_buffer_size", -5, "local_buffer_size"),
        ("local_hostname", " ", "local_hostname"),
        ("metadata_server", "", "metadata_server"),
        ("master_server_address", "", "master_server_address"),
    ],
)
def test_invalid_fields_are_refused(field: str, value: object, message: str) -> None:
    args: dict[str, object] = {
        "local_hostname": "h",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": 0,
        "local_buffer_size": 0,
        "protocol": "tcp",
        "device_name": "",
        "master_server_address": "m:1",
    }
    args[field] = value
    with pytest.raises(ValueError, match=message):
        MooncakeConfig(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1024, 1024),
        ("1024", 1024),
        ("1.5GB", 3 << 29),
        ("2 MiB", 2 << 20),
        ("3k", 3072),
        ("4 GB", 4 << 30),
        ("512MiB", 512 << 20),
        ("1TiB", 1 << 40),
        ("infinite", (1 << 64) - 1),
    ],
)
def test_parse_size(value: object, expected: int) -> None:
    assert parse_size(value) == expected


@pytest.mark.parametrize("value", [-1, "abc", "1XB", 1.5, "-1M", "1e3", "1.2.3K", ""])
def test_parse_size_invalid(value: object) -> None:
    with pytest.raises(ValueError):
        parse_size(value)


@pytest.mark.parametrize("value", [True, None, [1]])
def test_parse_size_wrong_type(value: object) -> None:
    with pytest.raises(TypeError):
        parse_size(value)


def test_one_size_parser_for_config_benchmarks_and_the_native_side() -> None:
    from mooncake import _native
    from mooncake.pg.bench import parse_size as bench_parse_size

    for text in ("8", "64K", "1M", "2 MiB", "1.5g"):
        assert parse_size(text) == _native.parse_size(text) == bench_parse_size(text)
    with pytest.raises(ValueError, match="invalid size"):
        _native.parse_size("12 parsecs")
