"""The flex glue's mask and score functions, built from a Launch's index tensors (written
independently of references/masks.py): who sees whom, and what a score becomes (soft cap, sink key).

A mixin of FlexBase (flex.py), one decision per method, so that a mutant overrides one term; the
BlockMask is reduced from the same mask evaluated once (flex_blocks.py).
"""

from __future__ import annotations

import torch

from harness.backends.flex_blocks import block_mask_from_grid
from harness.backends.flex_launch import MASK_TERMS, Launch, MaskMod, ScoreMod, soft_capped, with_sink_key


class FlexMasks:
    """The mask_mod and score_mod of a launch, term by term."""

    def document_mask(self, q_doc: torch.Tensor, kv_doc: torch.Tensor) -> MaskMod:
        def same_request(b, h, q, k):  # noqa: ANN001, ANN202 - flex's mask_mod signature
            return q_doc[q] == kv_doc[k]

        return same_request

    def causal_mask(self, q_pos: torch.Tensor, kv_pos: torch.Tensor, causal: torch.Tensor) -> MaskMod:
        """Keys up to the query's position; every key where the launch's `causal` flag is 0 (an
        encoder-only batch), so one compiled function serves both."""

        def causal_or_not(b, h, q, k):  # noqa: ANN001, ANN202
            return (kv_pos[k] <= q_pos[q]) | (causal == 0)

        return causal_or_not

    def window_mask(self, q_pos: torch.Tensor, kv_pos: torch.Tensor, window: torch.Tensor) -> MaskMod:
        """Sliding window: a query at p keeps keys p - W .. p (W + 1 keys)."""

        def in_window(b, h, q, k):  # noqa: ANN001, ANN202
            return kv_pos[k] >= q_pos[q] - window

        return in_window

    def window_right_mask(
        self, q_pos: torch.Tensor, kv_pos: torch.Tensor, window_right: torch.Tensor
    ) -> MaskMod:
        """A two-sided (encoder) window's right edge: a query at p keeps keys up to p + R."""

        def in_right_window(b, h, q, k):  # noqa: ANN001, ANN202
            return kv_pos[k] <= q_pos[q] + window_right

        return in_right_window

    def tree_mask(self, q_tree_row: torch.Tensor, kv_draft: torch.Tensor, tree: torch.Tensor) -> MaskMod:
        """Verify: a draft key is visible to its descendants and itself (batch.tree_mask)."""

        def ancestor_or_self(b, h, q, k):  # noqa: ANN001, ANN202
            d = kv_draft[k]
            return (d < 0) | (tree[q_tree_row[q] + d.clamp(min=0)] != 0)

        return ancestor_or_self

    def free_keys(self, kv_free: torch.Tensor) -> MaskMod:
        def seen_by_all(b, h, q, k):  # noqa: ANN001, ANN202
            return kv_free[k] != 0

        return seen_by_all

    def mask_terms(self, launch: Launch) -> frozenset[str]:
        """Every term, always: one function for every batch, so a compiled kernel is reused (a term a
        batch does not use admits every key: NO_WINDOW, causal flag 0, no drafts, no free keys)."""
        return MASK_TERMS

    def mask_mod(self, launch: Launch) -> MaskMod:
        """Same request, and either a key every query sees (`free`) or one that is causal & in the
        window (both edges) & in the tree (the terms of `mask_terms`)."""
        terms = self.mask_terms(launch)
        same = self.document_mask(launch.q_doc, launch.kv_doc)
        free = self.free_keys(launch.kv_free) if "free" in terms else None
        ordered = []
        if "causal" in terms:
            ordered.append(self.causal_mask(launch.q_pos, launch.kv_pos, launch.causal))
        if "window" in terms:
            ordered.append(self.window_mask(launch.q_pos, launch.kv_pos, launch.window))
        if "window_right" in terms:
            ordered.append(self.window_right_mask(launch.q_pos, launch.kv_pos, launch.window_right))
        if "tree" in terms:
            ordered.append(self.tree_mask(launch.q_tree_row, launch.kv_draft, launch.tree))

        def visible(b, h, q, k):  # noqa: ANN001, ANN202
            vis = same(b, h, q, k)
            if not ordered:  # CROSS, or ENCODER_ONLY without a window: every key of the request
                return vis
            seen = ordered[0](b, h, q, k)
            for term in ordered[1:]:
                seen = seen & term(b, h, q, k)
            if free is not None:
                seen = seen | free(b, h, q, k)
            return vis & seen

        return visible

    def score_mod(self, launch: Launch) -> ScoreMod:
        """Soft cap c > 0: c * tanh(s / c) on the scaled score; the sink key scores its logit."""
        cap, kv_sink, sink_logit = launch.cap, launch.kv_sink, launch.sink_logit
        safe = torch.where(cap > 0, cap, torch.ones_like(cap))

        def capped_or_sink(s, b, h, q, k):  # noqa: ANN001, ANN202
            return with_sink_key(torch.where(cap > 0, soft_capped(s, safe), s), h, k, kv_sink, sink_logit)

        return capped_or_sink

    def visible_grid(self, launch: Launch) -> torch.Tensor:
        """`mask_mod` evaluated once over the launch's real rows and keys, [num_queries, num_keys] bool,
        by broadcasting its index tensors: a dozen tensor operations, where flex's own evaluation
        (create_block_mask, the eager kernel) goes through four nested vmaps with Python dispatch for
        each operation. Padding rows and keys (document ids -1 / -2) see nothing and are left out."""
        nq, nk = launch.num_queries, launch.num_keys
        dev = launch.q.device
        zero = torch.zeros((), dtype=torch.int64, device=dev)
        rows = torch.arange(nq, device=dev)[:, None]
        cols = torch.arange(nk, device=dev)[None, :]
        return self.mask_mod(launch)(zero, zero, rows, cols).expand(nq, nk)

    def block_mask(self, launch: Launch):  # noqa: ANN201 - a flex BlockMask
        """The launch's BlockMask, reduced from its visibility grid (flex_blocks.py: the blocks
        create_block_mask would find, without its vmaps), with `flex_mask_mod` for partial blocks."""
        visible = self.visible_grid(launch)
        lengths = (launch.q.shape[2], launch.k.shape[2])
        return block_mask_from_grid(visible, lengths, self.flex_mask_mod(launch, visible))

    def flex_mask_mod(self, launch: Launch, visible: torch.Tensor) -> MaskMod:
        """The mask_mod handed to flex (the BlockMask carries it into the kernel): `mask_mod` itself."""
        return self.mask_mod(launch)

    def apply_sinks(self, out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
        """out [1, Hq, L, D] * exp(lse) / (exp(lse) + exp(sink)), as sigmoid(lse - sink): stable, and
        0 where no key is visible (lse = -inf)."""
        factor = torch.sigmoid(lse.float() - sinks.float().view(1, -1, 1))
        return (out.float() * factor.unsqueeze(-1)).to(out.dtype)
