"""Client settings for ``MooncakeDistributedStore.setup``, read from a JSON
file (``MOONCAKE_CONFIG_PATH``) or from ``MOONCAKE_*`` environment variables.

JSON file keys are the field names. Environment variables (used when
``MOONCAKE_CONFIG_PATH`` is unset; ``MOONCAKE_MASTER`` is then required)::

    MOONCAKE_MASTER                     master_server_address (host:port)
    MOONCAKE_LOCAL_HOSTNAME             local_hostname         (default "localhost")
    MOONCAKE_TE_META_DATA_SERVER        metadata_server        (default "P2PHANDSHAKE")
    MOONCAKE_GLOBAL_SEGMENT_SIZE        global_segment_size    (default 3.125 GiB)
    MOONCAKE_LOCAL_BUFFER_SIZE          local_buffer_size      (default 1 GiB)
    MOONCAKE_PROTOCOL                   protocol               (default "tcp")
    MOONCAKE_DEVICE                     device_name            (default "")
    MOONCAKE_OFFLOAD_ENABLED            enable_ssd_offload     (default false)
    MOONCAKE_OFFLOAD_FILE_STORAGE_PATH  ssd_offload_path       (default "")
    MOONCAKE_TENANT_ID                  tenant_id              (default "default")
    MOONCAKE_ENABLE_CLIENT_HTTP_SERVER  enable_client_http_server (default false)
    MOONCAKE_CLIENT_HTTP_PORT           client_http_port       (default 9300)

Sizes accept integers or strings with a unit suffix (``"4GB"``, ``"512 MiB"``,
``"1.5g"``); units are powers of 1024. Booleans accept ``true/false``,
``1/0``, ``yes/no``, ``on/off``, ``enable/disable``.

Every instance is checked when it is made: the protocol must be a non-empty
string and is lowercased (``"RDMA"`` -> ``"rdma"``); a name outside the
known transports is logged as a warning and passed on (``setup`` refuses
what the store does not know); sizes must be non-negative; the hostname,
metadata server and master address must be non-empty.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from typing import Any

from mooncake import _native

logger = logging.getLogger(__name__)

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824  # 1 GiB

_REQUIRED = ("local_hostname", "metadata_server", "master_server_address")

# Transport names Mooncake's engine and store know: a hint for the warning
# on an unknown name, not a gate (``setup`` decides).
KNOWN_PROTOCOLS = frozenset(
    {
        "tcp",
        "rdma",
        "efa",
        "cxi",
        "nvmeof",
        "nvlink",
        "musa",
        "nvlink_intra",
        "hip",
        "barex",
        "cxl",
        "ascend",
        "ub",
        "ubshmem",
        "maca",
        "sunrise_link",
        "rpc_only",
    }
)

_TRUE = ("true", "1", "yes", "on", "enable")
_FALSE = ("false", "0", "no", "off", "disable")


def parse_bool(value: Any) -> bool:
    """A config boolean from a bool, a number, None (False) or a string.

    Raises ``ValueError`` for a string that is not a known spelling (so
    ``"false"`` is never taken as True).
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if value is None:
        return False
    text = str(value).strip().lower()
    if not text or text in _FALSE:
        return False
    if text in _TRUE:
        return True
    raise ValueError(f"Invalid boolean value: {value!r}")


def parse_size(value: Any) -> int:
    """Bytes from an int or a size string such as ``"4GB"`` or ``"512 MiB"``
    (the project's one size parser: ``mooncake._native.parse_size``).

    Raises ``ValueError`` for negative or malformed values and ``TypeError``
    for values that are neither numbers nor strings.
    """
    if isinstance(value, bool):
        raise TypeError(f"invalid size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"invalid size: {value!r}")
        return value
    if isinstance(value, float):
        if value < 0 or not value.is_integer():
            raise ValueError(f"invalid size: {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise TypeError(f"invalid size: {value!r}")
    return _native.parse_size(value)


@dataclass
class MooncakeConfig:
    """Arguments of ``MooncakeDistributedStore.setup``."""

    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: str
    master_server_address: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = 9300

    def __post_init__(self) -> None:
        """Check and normalise the fields (see the module doc)."""
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError(
                f"Invalid protocol: {self.protocol!r}. Protocol must be a non-empty string,"
                " e.g. 'tcp' or 'rdma'."
            )
        self.protocol = self.protocol.strip().lower()
        if self.protocol not in KNOWN_PROTOCOLS:
            logger.warning(
                "Unrecognised protocol %r; passing it on to setup unchanged. Known protocols"
                " are: %s.",
                self.protocol,
                ", ".join(sorted(KNOWN_PROTOCOLS)),
            )
        for name in ("global_segment_size", "local_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"Invalid {name}: {getattr(self, name)}. Size must be non-negative."
                )
        for name in _REQUIRED:
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(
                    f"Config field {name!r} must be a non-empty string, got {value!r}."
                )

    @staticmethod
    def from_dict(config: dict[str, Any]) -> MooncakeConfig:
        """Build from a mapping with the field names as keys.

        Raises ``ValueError`` when a required field is missing.
        """
        for name in _REQUIRED:
            if name not in config:
                raise ValueError(f"Missing required config field: {name}")
        ssd_offload_path = config.get("ssd_offload_path")
        tenant_id = config.get("tenant_id")
        return MooncakeConfig(
            local_hostname=str(config["local_hostname"]),
            metadata_server=str(config["metadata_server"]),
            global_segment_size=parse_size(
                config.get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE)
            ),
            local_buffer_size=parse_size(
                config.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE)
            ),
            protocol=str(config.get("protocol", "tcp")),
            device_name=str(config.get("device_name", "")),
            master_server_address=str(config["master_server_address"]),
            enable_ssd_offload=parse_bool(config.get("enable_ssd_offload", False)),
            ssd_offload_path="" if ssd_offload_path is None else str(ssd_offload_path),
            tenant_id="default" if tenant_id is None else str(tenant_id),
            enable_client_http_server=parse_bool(config.get("enable_client_http_server", False)),
            client_http_port=int(config.get("client_http_port", 9300)),
        )

    @staticmethod
    def load_from_file(file_path: str | os.PathLike[str]) -> MooncakeConfig:
        """Read a JSON config file."""
        with open(file_path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise TypeError(f"{file_path}: the config must be a JSON object")
        return MooncakeConfig.from_dict(data)

    # Upstream spelling.
    from_file = load_from_file

    @staticmethod
    def load_from_env() -> MooncakeConfig:
        """``MOONCAKE_CONFIG_PATH`` when set, else the ``MOONCAKE_*`` variables.

        Raises ``ValueError`` when neither ``MOONCAKE_CONFIG_PATH`` nor
        ``MOONCAKE_MASTER`` is set.
        """
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if path:
            return MooncakeConfig.load_from_file(path)
        master = os.getenv("MOONCAKE_MASTER")
        if not master:
            raise ValueError(
                "Neither the environment variable 'MOONCAKE_CONFIG_PATH' nor 'MOONCAKE_MASTER'"
                " is set."
            )
        return MooncakeConfig(
            local_hostname=os.getenv("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            metadata_server=os.getenv("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=parse_size(
                os.getenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", str(DEFAULT_GLOBAL_SEGMENT_SIZE))
            ),
            local_buffer_size=parse_size(
                os.getenv("MOONCAKE_LOCAL_BUFFER_SIZE", str(DEFAULT_LOCAL_BUFFER_SIZE))
            ),
            protocol=os.getenv("MOONCAKE_PROTOCOL", "tcp"),
            device_name=os.getenv("MOONCAKE_DEVICE", ""),
            master_server_address=master,
            enable_ssd_offload=parse_bool(os.getenv("MOONCAKE_OFFLOAD_ENABLED", "false")),
            ssd_offload_path=os.getenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=os.getenv("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=parse_bool(
                os.getenv("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false")
            ),
            client_http_port=int(os.getenv("MOONCAKE_CLIENT_HTTP_PORT", "9300")),
        )

    def setup_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``MooncakeDistributedStore.setup`` after its
        seven positional ones (``setup_args``)."""
        return {
            "enable_ssd_offload": self.enable_ssd_offload,
            "ssd_offload_path": self.ssd_offload_path,
            "tenant_id": self.tenant_id,
            "enable_client_http_server": self.enable_client_http_server,
            "client_http_port": self.client_http_port,
        }

    def setup_args(self) -> tuple[str, str, int, int, str, str, str]:
        """Positional arguments for ``MooncakeDistributedStore.setup``."""
        return (
            self.local_hostname,
            self.metadata_server,
            self.global_segment_size,
            self.local_buffer_size,
            self.protocol,
            self.device_name,
            self.master_server_address,
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict (JSON-serialisable)."""
        return asdict(self)
