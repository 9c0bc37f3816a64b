"""Structured objects on the Mooncake store: RL batches (DataProto) and bundles.

A *structured object* is one logical object made of named members (tensors,
arrays, byte strings) plus JSON metadata. It is stored as one store object
per member (split into chunks of ``chunk_bytes``) and one JSON manifest that
lists them; the manifest and every member go to the store in **one** batched
write, so a reader that finds the manifest finds every member. A failed write
removes whatever it wrote.

A DataProto-like batch (``batch`` tensor fields indexed by row,
``non_tensor_batch`` per-row values, ``meta_info``) is stored as one
structured object per *stage*; :class:`MooncakeDataProtoRef` routes field
names to stages and members, and exports as a small JSON-safe handle (manifest
keys, no payload) that another process imports. Reads fetch only the selected
fields and, with ``rows``, only the byte ranges of the selected rows
(``get_into_ranges`` straight into the result's memory, every field of a call
in one request; ragged fields take a second request for their data ranges).

``non_tensor_batch`` columns of Python objects are stored with the codecs of
``mooncake.structured.infer``, ``encode`` and ``decode`` (text, bytes,
JSON-like values, numeric sequences, ragged tensors, nested dicts and lists).
The implementation lives in ``mooncake.structured``; this module re-exports
its public names.
"""

# Every import is a re-export; ``__all__`` lists the names ``import *`` gives.
# ruff: noqa: F401

from __future__ import annotations

from mooncake.structured.bundle import (
    DEFAULT_BUNDLE_CHUNK_BYTES,
    STRUCTURED_FIELD_SPECS_KEY,
    BundleStore,
)
from mooncake.structured.common import (
    BYTES_CODECS,
    MISSING,
    RAGGED_CODECS,
    _Missing,
    is_tensor,
    require_torch,
    torch_module,
)
from mooncake.structured.decode import decode_encoded
from mooncake.structured.encode import (
    Parts,
    encode_inferred,
    encode_with_codec,
    schema_dtype,
)
from mooncake.structured.infer import (
    _choose_leaf_codec,
    _CodecDecision,
    _escape_key,
    _InferredLeaf,
    _InferredNode,
    infer_structure,
)
from mooncake.structured.memory import TENSOR_HEADER_BYTES
from mooncake.structured.objects import (
    BundleTransferPolicy,
    FieldSchema,
    StructuredMemberSlice,
    StructuredObjectPayload,
    StructuredObjectReadSpec,
    StructuredObjectResult,
    raw_destination,
    tensor_object_buffer,
)
from mooncake.structured.refs import (
    DATAPROTO_REF_HANDLE_TYPE,
    DATAPROTO_REF_HANDLE_VERSION,
    STORAGE_GROUP_ID,
    DataProtoRefLike,
    MooncakeDataProtoRef,
    RemoteBundleRef,
    StructuredFieldLocation,
    export_dataproto_ref,
    export_ref,
    import_dataproto_ref,
    import_ref,
    is_dataproto_ref_handle,
)
from mooncake.structured.transfer import MooncakeBundleTransfer
from mooncake.structured.transport import (
    LEASE_EXPIRED,
    MISSING_OBJECT_ERROR,
    StructuredObjectMissingError,
)

__all__ = [
    "DEFAULT_BUNDLE_CHUNK_BYTES",
    "MISSING",
    "STRUCTURED_FIELD_SPECS_KEY",
    "BundleStore",
    "BundleTransferPolicy",
    "FieldSchema",
    "MooncakeBundleTransfer",
    "MooncakeDataProtoRef",
    "RemoteBundleRef",
    "StructuredFieldLocation",
    "StructuredMemberSlice",
    "StructuredObjectPayload",
    "StructuredObjectReadSpec",
    "StructuredObjectResult",
    "_CodecDecision",
    "_InferredLeaf",
    "_InferredNode",
    "_Missing",
    "_choose_leaf_codec",
    "_escape_key",
    "export_dataproto_ref",
    "export_ref",
    "import_dataproto_ref",
    "import_ref",
    "infer_structure",
    "is_dataproto_ref_handle",
    "raw_destination",
    "tensor_object_buffer",
]
