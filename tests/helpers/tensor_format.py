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


# The fixed fields at the start of each record, in order ("" for one left out
# of the decoded fields).
_HEADER_FIELDS = (
    "<IHHiiIIQQ",
    "magic version header_size dtype ndim layout flags data_offset data_bytes",
)
_MANIFEST_FIELDS = ("<IHHiiiii", " version header_size dtype ndim split_dim shard_count reserved")


def _fields(spec: tuple[str, str], b: bytes) -> dict[str, Any]:
    """The fixed fields ``spec`` (struct format, names) at the start of ``b``, by name."""
    fmt, names = spec
    values = struct.unpack_from(fmt, b, 0)
    return {k: v for k, v in zip(names.split(" "), values, strict=True) if k}


def decode_header(b: bytes) -> dict[str, Any]:
    """Fields of a tensor object header (``b`` holds at least 304 bytes)."""
    axis_count, reserved = struct.unpack_from("<II", b, 168)
    axes = [struct.unpack_from("<iiiiiiq", b, 176 + 32 * i) for i in range(4)]
    return {
        "magic_bytes": bytes(b[0:4]),
        **_fields(_HEADER_FIELDS, b),
        "global": struct.unpack_from("<8q", b, 40),
        "local": struct.unpack_from("<8q", b, 104),
        "axis_count": axis_count,
        "reserved": reserved,
        "axes": axes[:axis_count],
        "unused_axes_zero": all(a == (0,) * 7 for a in axes[axis_count:]),
    }


def decode_manifest(b: bytes) -> dict[str, Any]:
    """Fields of a manifest (``b`` holds at least 96 bytes)."""
    fields = _fields(_MANIFEST_FIELDS, b)
    return {
        "magic_bytes": bytes(b[0:4]),
        **fields,
        "padding": bytes(b[28:32]),
        "global": struct.unpack_from("<8q", b, 32)[: fields["ndim"]],
    }
