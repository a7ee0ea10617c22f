"""Hypothesis strategies for Cases, one per suite family, constrained by a backend's capabilities.

Shapes are drawn first and the seed last, so shrinking walks towards a small batch with the same
structure. Lengths are biased to where bugs live: just around the window (W, W+1, 2W+1), around
page boundaries, empty prefixes, single requests, and extreme logits (large queries, a large sm_scale
with and without a soft cap, and the logit patterns of harness/core/logits.py: a large common offset,
a row carried by one key, a tie at the top); and to coincidences between
dimensions, where kernels take special paths: as many queries as keys (no prefix; a CROSS decoder
as long as its encoder), a prefix as long as the extend, key counts at a multiple of a kernel tile
(32, 64, 128) or one either side, requests of equal lengths side by side, and a window at least as
long as the context (it may then exceed the profile's max_window).
An encoder (ENCODER_ONLY) request is a whole input, as long as a prefix (long_kv in the gpu
profile); its window is left only, symmetric or any two-sided one where the backend has a right edge.
"""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import strategies as st

from harness.backends.base import ALL_CAPABILITIES, Capabilities
from harness.core.case import PAGE_LAYOUTS, Case, Request
from harness.core.graph_case import PER_BATCH_FIELDS, GraphCase, kv_extents, padding_extent
from harness.core.modes import FAMILIES, FAMILY_MODE, Mode
from harness.search.profiles import Sizes

ALL_CAPS = ALL_CAPABILITIES  # no backend's limits: every case a family can have
TILES = (32, 64, 128)  # key-tile widths of the kernels' main loops; a multiple leaves no partial tile
# Per-tensor FP8 cache scales: 1 (an uncalibrated checkpoint), a calibrated one (the drawn N(0, 1)
# K/V span e4m3's range: 448 * 0.0173 = 7.75), and two more; 0.0173 and 3.7 are not powers of two, so
# dequantizing into the case dtype rounds. K and V draw theirs independently.
KV_SCALES = (1.0, 0.0173, 0.5, 3.7)
# The softmax scales drawn: the model's default (None, the minimal draw), two of its own, and a large
# one (the logits' spread grows 16-fold over the default at head_dim 64) that a soft cap then folds.
SM_SCALES = (None, None, None, 0.05, 0.3, 2.0)
# Logit patterns (harness/core/logits.py), each one draw in seven: `plain` (the minimal draw) the rest.
# `offset`: past exp's float32 range (88.7 above, 103 below 0) in both directions, within what
# bfloat16 resolves. `dominant` and `ties` with no offset, the same, or below every finite mask
# sentinel a kernel might use in place of -inf (-1e4 here, in natural or base-2 units).
LOGIT_PATTERNS = ("offset", "dominant", "ties")
TOP_OFFSETS = (0.0, -120.0, 120.0, -3e4)
OFFSETS = {"offset": (-120.0, 120.0), "dominant": TOP_OFFSETS, "ties": TOP_OFFSETS}


def tile_edges(tile: int, lo: int, hi: int) -> list[int]:
    """Key counts in [lo, hi] at a multiple of `tile` or one either side."""
    multiples = range(max(1, (lo - 1) // tile), (hi + 1) // tile + 1)
    return [k for m in multiples for k in (m * tile - 1, m * tile, m * tile + 1) if lo <= k <= hi]


def _length(
    draw: st.DrawFn,
    lo: int,
    hi: int,
    edges: Iterable[int],
    equal: Iterable[int] = (),
    keys_offset: int | None = None,
) -> int:
    """An int in [lo, hi], each way a quarter of the time: uniformly, a window or page edge, a value
    equal to another dimension of the request (`equal`), or one that puts the request's key count
    (the value + `keys_offset`) on a tile edge. A way with no anchor in range draws uniformly."""
    kind = draw(st.integers(0, 7))  # the minimal draw is uniform: shrinking leaves the anchors
    pool: Iterable[int] = ()
    if kind in (2, 3):
        pool = edges
    elif kind in (4, 5):
        pool = equal
    elif kind in (6, 7) and keys_offset is not None:
        tiles = [t for t in TILES if tile_edges(t, lo + keys_offset, hi + keys_offset)]
        if tiles:
            tile = draw(st.sampled_from(tiles))
            pool = [k - keys_offset for k in tile_edges(tile, lo + keys_offset, hi + keys_offset)]
    near = sorted({a for a in pool if lo <= a <= hi})
    if near:
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
    """A Case of one suite family that `caps` supports, sized by the profile: the layer's shape, then
    the requests, then the layer's features, then the seed (so shrinking keeps the structure). The
    steps are plain functions given `draw`, not composites: a composite adds a span to the choice
    sequence, and hypothesis then generates other cases for the same seed."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    mode = FAMILY_MODE[family]
    shape = _layer_shape(draw, caps, sizes)
    window = draw(st.integers(0, sizes.max_window)) if windowed else -1
    reqs = _requests(draw, family, caps, sizes, _anchors(window, shape["page_size"]))
    if windowed and draw(st.integers(0, 4)) == 4:  # a window at least as long as the context
        longest = max(r.prefix_len + r.extend_len for r in reqs)
        window = longest + draw(st.sampled_from((0, -1, 1, longest)))  # -1: W + 1 keys, exactly all
    features = _features(draw, mode, windowed, window, caps, sizes)
    seed = draw(st.integers(0, 2**31 - 1))
    return Case(mode=mode, requests=tuple(reqs), window_left=window, seed=seed, **shape, **features)


def _layer_shape(draw: st.DrawFn, caps: Capabilities, sizes: Sizes) -> dict:
    """dtype, heads, head_dim, page size and layouts: the profile's, narrowed to what `caps` takes."""
    dtypes = [d for d in sizes.dtypes if d in caps.dtypes] or sorted(caps.dtypes)
    dtype = draw(st.sampled_from(dtypes))
    heads = draw(st.sampled_from(sizes.heads))
    dims = [d for d in sizes.head_dims if caps.head_dims is None or d in caps.head_dims]
    head_dim = draw(st.sampled_from(dims or sorted(caps.head_dims)))
    page_size = draw(st.sampled_from(sorted(caps.page_sizes, key=lambda p: (p != 16, p))))
    page_layout = draw(st.sampled_from(("shuffled",) + tuple(x for x in PAGE_LAYOUTS if x != "shuffled")))
    kv_layout = draw(st.sampled_from(sorted(caps.kv_layouts, key=lambda x: x != "NHD")))
    return dict(
        num_q_heads=heads[0],
        num_kv_heads=heads[1],
        head_dim=head_dim,
        dtype=dtype,
        page_size=page_size,
        page_layout=page_layout,
        kv_layout=kv_layout,
    )


def _requests(
    draw: st.DrawFn, family: str, caps: Capabilities, sizes: Sizes, anchors: list[int]
) -> list[Request]:
    """The batch's requests: lengths biased to the anchors; now and then one as long as its neighbour."""
    mode = FAMILY_MODE[family]
    bsz = draw(st.integers(1, sizes.max_batch))
    num_draft = draw(st.integers(1, sizes.max_draft))
    branching = mode == Mode.TARGET_VERIFY and caps.tree and draw(st.booleans())
    long_prefix = sizes.long_kv > 0 and draw(st.integers(0, 9)) == 9
    max_prefix = sizes.long_kv if long_prefix else sizes.max_prefix
    cross_prefill = mode == Mode.CROSS and draw(st.booleans())  # else one decoder step each
    reqs: list[Request] = []
    for i in range(bsz):
        tree = None
        if i and draw(st.integers(0, 3)) == 3:  # as long as its neighbour (its own tree, if any)
            prev = reqs[-1]
            tree = random_tree(draw, num_draft, branching) if mode == Mode.TARGET_VERIFY else None
            reqs.append(Request(prev.prefix_len, prev.extend_len, prev.encoder_len, tree))
            continue
        if mode == Mode.CROSS:  # keys are the encoder's: prefix and extend only place the queries
            prefix = 0 if cross_prefill else _length(draw, 0, max_prefix, anchors)
            extend = 1 if prefix else _length(draw, 1, sizes.max_extend, anchors)
            encoder = _length(draw, 1, sizes.max_encoder, anchors, equal=(extend,), keys_offset=0)
        else:  # keys are prefix + extend
            extend = _extend_len(draw, family, sizes, anchors, max_prefix, num_draft)
            prefix = 0
            if family not in ("prefill", "encoder"):
                lo = 1 if family == "prefix" and i == 0 else 0
                prefix = _length(draw, lo, max_prefix, anchors, equal=(0, extend), keys_offset=extend)
            encoder = 0
        tree = random_tree(draw, num_draft, branching) if mode == Mode.TARGET_VERIFY else None
        reqs.append(Request(prefix_len=prefix, extend_len=extend, encoder_len=encoder, tree=tree))
    return reqs


def _extend_len(
    draw: st.DrawFn, family: str, sizes: Sizes, anchors: list[int], max_prefix: int, num_draft: int
) -> int:
    """New tokens of a self-attention request: one (DECODE), the drafts (DRAFT_EXTEND_V2, verify), a
    whole input as long as a prefix (ENCODER_ONLY), else a drawn extend."""
    mode = FAMILY_MODE[family]
    if mode == Mode.DECODE:
        return 1
    if mode == Mode.ENCODER_ONLY:  # a whole input per request, of mixed lengths: as long as a prefix
        return _length(draw, 1, max_prefix, anchors, keys_offset=0)
    if mode in (Mode.DRAFT_EXTEND_V2, Mode.TARGET_VERIFY):
        return num_draft
    fresh = family == "prefill"
    return _length(draw, 1, sizes.max_extend, anchors, keys_offset=0 if fresh else None)


def _features(
    draw: st.DrawFn, mode: Mode, windowed: bool, window: int, caps: Capabilities, sizes: Sizes
) -> dict:
    """The layer's features `caps` declares, each drawn as "one in n" with the minimal draw meaning
    off, so shrinking turns them off."""
    window_right = -1
    if mode == Mode.ENCODER_ONLY and windowed and caps.window_right:
        side = draw(st.integers(0, 2))  # 0: left only (the minimal draw); 1: symmetric (HF's); 2: any
        if side == 1:
            window_right = window
        elif side == 2:
            window_right = draw(st.integers(0, sizes.max_window))
    soft_cap = draw(st.sampled_from((0.0, 0.0, 30.0, 5.0))) if caps.soft_cap else 0.0
    sinks = caps.sinks and draw(st.integers(0, 3)) == 3
    hybrid = windowed and caps.hybrid_pool and draw(st.integers(0, 2)) == 2
    deterministic = caps.deterministic and draw(st.integers(0, 4)) == 4
    kv_dtype, k_scale, v_scale = None, 1.0, 1.0  # an FP8 KV cache, where the backend reads one
    if caps.kv_dtypes and draw(st.integers(0, 3)) == 3:
        kv_dtype = draw(st.sampled_from(sorted(caps.kv_dtypes)))
        k_scale, v_scale = draw(st.sampled_from(KV_SCALES)), draw(st.sampled_from(KV_SCALES))
    logits, logit_offset = "plain", 0.0  # a pattern writes a key component an FP8 cache cannot hold
    kind = draw(st.integers(0, 6))
    if kind >= 4 and kv_dtype is None:
        logits = LOGIT_PATTERNS[kind - 4]
        logit_offset = draw(st.sampled_from([o for o in OFFSETS[logits] if o >= 0 or not sinks]))
    return dict(
        window_right=window_right,
        soft_cap=soft_cap,
        sinks=sinks,
        sm_scale=draw(st.sampled_from(SM_SCALES)),
        hybrid_swa_pool=hybrid,
        deterministic=deterministic,
        q_amplitude=draw(st.sampled_from((1.0, 1.0, 1.0, 8.0, 30.0))),
        kv_dtype=kv_dtype,
        k_scale=k_scale,
        v_scale=v_scale,
        logits=logits,
        logit_offset=logit_offset,
    )


# The graph families: the suite families whose modes engines capture under a CUDA graph.
GRAPH_FAMILIES = ("decode", "verify", "draft_extend_v2")


@st.composite
def graph_cases(draw: st.DrawFn, family: str, windowed: bool, caps: Capabilities, sizes: Sizes) -> GraphCase:
    """A replay sequence (harness/core/graph_case.py): two to five batches of one layer, each drawn as
    `cases` draws a batch of the family, then given the first batch's layer and queries per request;
    half the time ordered largest first (a smaller batch after a larger one, its page-table rows and
    slots left behind). The limits hold every batch, with room to spare: a batch runs padded to a
    larger captured size than its own, and contexts are longer than the dummy batch's at capture."""
    if family not in GRAPH_FAMILIES:
        raise ValueError(f"{family!r} is not captured; graph families: {', '.join(GRAPH_FAMILIES)}")
    first = draw(cases(family, windowed, caps, sizes))
    layer = {k: v for k, v in first.to_dict().items() if k not in PER_BATCH_FIELDS}
    queries = first.requests[0].extend_len
    branching = caps.tree and any(p != j - 1 for r in first.requests if r.tree for j, p in enumerate(r.tree))
    batches = [first]
    for _ in range(draw(st.integers(1, 4))):
        c = draw(cases(family, windowed, caps, sizes))
        reqs = tuple(
            Request(
                r.prefix_len,
                queries,
                tree=random_tree(draw, queries, branching) if first.mode == Mode.TARGET_VERIFY else None,
            )
            for r in c.requests
        )
        per_batch = {k: v for k, v in c.to_dict().items() if k in PER_BATCH_FIELDS and k != "requests"}
        batches.append(Case(**{**layer, **per_batch, "requests": reqs}))
    if draw(st.booleans()):
        batches.sort(key=lambda b: -b.batch_size)
    longest = max(max(kv_extents(b)) for b in batches)
    padding = padding_extent(first.mode, queries)
    max_batch = max(b.batch_size for b in batches) + draw(st.sampled_from((0, 0, 1, 5)))
    max_kv = max(longest, padding) + draw(st.sampled_from((0, 1, 64)))
    return GraphCase(tuple(batches), max_batch, max_kv)
