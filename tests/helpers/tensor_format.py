"""An independent reader of the stored tensor format, for tests.

Decodes the 304-byte header and the 96-byte manifest with ``struct`` at the
format's byte offsets (upstream's layout), so tests check the bytes we store without going through
the implementation under test.
"""

from __future__ import annotations

import struct
from typing import Any

HEADER = 304
MANIFEST = 96


def decode_header(b: bytes) -> dict[str, Any]:
    """Fields of a tensor object header (``b`` holds at least 304 bytes)."""
    magic, version, hsize, dtype, ndim, layout, flags, data_offset, data_bytes = struct.unpack_from(
        "<IHHiiIIQQ", b, 0
    )
    global_shape = struct.unpack_from("<8q", b, 40)
    local_shape = struct.unpack_from("<8q", b, 104)
    axis_count, reserved = struct.unpack_from("<II", b, 168)
    axes = [struct.unpack_from("<iiiiiiq", b, 176 + 32 * i) for i in range(4)]
    return {
        "magic_bytes": bytes(b[0:4]),
        "magic": magic,
        "version": version,
        "header_size": hsize,
        "dtype": dtype,
        "ndim": ndim,
        "layout": layout,
        "flags": flags,
        "data_offset": data_offset,
        "data_bytes": data_bytes,
        "global": global_shape,
        "local": local_shape,
        "axis_count": axis_count,
        "reserved": reserved,
        "axes": axes[:axis_count],
        "unused_axes_zero": all(a == (0,) * 7 for a in axes[axis_count:]),
    }


def decode_manifest(b: bytes) -> dict[str, Any]:
    """Fields of a manifest (``b`` holds at least 96 bytes)."""
    _magic, version, hsize, dtype, ndim, split_dim, count, reserved = struct.unpack_from(
        "<IHHiiiii", b, 0
    )
    return {
        "magic_bytes": bytes(b[0:4]),
        "version": version,
        "header_size": hsize,
        "dtype": dtype,
        "ndim": ndim,
        "split_dim": split_dim,
        "shard_count": count,
        "reserved": reserved,
        "padding": bytes(b[28:32]),
        "global": struct.unpack_from("<8q", b, 32)[:ndim],
    }
