"""Logit patterns: the extremes of the value space a Case can ask its inputs to take.

Kernels keep finite mask sentinels, base-2 exponent tricks and online-softmax rescales whose
failures live where the ordinary draw (standard normal Q and K) never goes. A pattern writes one
component of the drawn queries and keys (feature 0, the "shared direction"): every query holds `a`
there and key j holds c_j, so key j's logit gains scale * a * c_j, the same for every query:
- plain: nothing changed (the default, and the minimal draw);
- offset: every key the same c, so every logit of every row shares the common offset L
  (`logit_offset`): the row max sits far from 0 while the softmax is unchanged;
- dominant: one key per request and KV head `gap` above the offset, so the rows that see it are
  carried by that one key;
- ties: several keys per request and KV head share one key vector and sit `gap` above the offset,
  so every row that sees them has a tie at its top.
Pure arithmetic: harness/core/case.py validates with it, harness/core/batch.py draws.
"""

from __future__ import annotations

import math

PATTERNS = ("plain", "offset", "dominant", "ties")
TIED_KEYS = 4  # keys that share the top logit under `ties` (fewer when the request has fewer)
MAX_OFFSET = 1e5  # |logit_offset| at most: past every finite sentinel a kernel uses
# The largest common offset `offset` may take in each dtype: the native reference rounds logits to the
# case dtype, and beyond this a logit's rounding (half its spacing, 0.25) would change every row's
# softmax by more than the budget can judge. `dominant` and `ties` have no such limit: their gap
# grows with the offset, so the rounding never reaches the top of a row.
OFFSET_RESOLVED = {"bfloat16": 128.0, "float16": 1024.0, "float32": MAX_OFFSET}
# The largest finite value of each dtype: a component the pattern writes must stay well inside it.
FLOAT_MAX = {"bfloat16": 3.3895313892515355e38, "float16": 65504.0, "float32": 3.4028234663852886e38}


def spread(scale: float, q_amplitude: float, head_dim: int) -> float:
    """The standard deviation of an ordinary logit."""
    return scale * q_amplitude * math.sqrt(head_dim)


def gap(offset: float, scale: float, q_amplitude: float, head_dim: int) -> float:
    """How far a dominant or tied key sits above the offset, in logit units: six ordinary spreads
    (every other key of its row below it), plus 20 (weight e^-20 each), plus |offset| / 16 (far
    more than the native reference's rounding of a logit that large, 1/512 of it in bfloat16)."""
    return 20.0 + 6.0 * spread(scale, q_amplitude, head_dim) + abs(offset) / 16.0


def components(
    pattern: str, offset: float, scale: float, q_amplitude: float, head_dim: int
) -> tuple[float, float, float]:
    """(a, c, g): the queries' shared component a (a power of two), every key's c, and the extra g of
    a dominant or tied key, with scale * a * c = offset and scale * a * g = gap (before rounding to
    the case dtype: the references read the rounded values, so the offset is about L, not exactly).
    a and c are balanced (each about sqrt(|offset| / scale)) so both stay small for the dtype."""
    top = gap(offset, scale, q_amplitude, head_dim) if pattern in ("dominant", "ties") else 0.0
    reach = abs(offset) + top
    a = 2.0 ** round(math.log2(max(math.sqrt(reach / scale), 1.0)))
    return a, offset / (scale * a), top / (scale * a)


def largest_component(pattern: str, offset: float, scale: float, q_amplitude: float, head_dim: int) -> float:
    """The largest magnitude the pattern writes into a query or a key (0 for plain)."""
    if pattern == "plain":
        return 0.0
    a, c, g = components(pattern, offset, scale, q_amplitude, head_dim)
    return max(a, abs(c) + g)


def reach(pattern: str, offset: float, scale: float, q_amplitude: float, head_dim: int) -> float:
    """The most the pattern adds to a logit's magnitude."""
    if pattern == "plain":
        return 0.0
    top = gap(offset, scale, q_amplitude, head_dim) if pattern in ("dominant", "ties") else 0.0
    return abs(offset) + top
