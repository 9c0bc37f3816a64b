"""Type stubs for ``mooncake._native``, the PyO3 extension module.

Checked against the built extension by ``python -m mypy.stubtest mooncake._native``
(run by ``scripts/test.sh``), so a method added, removed or re-signed in
``crates/python`` without updating this file fails the test command.
"""

import enum
from collections.abc import Sequence
from typing import Any, ClassVar, Self, final

from typing_extensions import Buffer, disjoint_base

__version__: str
__all__ = [
    "ENGINE_SUPPORT_CUDA",
    "BufferHandle",
    "BufferLease",
    "BufferLeaseView",
    "BufferPool",
    "Descriptor",
    "DiskDescriptor",
    "EngramStore",
    "EngramStoreConfig",
    "ErrorCode",
    "InnerTransferEngine",
    "MemoryDescriptor",
    "MetadataServer",
    "MooncakeDistributedStore",
    "MooncakeHostMemAllocator",
    "ObjectDataType",
    "PgCoordinator",
    "PgGroup",
    "PgWork",
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
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
    "__version__",
    "_deserialize_tensor",
    "_result_memory",
    "_serialize_tensor",
    "_tensor_metadata_size",
    "parse_size",
    "pg_clear_faults",
    "pg_dtype_codes",
    "pg_fault_stats",
    "pg_inject_fault",
    "pg_reduce_op_codes",
    "pg_set_collective_timeout_us",
    "pg_set_fault_reconciliation_window_us",
    "pg_set_p2p_timeout_us",
    "run_client",
    "run_http_metadata_server",
    "run_master",
    "run_transfer_engine_bench",
]

def run_master(argv: list[str]) -> int: ...
def parse_size(text: str) -> int: ...
def run_http_metadata_server(host: str, port: int, log_level: str) -> int: ...

@final
class MetadataServer:
    def __new__(cls, host: str, port: int) -> Self: ...
    @property
    def port(self) -> int: ...
    def running(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...
    def stop(self) -> None: ...

def run_client(argv: list[str]) -> int: ...
def run_transfer_engine_bench(argv: list[str]) -> int: ...
def _tensor_metadata_size() -> int: ...
def _result_memory(nbytes: int) -> Buffer | None: ...
def _serialize_tensor(t: Any) -> tuple[bytes, int, int, Any]: ...
def _deserialize_tensor(b: bytes) -> Any: ...

# --- mooncake.store -------------------------------------------------------

class ErrorCode(enum.IntEnum):
    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    SEGMENT_NOT_FOUND = -101
    SEGMENT_ALREADY_EXISTS = -102
    CLIENT_NOT_FOUND = -103
    NO_AVAILABLE_HANDLE = -200
    INVALID_KEY = -400
    INVALID_PARAMS = -600
    ILLEGAL_CLIENT = -601
    INVALID_REPLICA = -702
    REPLICA_IS_NOT_READY = -703
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706
    LEASE_EXPIRED = -707
    OBJECT_HAS_REPLICATION_TASK = -708
    OBJECT_REPLICA_BUSY = -714
    TRANSFER_FAIL = -800
    CHECKSUM_MISMATCH = -801
    RPC_FAIL = -900
    RPC_TIMEOUT = -901
    UNAVAILABLE_IN_CURRENT_STATUS = -1010
    NOT_SUPPORTED = -1012
    TASK_NOT_FOUND = -1400
    TASK_PENDING_LIMIT_EXCEEDED = -1401
    TENANT_QUOTA_EXCEEDED = -1700
    TENANT_NOT_REGISTERED = -1701
    TENANT_NOT_EMPTY = -1702

@final
class ObjectDataType:
    __members__: ClassVar[dict[str, ObjectDataType]]
    UNKNOWN: ObjectDataType
    KVCACHE: ObjectDataType
    TENSOR: ObjectDataType
    WEIGHT: ObjectDataType
    SAMPLE: ObjectDataType
    ACTIVATION: ObjectDataType
    GRADIENT: ObjectDataType
    OPTIMIZER_STATE: ObjectDataType
    METADATA: ObjectDataType
    GENERAL: ObjectDataType
    def __new__(cls, value: int) -> Self: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self, /) -> int: ...
    def __int__(self, /) -> int: ...
    def __reduce__(self, /) -> Any: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

@final
class SoftPinAction:
    __members__: ClassVar[dict[str, SoftPinAction]]
    DISABLE: SoftPinAction
    ENABLE: SoftPinAction
    PRESERVE: SoftPinAction
    def __new__(cls, value: int) -> Self: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self, /) -> int: ...
    def __int__(self, /) -> int: ...
    def __reduce__(self, /) -> Any: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

@final
class ReplicaStatus:
    __members__: ClassVar[dict[str, ReplicaStatus]]
    COMPLETE: ReplicaStatus
    FAILED: ReplicaStatus
    INITIALIZED: ReplicaStatus
    PROCESSING: ReplicaStatus
    REMOVED: ReplicaStatus
    UNDEFINED: ReplicaStatus
    def __new__(cls, value: int) -> Self: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self, /) -> int: ...
    def __int__(self, /) -> int: ...
    def __reduce__(self, /) -> Any: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

@final
class TaskType:
    __members__: ClassVar[dict[str, TaskType]]
    REPLICA_COPY: TaskType
    REPLICA_MOVE: TaskType
    def __new__(cls, value: int) -> Self: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self, /) -> int: ...
    def __int__(self, /) -> int: ...
    def __reduce__(self, /) -> Any: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

@final
class TaskStatus:
    __members__: ClassVar[dict[str, TaskStatus]]
    FAILED: TaskStatus
    PENDING: TaskStatus
    PROCESSING: TaskStatus
    SUCCESS: TaskStatus
    def __new__(cls, value: int) -> Self: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self, /) -> int: ...
    def __int__(self, /) -> int: ...
    def __reduce__(self, /) -> Any: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

@final
class QueryTaskResponse:
    @property
    def id(self) -> tuple[int, int]: ...
    @property
    def type(self) -> TaskType: ...
    @property
    def status(self) -> TaskStatus: ...
    @property
    def created_at_ms_epoch(self) -> int: ...
    @property
    def last_updated_at_ms_epoch(self) -> int: ...
    @property
    def assigned_client(self) -> tuple[int, int]: ...
    @property
    def message(self) -> str: ...

@final
class Descriptor:
    size: int
    buffer_address: int
    transport_endpoint: str
    def __new__(cls) -> Self: ...

@final
class MemoryDescriptor:
    buffer_descriptor: Descriptor

@final
class DiskDescriptor:
    file_path: str
    object_size: int

@final
class ReplicaDescriptor:
    @property
    def status(self) -> ReplicaStatus: ...
    def is_memory_replica(self, /) -> bool: ...
    def is_disk_replica(self, /) -> bool: ...
    def is_local_disk_replica(self, /) -> bool: ...
    def get_memory_descriptor(self, /) -> MemoryDescriptor: ...
    def get_disk_descriptor(self, /) -> DiskDescriptor: ...

@disjoint_base
class ReplicateConfig:
    replica_num: int
    with_hard_pin: bool
    preferred_segment: str
    preferred_segments: list[str]
    prefer_alloc_in_same_node: bool
    group_ids: list[str]
    data_type: ObjectDataType
    soft_pin_action: SoftPinAction
    soft_pin_ttl_ms: int
    dfs_replica_num: int
    nof_replica_num: int
    preferred_nof_segments: list[str]
    def __new__(cls, **kwargs: Any) -> Self: ...

@final
class BufferHandle:
    def ptr(self, /) -> int: ...
    def size(self, /) -> int: ...
    @staticmethod
    def _from_bytes(data: bytes) -> BufferHandle: ...

@final
class BufferPool:
    def __new__(
        cls,
        store: Any,
        max_bytes: int = ...,
        min_size_class: int = ...,
        max_size_class: int | None = None,
        alignment: int = ...,
        block_on_exhaustion: bool = True,
        default_timeout: float | None = None,
        max_regions: int | None = None,
        prewarm_size: int | None = None,
        prewarm_count: int = ...,
    ) -> Self: ...
    def acquire(
        self, /, size: int, block: bool | None = None, timeout: float | None = None
    ) -> BufferLease: ...
    def buffer(
        self, /, size: int, block: bool | None = None, timeout: float | None = None
    ) -> BufferLease: ...
    def prewarm(self, /, size: int, count: int) -> None: ...
    def close(self, /) -> None: ...

@final
class BufferLease:
    @property
    def ptr(self, /) -> int: ...
    @property
    def size(self, /) -> int: ...
    @property
    def buffer(self, /) -> memoryview: ...
    def release(self, /) -> None: ...
    def __enter__(self, /) -> BufferLease: ...
    def __exit__(self, /, *_args: object) -> None: ...

@final
class BufferLeaseView:
    @property
    def buffer(self, /) -> memoryview: ...

RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease
RegisteredBufferLeaseView = BufferLeaseView

@disjoint_base
class MooncakeHostMemAllocator:
    def __new__(cls) -> Self: ...
    def alloc(self, /, size: int) -> int: ...
    def free(self, /, ptr: int) -> int: ...

@disjoint_base
class MooncakeDistributedStore:
    def __new__(cls) -> Self: ...
    # lifecycle
    def setup(self, /, *args: Any, **kwargs: Any) -> int: ...
    def setup_dummy(
        self, /, mem_pool_size: int, local_buffer_size: int, server_address: str
    ) -> int: ...
    def init_all(self, /, arg0: str, arg1: str, arg2: int) -> int: ...
    def close(self, /) -> int: ...
    def health_check(self, /) -> int: ...
    def get_hostname(self, /) -> str: ...
    def get_client_stats(self, /) -> dict[str, int]: ...
    def _get_pyclient_capsule(self, /) -> Any: ...
    # byte-value API
    def put(self, /, key: str, value: Any, config: ReplicateConfig | None = None) -> int: ...
    def upsert(self, /, key: str, value: Any, config: ReplicateConfig | None = None) -> int: ...
    def put_parts(self, /, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int: ...
    def upsert_parts(
        self, /, key: str, *parts: Any, config: ReplicateConfig | None = None
    ) -> int: ...
    def put_batch(
        self, /, keys: list[str], values: list[Any], config: ReplicateConfig | None = None
    ) -> int: ...
    def upsert_batch(
        self, /, keys: list[str], values: list[Any], config: ReplicateConfig | None = None
    ) -> int: ...
    def get(self, /, arg0: str | None = None, *, key: str | None = None) -> bytes: ...
    def get_batch(
        self, /, arg0: list[str] | None = None, *, keys: list[str] | None = None
    ) -> list[bytes]: ...
    def get_buffer(
        self, /, arg0: str | None = None, *, key: str | None = None
    ) -> BufferHandle | None: ...
    def batch_get_buffer(
        self, /, arg0: list[str] | None = None, *, keys: list[str] | None = None
    ) -> list[BufferHandle | None]: ...
    def get_size(self, /, arg0: str | None = None, *, key: str | None = None) -> int: ...
    def is_exist(self, /, arg0: str | None = None, *, key: str | None = None) -> int: ...
    def batch_is_exist(self, /, keys: list[str]) -> list[int]: ...
    # zero-copy API
    def register_buffer(self, /, buffer_ptr: int, size: int) -> int: ...
    def unregister_buffer(self, /, buffer_ptr: int) -> int: ...
    def put_from(
        self, /, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int: ...
    def upsert_from(
        self, /, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int: ...
    def batch_put_from(
        self,
        /,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]: ...
    def batch_upsert_from(
        self,
        /,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]: ...
    def get_into(self, /, key: str, buffer_ptr: int, size: int) -> int: ...
    def batch_get_into(
        self, /, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]: ...
    def get_into_ranges(
        self,
        /,
        buffer_ptrs: list[int],
        all_keys: list[list[str]],
        all_dst_offsets: list[list[int]],
        all_src_offsets: list[list[int]],
        all_sizes: list[list[int]],
    ) -> list[list[int]]: ...
    def put_from_with_metadata(
        self,
        /,
        key: str,
        buffer_ptr: int,
        metadata_buffer_ptr: int,
        size: int,
        metadata_size: int,
        config: ReplicateConfig | None = None,
    ) -> int: ...
    # removal
    def remove(self, /, key: str, force: bool | None = None) -> int: ...
    def remove_by_regex(self, /, regex_pattern: str, force: bool | None = None) -> int: ...
    def remove_all(self, /, force: bool | None = None) -> int: ...
    def batch_remove(self, /, keys: list[str], force: bool | None = None) -> list[int]: ...
    # unified parallel tensor IO: plain API
    def put_tensor(self, /, key: str, tensor: Any) -> int: ...
    def upsert_tensor(self, /, key: str, tensor: Any) -> int: ...
    def pub_tensor(
        self, /, key: str, tensor: Any, config: ReplicateConfig | None = None
    ) -> int: ...
    def upsert_pub_tensor(
        self, /, key: str, tensor: Any, config: ReplicateConfig | None = None
    ) -> int: ...
    def batch_put_tensor(self, /, keys: list[str], tensors_list: list[Any]) -> list[int]: ...
    def batch_upsert_tensor(self, /, keys: list[str], tensors_list: list[Any]) -> list[int]: ...
    def batch_pub_tensor(
        self, /, keys: list[str], tensors_list: list[Any], config: ReplicateConfig | None = None
    ) -> list[int]: ...
    def batch_upsert_pub_tensor(
        self, /, keys: list[str], tensors_list: list[Any], config: ReplicateConfig | None = None
    ) -> list[int]: ...
    def put_tensor_from(self, /, key: str, buffer_ptr: int, size: int) -> int: ...
    def upsert_tensor_from(self, /, key: str, buffer_ptr: int, size: int) -> int: ...
    def batch_put_tensor_from(
        self, /, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]: ...
    def batch_upsert_tensor_from(
        self, /, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]: ...
    def get_tensor(self, /, key: str) -> Any: ...
    def save_tensor_to_safetensor(self, /, key: str, file_name: str | None = None) -> int: ...
    def load_tensor_from_safetensor(
        self, /, key: str | None = None, file_name: str | None = None
    ) -> Any: ...
    def batch_get_tensor(self, /, keys: list[str]) -> list[Any]: ...
    def get_tensor_into(self, /, key: str, buffer_ptr: int, size: int) -> Any: ...
    def batch_get_tensor_into(
        self, /, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[Any]: ...
    # tensor IO: legacy TP wrappers
    def put_tensor_with_tp(
        self, /, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> int: ...
    def batch_put_tensor_with_tp(
        self,
        /,
        base_keys: list[str],
        tensors_list: list[Any],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]: ...
    def pub_tensor_with_tp(
        self,
        /,
        key: str,
        tensor: Any,
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int: ...
    def batch_pub_tensor_with_tp(
        self,
        /,
        base_keys: list[str],
        tensors_list: list[Any],
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]: ...
    def put_tensor_with_tp_from(
        self,
        /,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int: ...
    def batch_put_tensor_with_tp_from(
        self,
        /,
        base_keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]: ...
    def get_tensor_with_tp(
        self, /, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> Any: ...
    def batch_get_tensor_with_tp(
        self, /, base_keys: list[str], tp_rank: int = 0, tp_size: int = 1
    ) -> list[Any]: ...
    def get_tensor_with_tp_into(
        self,
        /,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> Any: ...
    def batch_get_tensor_with_tp_into(
        self,
        /,
        base_keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> list[Any]: ...
    # tensor IO: unified writes
    def put_tensor_with_parallelism(
        self,
        /,
        key: str,
        tensor: Any,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
        *,
        replica: ReplicateConfig | None = None,
    ) -> int: ...
    def upsert_tensor_with_parallelism(
        self,
        /,
        key: str,
        tensor: Any,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
        *,
        replica: ReplicateConfig | None = None,
    ) -> int: ...
    def batch_put_tensor_with_parallelism(
        self,
        /,
        keys: list[str],
        tensors_list: list[Any],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
        *,
        replica: ReplicateConfig | None = None,
    ) -> list[int]: ...
    def batch_upsert_tensor_with_parallelism(
        self,
        /,
        keys: list[str],
        tensors_list: list[Any],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
        *,
        replica: ReplicateConfig | None = None,
    ) -> list[int]: ...
    def put_tensor_with_parallelism_from(
        self,
        /,
        key: str,
        buffer_ptr: int,
        size: int,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
        *,
        replica: ReplicateConfig | None = None,
    ) -> int: ...
    def upsert_tensor_with_parallelism_from(
        self,
        /,
        key: str,
        buffer_ptr: int,
        size: int,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
        *,
        replica: ReplicateConfig | None = None,
    ) -> int: ...
    def batch_put_tensor_with_parallelism_from(
        self,
        /,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
        *,
        replica: ReplicateConfig | None = None,
    ) -> list[int]: ...
    def batch_upsert_tensor_with_parallelism_from(
        self,
        /,
        keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
        *,
        replica: ReplicateConfig | None = None,
    ) -> list[int]: ...
    # tensor IO: unified reads
    def get_tensor_with_parallelism(self, /, key: str, target: Any = None) -> Any: ...
    def batch_get_tensor_with_parallelism(
        self, /, keys: list[str], targets: Any = None
    ) -> list[Any]: ...
    def get_tensor_with_parallelism_into(
        self, /, key: str, buffer_ptr: int, size: int, target: Any = None
    ) -> Any: ...
    def batch_get_tensor_with_parallelism_into(
        self, /, keys: list[str], buffer_ptrs: list[int], sizes: list[int], targets: Any = None
    ) -> list[Any]: ...
    def get_replica_desc(self, /, key: str) -> list[ReplicaDescriptor]: ...
    def batch_get_replica_desc(self, /, keys: list[str]) -> dict[str, list[ReplicaDescriptor]]: ...
    def create_copy_task(self, /, key: str, targets: list[str]) -> tuple[tuple[int, int], int]: ...
    def create_move_task(
        self, /, key: str, source: str, target: str
    ) -> tuple[tuple[int, int], int]: ...
    def query_task(self, /, task_id: Any) -> tuple[QueryTaskResponse | None, int]: ...
    def mount_segment(
        self, /, path: str, size: int, offset: int = ..., protocol: str = ..., location: str = ...
    ) -> dict[str, Any]: ...
    def allocate_and_mount_segment(
        self, /, size: int, protocol: str = ..., location: str = ...
    ) -> dict[str, Any]: ...
    def unmount_segment(self, /, segment_ids: Any, grace_period_seconds: int = ...) -> int: ...
    def unmount_and_free_segment(
        self, /, segment_ids: Any, grace_period_seconds: int = ...
    ) -> int: ...
    def unmount_local_disk_segment(self, /, grace_period_seconds: int = ...) -> int: ...
    def batch_put_session_start(
        self, /, keys: list[str], sizes: list[int], config: ReplicateConfig | None = None
    ) -> list[int]: ...
    def batch_put_session_end(self, /, keys: list[str]) -> list[int]: ...
    def batch_put_session_revoke(self, /, keys: list[str]) -> list[int]: ...
    def batch_get_session_start(self, /, keys: list[str]) -> list[int]: ...
    def batch_get_session_end(self, /, keys: list[str]) -> int: ...
    def batch_put_from_multi_buffers(
        self,
        /,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        config: ReplicateConfig | None = None,
    ) -> list[int]: ...
    def batch_get_into_multi_buffers(
        self,
        /,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        prefer_alloc_in_same_node: bool = ...,
    ) -> list[int]: ...
    def batch_put_from_multi_buffer_ranges(
        self,
        /,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        all_dst_offsets: list[list[int]],
    ) -> list[int]: ...
    def batch_get_into_multi_buffer_ranges(
        self,
        /,
        keys: list[str],
        all_buffer_ptrs: list[list[int]],
        all_sizes: list[list[int]],
        all_src_offsets: list[list[int]],
    ) -> list[int]: ...
    def get_tensor_into_cuda(self, /, key: str, tensor: Any) -> int: ...
    def batch_get_tensor_into_cuda(self, /, keys: list[str], tensors_list: list[Any]) -> Any: ...
    def alloc_from_mem_pool(self, /, arg0: int) -> int: ...
    def get_offload_rpc_read_count(self, /) -> int: ...
    def batch_replica_clear(self, /, keys: list[str], segment_name: str = ...) -> list[str]: ...

@final
class EngramStoreConfig:
    table_vocab_sizes: list[int]
    embedding_dim: int
    table_dtype: Any
    def __new__(
        cls,
        *,
        table_vocab_sizes: Sequence[int] | None = None,
        embedding_dim: int | None = None,
        table_dtype: Any = None,
    ) -> Self: ...

@final
class EngramStore:
    def __new__(
        cls,
        layer_id: int,
        config: EngramStoreConfig,
        store: Any = None,
        *,
        replicate_config: ReplicateConfig | None = None,
    ) -> Self: ...
    def populate(self, /, embedding_buffers: Sequence[Any]) -> None: ...
    def lookup(self, /, row_ids: Any) -> Any: ...
    def lookup_into(self, /, row_ids: Any, out: Any) -> Any: ...
    def remove_from_store(self, /, force: bool = False) -> int: ...
    def get_table_vocab_sizes(self, /) -> list[int]: ...
    def get_store_keys(self, /) -> list[str]: ...
    def get_num_heads(self, /) -> int: ...
    def get_embedding_dim(self, /) -> int: ...
    def get_layer_id(self, /) -> int: ...
    def get_table_dtype(self, /) -> str: ...

# --- mooncake.pg ----------------------------------------------------------

@final
class PgWork:
    def wait(self, /, timeout: float | None = None) -> bool: ...
    def is_completed(self, /) -> bool: ...
    def error(self, /) -> str | None: ...
    def failed_mask(self, /) -> int: ...
    def source_rank(self, /) -> int: ...

@final
class PgGroup:
    def __new__(
        cls,
        rank: int,
        size: int,
        capacity: int,
        is_extension: bool,
        key: str,
        auto_deactivate: bool = True,
        auto_sync: bool = True,
        host: str = ...,
    ) -> Self: ...
    def attach(self, /, coordinator: str, endpoint: str, timeout_s: float) -> None: ...
    def join(self, /, timeout_s: float) -> None: ...
    def propose(self, /, activate: bool, ranks: list[int]) -> tuple[int, int, list[int], str]: ...
    def sync(self, /) -> tuple[int, int, str]: ...
    def peer_state(self, /, ranks: list[int]) -> list[bool]: ...
    def num_synced(self, /) -> int: ...
    def epoch(self, /) -> int: ...
    def is_active(self, /) -> bool: ...
    def extend(self, /, capacity: int) -> None: ...
    def connect(self, /, peers: list[Any], timeout_s: float) -> None: ...
    def port(self, /) -> int: ...
    def instance_id(self, /) -> int: ...
    def member_id(self, /) -> int: ...
    def capacity(self, /) -> int: ...
    def visible_size(self, /) -> int: ...
    def mask(self, /) -> int: ...
    def set_mask_tensor(self, /, ptr: int, len: int, owner: object | None = None) -> None: ...
    def clear_mask_tensor(self, /) -> None: ...
    def set_spin_us(self, /, us: int) -> None: ...
    def shm_name(self, /) -> str: ...
    def shm_peer_count(self, /) -> int: ...
    def send(self, /, dst: int, ptr: int, nbytes: int) -> PgWork: ...
    def recv(self, /, src: int | None, ptr: int, nbytes: int) -> PgWork: ...
    def submit(
        self,
        /,
        kind: str,
        srcs: list[int],
        dsts: list[int],
        nbytes: int,
        dt: int,
        op: int = 0,
        root: int = 0,
        src_lens: list[int] | None = None,
        dst_lens: list[int] | None = None,
    ) -> PgWork: ...
    def shutdown(self, /) -> None: ...

@final
class PgCoordinator:
    def __new__(cls, advertise: str) -> Self: ...
    def endpoint(self, /) -> str: ...
    def shutdown(self, /) -> None: ...

def pg_set_collective_timeout_us(us: int) -> None: ...
def pg_set_fault_reconciliation_window_us(us: int) -> None: ...
def pg_set_p2p_timeout_us(us: int) -> None: ...
def pg_inject_fault(rules: Any) -> None: ...
def pg_clear_faults() -> None: ...
def pg_fault_stats() -> list[tuple[str, int]]: ...
def pg_dtype_codes() -> list[tuple[str, int]]: ...
def pg_reduce_op_codes() -> list[tuple[str, int]]: ...

# --- mooncake.engine ------------------------------------------------------

ENGINE_SUPPORT_CUDA: bool

@final
class TransferOpcode:
    Read: ClassVar[TransferOpcode]
    Write: ClassVar[TransferOpcode]
    READ: ClassVar[TransferOpcode]
    WRITE: ClassVar[TransferOpcode]
    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...
    def __int__(self, /) -> int: ...

@final
class TransferNotify:
    name: str
    msg: str
    def __new__(cls, name: str = ..., msg: str = ...) -> Self: ...

@final
class InnerTransferEngine: ...

@final
class TransferEngine:
    def __new__(cls) -> Self: ...
    def initialize(
        self, local_hostname: str, metadata_server: str, protocol: str, device_name: str
    ) -> int: ...
    def initialize_ext(
        self,
        local_hostname: str,
        metadata_server: str,
        protocol: str,
        device_name: str,
        metadata_type: str,
    ) -> int: ...
    def get_rpc_port(self) -> int: ...
    def get_engine(self) -> InnerTransferEngine: ...
    def get_engine_ptr(self) -> int: ...
    def allocate_managed_buffer(self, length: int) -> int: ...
    def free_managed_buffer(self, buffer_addr: int, length: int) -> int: ...
    def get_first_buffer_address(self, segment_name: str) -> int: ...
    def transfer_sync_write(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int: ...
    def transfer_sync_read(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int: ...
    def transfer_sync(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        opcode: TransferOpcode,
        notify: TransferNotify | None = None,
        transport_hint: str = "",
    ) -> int: ...
    def transfer_submit_write(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        transport_hint: str = "",
    ) -> int: ...
    def transfer_check_status(self, batch_id: int) -> int: ...
    def transfer_write_on_cuda(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        stream_ptr: int = 0,
        transport_hint: str = "",
    ) -> None: ...
    def transfer_read_on_cuda(
        self,
        target_hostname: str,
        buffer: int,
        peer_buffer_address: int,
        length: int,
        stream_ptr: int = 0,
        transport_hint: str = "",
    ) -> None: ...
    def batch_transfer_sync_write(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_sync_read(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_sync(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        opcode: TransferOpcode,
        notify: TransferNotify | None = None,
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_async_write(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_async_read(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_async(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        opcode: TransferOpcode,
        transport_hint: str = "",
    ) -> int: ...
    def get_batch_transfer_status(self, batch_ids: Sequence[int]) -> int: ...
    def batch_transfer_write_on_cuda(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        stream_ptr: int = 0,
        transport_hint: str = "",
    ) -> None: ...
    def batch_transfer_read_on_cuda(
        self,
        target_hostname: str,
        buffers: Sequence[int],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        stream_ptr: int = 0,
        transport_hint: str = "",
    ) -> None: ...
    def write_bytes_to_buffer(self, dest_address: int, src_ptr: Any, length: int) -> int: ...
    def read_bytes_from_buffer(self, source_address: int, length: int) -> bytes: ...
    def register_memory(self, buffer_addr: int, capacity: int, location: str = "*") -> int: ...
    def unregister_memory(self, buffer_addr: int) -> int: ...
    def batch_register_memory(
        self, buffer_addresses: Sequence[int], capacities: Sequence[int], location: str = "*"
    ) -> int: ...
    def batch_unregister_memory(self, buffer_addresses: Sequence[int]) -> int: ...
    def get_local_topology(self, device_name: str | None = None) -> str: ...
    def get_notifies(self) -> list[TransferNotify]: ...
    def send_probe(self, peer_server_name: str) -> int: ...
    def warmup_efa_segment(self, segment_name: str) -> int: ...
