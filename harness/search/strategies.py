"""Hypothesis strategies for Cases, one per suite family, constrained by a backend's capabilities.

Shapes are drawn first and the seed last, so shrinking walks towards a small batch with the same
structure. Lengths are biased to where bugs live: just around the window (W, W+1, 2W+1), around
page boundaries, empty prefixes, single requests, and extreme logits.
"""

from __future__ import annotations

from hypothesis import strategies as st

from harness.backends.base import ALL_CAPABILITIES, Capabilities
from harness.core.case import PAGE_LAYOUTS, Case, Request
from harness.core.modes import FAMILIES, FAMILY_MODE, Mode
from harness.search.profiles import Sizes

ALL_CAPS = ALL_CAPABILITIES  # no backend's limits: every case a family can have
# Per-tensor FP8 cache scales: 1 (an uncalibrated checkpoint), a calibrated one (the drawn N(0, 1)
# K/V span e4m3's range: 448 * 0.0173 = 7.75), and two more; 0.0173 and 3.7 are not powers of two, so
# dequantizing into the case dtype rounds. K and V draw theirs independently.
KV_SCALES = (1.0, 0.0173, 0.5, 3.7)


def _length(draw: st.DrawFn, lo: int, hi: int, anchors: list[int]) -> int:
    """An int in [lo, hi]: uniformly, or one of the anchors (window and page edges) when in range."""
    near = sorted({a for a in anchors if lo <= a <= hi})
    if near and draw(st.booleans()):
        return draw(st.sampled_from(near))
    return draw(st.integers(lo, hi))


def _anchors(window: int, page: int) -> list[int]:
    a = [page - 1, page, page + 1, 2 * page - 1, 2 * page + 1]
    if window >= 0:
        a += [window - 1, window, window + 1, window + 2, 2 * window + 1, 3 * window + 5]
    return a


def random_tree(draw: st.DrawFn, n: int, branching: bool) -> tuple[int, ...]:
    """Parents of n draft nodes: a chain, or a tree in which some node has two or more children."""
    if not branching or n < 3:
        return tuple(range(-1, n - 1))
    parents = [-1]
    for j in range(1, n):
        parents.append(draw(st.integers(0, j - 1)))
    if len(set(parents[1:])) == len(parents) - 1:  # every node has at most one child: add a fork
        parents[-1] = parents[-2]
    return tuple(parents)


@st.composite
def cases(draw: st.DrawFn, family: str, windowed: bool, caps: Capabilities, sizes: Sizes) -> Case:
    """A Case of one suite family that `caps` supports, sized by the profile."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    mode = FAMILY_MODE[family]
    dtypes = [d for d in sizes.dtypes if d in caps.dtypes] or sorted(caps.dtypes)
    dtype = draw(st.sampled_from(dtypes))
    heads = draw(st.sampled_from(sizes.heads))
    dims = [d for d in sizes.head_dims if caps.head_dims is None or d in caps.head_dims]
    head_dim = draw(st.sampled_from(dims or sorted(caps.head_dims)))
    page_size = draw(st.sampled_from(sorted(caps.page_sizes, key=lambda p: (p != 16, p))))
    page_layout = draw(st.sampled_from(("shuffled",) + tuple(x for x in PAGE_LAYOUTS if x != "shuffled")))
    kv_layout = draw(st.sampled_from(sorted(caps.kv_layouts, key=lambda x: x != "NHD")))
    window = draw(st.integers(0, sizes.max_window)) if windowed else -1
    anchors = _anchors(window, page_size)

    bsz = draw(st.integers(1, sizes.max_batch))
    num_draft = draw(st.integers(1, sizes.max_draft))
    branching = mode == Mode.TARGET_VERIFY and caps.tree and draw(st.booleans())
    long_prefix = sizes.long_kv > 0 and draw(st.integers(0, 9)) == 9
    max_prefix = sizes.long_kv if long_prefix else sizes.max_prefix
    cross_prefill = mode == Mode.CROSS and draw(st.booleans())  # else one decoder step each
    reqs = []
    for i in range(bsz):
        if family == "prefill" or cross_prefill:
            prefix = 0
        else:
            lo = 1 if family == "prefix" and i == 0 else 0
            prefix = _length(draw, lo, max_prefix, anchors)
        if mode == Mode.DECODE:
            extend = 1
        elif mode in (Mode.DRAFT_EXTEND_V2, Mode.TARGET_VERIFY):
            extend = num_draft
        elif mode == Mode.CROSS:
            extend = 1 if prefix else _length(draw, 1, sizes.max_extend, anchors)
        else:
            extend = _length(draw, 1, sizes.max_extend, anchors)
        reqs.append(
            Request(
                prefix_len=prefix,
                extend_len=extend,
                encoder_len=_length(draw, 1, sizes.max_encoder, anchors) if mode == Mode.CROSS else 0,
                tree=random_tree(draw, num_draft, branching) if mode == Mode.TARGET_VERIFY else None,
            )
        )

    soft_cap = draw(st.sampled_from((0.0, 0.0, 30.0, 5.0))) if caps.soft_cap else 0.0
    # Flags are drawn as "one in n" with the minimal draw meaning off, so shrinking turns them off.
    sinks = caps.sinks and draw(st.integers(0, 3)) == 3
    hybrid = windowed and caps.hybrid_pool and draw(st.integers(0, 2)) == 2
    deterministic = caps.deterministic and draw(st.integers(0, 4)) == 4
    kv_dtype, k_scale, v_scale = None, 1.0, 1.0  # an FP8 KV cache, where the backend reads one
    if caps.kv_dtypes and draw(st.integers(0, 3)) == 3:
        kv_dtype = draw(st.sampled_from(sorted(caps.kv_dtypes)))
        k_scale, v_scale = draw(st.sampled_from(KV_SCALES)), draw(st.sampled_from(KV_SCALES))
    sm_scale = draw(st.sampled_from((None, None, None, 0.05, 0.3)))
    q_amplitude = draw(st.sampled_from((1.0, 1.0, 1.0, 8.0, 30.0)))
    seed = draw(st.integers(0, 2**31 - 1))
    return Case(
        mode=mode,
        requests=tuple(reqs),
        num_q_heads=heads[0],
        num_kv_heads=heads[1],
        head_dim=head_dim,
        dtype=dtype,
        window_left=window,
        soft_cap=soft_cap,
        sinks=sinks,
        sm_scale=sm_scale,
        page_size=page_size,
        page_layout=page_layout,
        kv_layout=kv_layout,
        hybrid_swa_pool=hybrid,
        deterministic=deterministic,
        q_amplitude=q_amplitude,
        kv_dtype=kv_dtype,
        k_scale=k_scale,
        v_scale=v_scale,
        seed=seed,
    )
