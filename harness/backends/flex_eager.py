"""flex_eager: flex_attention without torch.compile, flex's own unfused implementation.

The glue is FlexBase's (flex.py); this variant only decides how many requests a launch holds, which
mask terms it evaluates, and calls flex's unfused path directly (docs/flex.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from harness.backends.flex import FlexBase, _flex_api
from harness.backends.flex_launch import Launch, MaskMod, ScoreMod, soft_capped, with_sink_key
from harness.core.batch import Batch


class FlexEager(FlexBase):
    """flex_attention without torch.compile: flex's own unfused implementation (scores in fp32)."""

    name = "flex_eager"
    # The unfused path materialises [Hq, Lq, Lk] scores over the whole packed grid (every request's
    # queries against every request's keys): launches are split to bound that.
    max_scores = 1 << 27
    # Wasted scores (query head x query x another request's key, in the packed grid) that cost about
    # as much as one more launch's host time (pack, BlockMask, flex's vmaps). CPU: tuned on the
    # bench mix on the CPU runner (up to 2^14 wasted pairs x 8 heads: 29-33 ms per case against 84 ms
    # with the whole batch in one launch; docs/flex.md). CUDA: an estimate (about 2 ms of host time per launch
    # against ~10 fp32 passes per score at the H100's bandwidth), not a measurement, which keeps the
    # bench's batches in one launch there.
    waste_per_launch = {"cpu": 1 << 17, "cuda": 1 << 26}

    def mask_terms(self, launch: Launch) -> frozenset[str]:
        """Only the terms the batch needs: the unfused path evaluates each one through vmap on every
        call, and it compiles nothing that a changing mask would invalidate."""
        return launch.terms

    def launches(self, batch: Batch) -> list[list[int]]:
        """Consecutive requests share a launch while the packed grid stays under `max_scores` and its
        cross-request waste under `waste_per_launch` (one launch per request in deterministic mode)."""
        if batch.case.deterministic:
            return super().launches(batch)
        heads, waste = batch.case.num_q_heads, self.waste_per_launch.get(batch.device.type, 1 << 26)
        groups: list[list[int]] = []
        qo = batch.cpu_list("qo_indptr")
        kv = self.kv_extents(batch)
        nq = nk = own = 0
        for r in range(batch.batch_size):
            q, k = qo[r + 1] - qo[r], kv[r] + 1
            grid = (nq + q) * (nk + k)
            too_big, too_wasteful = grid * heads > self.max_scores, (grid - own - q * k) * heads > waste
            if groups and (too_big or too_wasteful):
                groups.append([])
                nq = nk = own = 0
            if not groups:
                groups.append([])
            groups[-1].append(r)
            nq, nk, own = nq + q, nk + k, own + q * k
        return groups

    def flex_mask_mod(self, launch: Launch, visible: torch.Tensor) -> MaskMod:
        """A lookup into the launch's visibility grid (`visible_grid`: the glue's `mask_mod` evaluated
        once by broadcasting). The eager kernel evaluates its mask_mod through four nested vmaps, where
        every tensor operation of the mask costs pytree and functorch dispatch in Python (most of the
        32 ms of host time a launch cost on the CPU runner; docs/flex.md); a lookup is one operation.
        The same terms decide the same visibility, so it is the same mask."""

        lq, lk = launch.q.shape[2], launch.k.shape[2]
        nq, nk = visible.shape
        grid = visible if (nq, nk) == (lq, lk) else torch.nn.functional.pad(visible, (0, lk - nk, 0, lq - nq))

        def looked_up(b, h, q, k):  # noqa: ANN001, ANN202 - flex's mask_mod signature
            # aten.index directly: `grid[q, k]` becomes flex's ModIndex autograd function under its
            # vmaps, twice the host time for the same lookup
            return torch.ops.aten.index.Tensor(grid, [q, k])

        return looked_up

    def score_mod(self, launch: Launch) -> ScoreMod | None:
        """Only the terms the launch needs, as `mask_terms`: the unfused path applies a score_mod
        through the same nested vmaps as the mask, where each tensor operation costs pytree and
        functorch dispatch in Python (the shared function's ten operations were 3.5 of the 7.2 s of
        a Gemma2 model check on the CPU runner). None (flex's identity) without a soft cap or a
        virtual sink key. Each gives the shared function's scores bit for bit (tests/test_flex.py)."""
        terms = launch.score_terms
        if terms == {"cap"}:  # cap > 0 here: c * tanh(s / c), as the shared function's selected branch
            cap = launch.cap

            def capped(s, b, h, q, k):  # noqa: ANN001, ANN202 - flex's score_mod signature
                return soft_capped(s, cap)

            return capped
        if terms == {"sink"}:
            kv_sink, sink_logit = launch.kv_sink, launch.sink_logit

            def sink_key(s, b, h, q, k):  # noqa: ANN001, ANN202
                return with_sink_key(s, h, k, kv_sink, sink_logit)

            return sink_key
        return super().score_mod(launch) if terms else None

    def kernel(self, device: str) -> Callable:
        return _flex_api()[0]

    @contextmanager
    def calling(self) -> Iterator[None]:
        """Without flex's warning "called without torch.compile()" (that is this variant's point), and
        without the dynamo wrapper eager flex puts around its unfused implementation
        (`torch.compile(backend="eager")`, `_eager_without_dynamo`)."""
        with warnings.catch_warnings(), _eager_without_dynamo():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            yield


# The flag flex reads on every eager call: True runs its unfused implementation directly, False
# (torch's default) through torch.compile(backend="eager"), which traces a graph anew for every new
# mask, score function and shape (about a second each on the CPU runner; docs/flex.md).
DISABLE_COMPILE_FLAG = "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG"


@contextmanager
def _eager_without_dynamo() -> Iterator[None]:
    """flex's unfused implementation called directly, as flex's own debug flag does: the same
    operations as under the eager-backend wrapper (tests/test_flex.py compares the outputs bit for
    bit), without dynamo tracing. A torch without the flag keeps its wrapper."""
    from torch.nn.attention import flex_attention as fa

    if not hasattr(fa, DISABLE_COMPILE_FLAG):
        yield
        return
    before = getattr(fa, DISABLE_COMPILE_FLAG)
    setattr(fa, DISABLE_COMPILE_FLAG, True)
    try:
        yield
    finally:
        setattr(fa, DISABLE_COMPILE_FLAG, before)


BACKENDS = {"flex_eager": FlexEager}
