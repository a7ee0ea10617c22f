"""The report's two pictures, as embedded PNGs: the error heatmap and the mask probe's picture.

Error heatmap: x = token (in request order, binned as the record says), y = query head; colour =
error / budget on a log scale (white-to-green within budget, yellow-to-dark-red above it, black
for NaN/Inf). Probe picture: rows = queries, columns = keys, one colour per cell kind. The PNG
encoder is minimal (8-bit RGB, zlib from the standard library): a picture is one pixel per cell,
scaled up in the page with `image-rendering: pixelated`, so a 640-key probe picture stays small.
"""

from __future__ import annotations

import base64
import html
import math
import struct
import zlib

WHITE = (255, 255, 255)
NAN_COLOUR = (0, 0, 0)
TICK = (90, 90, 90)
PROBE_COLOURS = {
    ".": (238, 238, 238),
    "#": (46, 139, 87),
    "-": (33, 102, 172),
    "+": (214, 39, 40),
    "?": (148, 103, 189),
    "!": (0, 0, 0),
}
HEATMAP_MIN_WIDTH = 240  # display pixels: a one-token map is a readable block, not a sliver
# Ratio stops of the heatmap legend, with their colours (computed by ratio_colour).
LEGEND_RATIOS = (0.0, 0.001, 0.01, 0.1, 1.0, 3.0, 10.0, 100.0)


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


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> tuple[int, int, int]:
    t = min(1.0, max(0.0, t))
    return tuple(round(x + (y - x) * t) for x, y in zip(a, b))  # type: ignore[return-value]


def ratio_colour(ratio: float | None) -> tuple[int, int, int]:
    """Colour of one heatmap cell from its error / budget ratio (None or NaN: black)."""
    if ratio is None or math.isnan(ratio):
        return NAN_COLOUR
    if ratio <= 0:
        return WHITE
    if ratio <= 1:  # 1e-3 .. 1 within budget: white -> green
        return _mix(WHITE, (90, 170, 90), (math.log10(max(ratio, 1e-3)) + 3) / 3)
    return _mix((255, 215, 0), (150, 0, 0), math.log10(ratio) / 2)  # 1x .. 100x: yellow -> dark red


def heatmap_pixels(error_map: dict) -> list[list[tuple[int, int, int]]]:
    """[heads][token bins] colours from a record's error_map, then a white row and a row that marks
    (dark grey) the column where each request starts."""
    budget = float(error_map["budget"])
    values = error_map["values"]
    heads = int(error_map["heads"])

    def ratio(v: float | None) -> float | None:
        if v is None:
            return None
        return v / budget if budget > 0 else (0.0 if v == 0 else math.inf)

    rows = [[ratio_colour(ratio(col[h])) for col in values] for h in range(heads)]
    starts = {int(t) // int(error_map["token_bin"]) for t in error_map.get("request_starts", [])}
    rows.append([WHITE] * len(values))
    rows.append([TICK if i in starts else WHITE for i in range(len(values))])
    return rows


def probe_pixels(grid: list[str]) -> list[list[tuple[int, int, int]]]:
    return [[PROBE_COLOURS[c] for c in row] for row in grid]


def heatmap_cell(cols: int, rows: int, max_height: int) -> tuple[int, int]:
    """Display (width, height) of one heatmap cell: square where the map is wide enough, stretched
    sideways (to HEATMAP_MIN_WIDTH) where it is narrow, as a decode batch's few tokens are."""
    side = scale(cols, rows, max_height=max_height)
    return max(side, min(HEATMAP_MIN_WIDTH // max(cols, 1), 960 // max(cols, 1))), side


def worst_cell(error_map: dict) -> tuple[int, int]:
    """(token bin, head) of the worst cell: the first NaN/Inf one, else the largest error."""
    best, where_ = -1.0, (0, 0)
    for b, col in enumerate(error_map["values"]):
        for h, v in enumerate(col):
            if v is None:
                return b, h
            if v > best:
                best, where_ = v, (b, h)
    return where_


def scale(cols: int, rows: int, max_width: int = 960, max_height: int = 480) -> int:
    """Display pixels per cell: as large as fits, between 1 and 16."""
    return max(1, min(16, max_width // max(cols, 1), max_height // max(rows, 1)))


def img_tag(
    pixels: list[list[tuple[int, int, int]]],
    alt: str,
    css_class: str,
    max_height: int = 480,
    cell: tuple[int, int] | None = None,
) -> str:
    """An <img> with the PNG inline, scaled up without smoothing (square cells unless `cell` is given)."""
    rows, cols = len(pixels), len(pixels[0])
    s = scale(cols, rows, max_height=max_height)
    w, h = cell or (s, s)
    return (
        f'<img class="{css_class}" alt="{html.escape(alt)}" width="{cols * w}" height="{rows * h}" '
        f'src="{data_uri(pixels)}">'
    )
