"""Mooncake distributed store (Rust implementation).

Re-exports the store classes of the ``mooncake._native`` extension module
(``MooncakeHostMemAllocator`` included: shared host memory a standalone
``mooncake_client`` daemon reads and writes in place) and
the tensor-IO parallelism descriptors (``ParallelAxis``, ``TensorParallelism``,
``ReadTarget`` and the ``TP``/``DP``/``EP``/``PP`` helpers), and the tensor
object helpers ``_tensor_metadata_size``, ``_serialize_tensor`` and
``_deserialize_tensor``.
``ObjectDataType``, ``TaskStatus`` and ``TaskType`` members are also
available at module level (upstream behaviour); ``SoftPinAction`` members
are not.
"""

from mooncake._native import (
    BufferHandle,
    BufferLease,
    BufferLeaseView,
    BufferPool,
    Descriptor,
    DiskDescriptor,
    EngramStore,
    EngramStoreConfig,
    ErrorCode,
    MemoryDescriptor,
    MooncakeDistributedStore,
    MooncakeHostMemAllocator,
    ObjectDataType,
    QueryTaskResponse,
    RegisteredBufferLease,
    RegisteredBufferLeaseView,
    RegisteredBufferPool,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
    TaskStatus,
    TaskType,
    _deserialize_tensor,
    _serialize_tensor,
    _tensor_metadata_size,
)
from mooncake.store import _parallelism
from mooncake.store._parallelism import *

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
PENDING = TaskStatus.PENDING
PROCESSING = TaskStatus.PROCESSING
FAILED = TaskStatus.FAILED
SUCCESS = TaskStatus.SUCCESS
REPLICA_COPY = TaskType.REPLICA_COPY
REPLICA_MOVE = TaskType.REPLICA_MOVE

__all__ = [
    "ACTIVATION",
    "FAILED",
    "GENERAL",
    "GRADIENT",
    "KVCACHE",
    "METADATA",
    "OPTIMIZER_STATE",
    "PENDING",
    "PROCESSING",
    "REPLICA_COPY",
    "REPLICA_MOVE",
    "SAMPLE",
    "SUCCESS",
    "TENSOR",
    "UNKNOWN",
    "WEIGHT",
    "BufferHandle",
    "BufferLease",
    "BufferLeaseView",
    "BufferPool",
    "Descriptor",
    "DiskDescriptor",
    "EngramStore",
    "EngramStoreConfig",
    "ErrorCode",
    "MemoryDescriptor",
    "MooncakeDistributedStore",
    "MooncakeHostMemAllocator",
    "ObjectDataType",
    "QueryTaskResponse",
    "RegisteredBufferLease",
    "RegisteredBufferLeaseView",
    "RegisteredBufferPool",
    "ReplicaDescriptor",
    "ReplicaStatus",
    "ReplicateConfig",
    "SoftPinAction",
    "TaskStatus",
    "TaskType",
    "_deserialize_tensor",
    "_serialize_tensor",
    "_tensor_metadata_size",
]
__all__ += _parallelism.__all__
