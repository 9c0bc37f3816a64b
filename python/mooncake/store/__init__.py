"""Mooncake distributed store (Rust implementation).

Re-exports the store classes of the ``mooncake._native`` extension module.
``ObjectDataType`` members are also available at module level (upstream
behaviour); ``SoftPinAction`` members are not.
"""

from mooncake._native import (
    BufferHandle,
    EngramStore,
    EngramStoreConfig,
    ErrorCode,
    MooncakeDistributedStore,
    ObjectDataType,
    ReplicateConfig,
    SoftPinAction,
)

UNKNOWN = ObjectDataType.UNKNOWN
KVCACHE = ObjectDataType.KVCACHE
TENSOR = ObjectDataType.TENSOR
WEIGHT = ObjectDataType.WEIGHT
SAMPLE = ObjectDataType.SAMPLE
ACTIVATION = ObjectDataType.ACTIVATION
GRADIENT = ObjectDataType.GRADIENT
OPTIMIZER_STATE = ObjectDataType.OPTIMIZER_STATE
METADATA = ObjectDataType.METADATA
GENERAL = ObjectDataType.GENERAL

__all__ = [
    "ACTIVATION",
    "GENERAL",
    "GRADIENT",
    "KVCACHE",
    "METADATA",
    "OPTIMIZER_STATE",
    "SAMPLE",
    "TENSOR",
    "UNKNOWN",
    "WEIGHT",
    "BufferHandle",
    "EngramStore",
    "EngramStoreConfig",
    "ErrorCode",
    "MooncakeDistributedStore",
    "ObjectDataType",
    "ReplicateConfig",
    "SoftPinAction",
]
