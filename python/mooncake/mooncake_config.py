"""Client settings for ``MooncakeDistributedStore.setup``, read from a JSON
file (``MOONCAKE_CONFIG_PATH``) or from ``MOONCAKE_*`` environment variables.

JSON file keys are the field names. Environment variables (used when
``MOONCAKE_CONFIG_PATH`` is unset; ``MOONCAKE_MASTER`` is then required)::

    MOONCAKE_MASTER                master_server_address (host:port)
    MOONCAKE_LOCAL_HOSTNAME        local_hostname         (default "localhost")
    MOONCAKE_TE_META_DATA_SERVER   metadata_server        (default "P2PHANDSHAKE")
    MOONCAKE_GLOBAL_SEGMENT_SIZE   global_segment_size    (default 3.125 GiB)
    MOONCAKE_LOCAL_BUFFER_SIZE     local_buffer_size      (default 1 GiB)
    MOONCAKE_PROTOCOL              protocol               (default "tcp")
    MOONCAKE_DEVICE                device_name            (default "")

Sizes accept integers or strings with a unit suffix (``"4GB"``, ``"512 MiB"``,
``"1.5g"``); units are powers of 1024.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from mooncake import _native

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824  # 1 GiB

_REQUIRED = ("local_hostname", "metadata_server", "master_server_address")


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

    @staticmethod
    def from_dict(config: dict[str, Any]) -> MooncakeConfig:
        """Build from a mapping with the field names as keys.

        Raises ``ValueError`` when a required field is missing.
        """
        for name in _REQUIRED:
            if name not in config:
                raise ValueError(f"Missing required config field: {name}")
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
        )

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
