"""The bench's mix: a fixed list of small cases, drawn from a seed, that a backend can run.

The suite's cases come from hypothesis (harness/search/strategies.py), which searches and shrinks;
the bench needs the same seeded mix on every run and every device so that its numbers compare, which
a hypothesis search does not give, hence this second, plain generator.
"""

from __future__ import annotations

import random

from harness.backends.base import Capabilities
from harness.core.case import PAGE_LAYOUTS, Case, Request
from harness.core.modes import Mode

# One head shape, dtype and page size, so a JIT backend compiles few variants (FA4: one per code
# path and query-tile count) and the numbers compare across backends and devices.
MIX_SHAPE = {"num_q_heads": 8, "num_kv_heads": 2, "head_dim": 128, "dtype": "bfloat16", "page_size": 16}
MAX_BATCH = 8
MAX_TOKENS = 512  # per request: prefix + extend (CROSS: encoder keys)
MAX_DRAFT = 8


def mix(seed: int, n: int, caps: Capabilities, max_tokens: int = MAX_TOKENS) -> list[Case]:
    """A fixed mix of n small cases that `caps` can run, drawn from random.Random(seed) so it replays.

    Modes rotate through every mode the backend supports, each with and without a window (when it
    has windows; never in CROSS); batch 1..8, up to `max_tokens` keys per request, a hybrid SWA pool
    on a quarter of the windowed cases, page layouts at random.
    """
    rng = random.Random(seed)
    modes = [m for m in Mode if m in caps.modes]
    out = []
    for i in range(n):
        mode = modes[i % len(modes)]
        windowed = caps.window and mode != Mode.CROSS and (i // len(modes)) % 2 == 1
        num_draft = rng.randint(1, MAX_DRAFT)
        reqs = [
            _request(rng, mode, num_draft, caps.tree, max_tokens) for _ in range(rng.randint(1, MAX_BATCH))
        ]
        window = rng.randint(16, 256) if windowed else -1
        out.append(
            Case(
                mode=mode,
                requests=tuple(reqs),
                window_left=window,
                page_layout=rng.choice(PAGE_LAYOUTS),
                hybrid_swa_pool=windowed and caps.hybrid_pool and rng.random() < 0.25,
                seed=rng.randrange(2**31),
                **MIX_SHAPE,
            )
        )
    return out


def _request(rng: random.Random, mode: Mode, num_draft: int, trees: bool, max_tokens: int) -> Request:
    t = rng.randint(1, max_tokens)
    if mode == Mode.EXTEND:
        prefix = rng.randint(0, t - 1) if rng.random() < 0.5 else 0
        return Request(prefix, t - prefix)
    if mode == Mode.DECODE:
        return Request(t - 1, 1)
    if mode == Mode.CROSS:
        return Request(0, rng.randint(1, 64), encoder_len=t)
    if mode == Mode.ENCODER_ONLY:
        return Request(0, t)
    tree = None
    if mode == Mode.TARGET_VERIFY:
        tree = tuple(range(-1, num_draft - 1))
        if trees and num_draft >= 3:
            tree = (-1,) + tuple(rng.randint(0, j - 1) for j in range(1, num_draft))
    return Request(max(0, t - num_draft), num_draft, tree=tree)
