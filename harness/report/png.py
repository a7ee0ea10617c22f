"""A minimal PNG encoder (8-bit RGB, zlib from the standard library) for self-contained reports.

Pictures are written one pixel per cell and scaled up in the page with `image-rendering:
pixelated`, so a 640-key probe picture stays a few kilobytes.
"""

from __future__ import annotations

import base64
import struct
import zlib

RGB = tuple[int, int, int]


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def encode(pixels: list[list[RGB]]) -> bytes:
    """Rows of (r, g, b) tuples, all rows the same length, at least one pixel -> PNG bytes."""
    height, width = len(pixels), len(pixels[0]) if pixels else 0
    if not height or not width or any(len(row) != width for row in pixels):
        raise ValueError(f"a PNG needs equal, non-empty rows (got {height} rows of width {width})")
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw, 9))
        + _chunk(b"IEND", b"")
    )


def data_uri(pixels: list[list[RGB]]) -> str:
    return "data:image/png;base64," + base64.b64encode(encode(pixels)).decode("ascii")
