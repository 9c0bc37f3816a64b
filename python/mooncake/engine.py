"""Mooncake transfer engine (Rust implementation).

Re-exports the engine classes of the ``mooncake._native`` extension module:
``TransferEngine``, ``TransferOpcode`` (members ``Read`` and ``Write``, also
at module level as upstream exports them, with ``READ``/``WRITE`` aliases),
``TransferNotify`` and ``InnerTransferEngine`` (what ``get_engine()`` returns,
accepted by ``MooncakeDistributedStore.setup(..., engine)``).

The ``SUPPORT_*`` flags say which device transports this build has: none of
RDMA's companions (EFA, HIP, MNNVL, MUSA, intra-node NVLink). ``SUPPORT_CUDA``
is true when a CUDA driver can be loaded in this process (the extension never
links CUDA, and loads the driver only when CUDA memory is used). With a
driver, CUDA device memory can be registered and moved (CUDA IPC between
processes of one host, pinned host staging otherwise) and the ``*_on_cuda``
calls wait for their stream, then transfer; without one they raise
``RuntimeError`` saying no CUDA driver was found. These CUDA paths are built
and tested with host memory standing in for device memory; they have not run
on a GPU yet.
"""

from mooncake._native import (
    ENGINE_SUPPORT_CUDA,
    InnerTransferEngine,
    TransferEngine,
    TransferNotify,
    TransferOpcode,
)

Read = TransferOpcode.Read
Write = TransferOpcode.Write

SUPPORT_CUDA: bool = bool(ENGINE_SUPPORT_CUDA)
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False
SUPPORT_INTRA_NVLINK = False

__all__ = [
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_MNNVL",
    "SUPPORT_MUSA",
    "InnerTransferEngine",
    "Read",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
    "Write",
]
