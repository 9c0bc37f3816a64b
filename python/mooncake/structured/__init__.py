"""The modules behind ``mooncake.structured_object_store``, one job each.

* ``common``: optional torch access, ``MISSING``, codec families.
* ``infer``: codec choice and structure inference of object columns.
* ``encode`` / ``decode``: object columns to flat payloads and back.
* ``refs``: DataProto refs and their JSON-safe handles.
* ``objects``: the value types callers pass in and get back.
* ``memory``: caller and result memory, the tensor-object header.
* ``transport``: batched store writes, reads and removes.
* ``plan``: row selection and member read plans.
* ``encoded_reads``: row-selective reads of encoded columns.
* ``dataproto``: the shape rules of DataProto-like data.
* ``members``: values to store members.
* ``bundle``: bundles and structured objects (manifests, writes, reads).
* ``transfer``: the DataProto API, :class:`MooncakeBundleTransfer`.

Import the public names from ``mooncake.structured_object_store``.
"""
