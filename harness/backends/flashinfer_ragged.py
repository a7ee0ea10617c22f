"""flashinfer_ragged: EXTEND as engines run it with FlashInfer, ragged + paged + merge_state.

The ragged pass attends over this forward's K/V with `window_left`; the paged prefix pass reads only
the pages from the first query's window start on, with a custom mask from global positions and no
`window_left` (FlashInfer would anchor it at the prefix end); `merge_state` combines them by LSE.
docs/flashinfer.md, "The ragged + paged window". ENCODER_ONLY takes the same path as an engine's
ragged prefill does: the ragged pass with causal=False (and `window_left` on a windowed layer), no
cached prefix to merge, and the K/V written to the pool afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harness.backends.base import BackendOutput
from harness.backends.flashinfer_glue import PREFILL_NOT_INVARIANT, FlashInferGlue, capabilities, flashinfer
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.core.timing import phase
from harness.core.transfer import to_device
from harness.core.vocab import TORCH_DTYPES


@dataclass(frozen=True)
class PrefixPass:
    """How the paged pass over the cached prefix is planned."""

    ranges: list[tuple[int, int]]  # [lo, P) key positions per request
    window_left: int  # given to plan
    custom_mask: torch.Tensor | None  # flat bool, request-major, [E, P - lo] row-major each


class FlashInferRagged(FlashInferGlue):
    name = "flashinfer_ragged"
    capabilities = capabilities(
        {Mode.EXTEND, Mode.ENCODER_ONLY},
        ("window", "soft_cap", "hybrid_pool", "returns_lse"),
        why_not={
            "graph": "EXTEND and ENCODER_ONLY, the modes it runs, are not captured by engines (prefills "
            "run eagerly)",
            "deterministic": PREFILL_NOT_INVARIANT,
            "sinks": "FlashInfer has no sink variant of the ragged wrapper "
            "(flashinfer_paged runs sinks through BatchAttentionWithAttentionSinkWrapper)",
        },
    )

    def ragged_window(self, batch: Batch) -> int:
        """The ragged pass's window: its KV ends at the last new token, where FlashInfer anchors it."""
        return self.window_left(batch)

    def plan_ragged(self, wrapper: Any, batch: Batch, qo_indptr: torch.Tensor, options: dict) -> None:
        """Queries and in-flight keys share one indptr; causal but in ENCODER_ONLY; split size in
        tokens (no pages). The in-flight K/V are the model's, in its dtype, whatever the cache stores."""
        c = batch.case
        wrapper.plan(
            qo_indptr,
            qo_indptr,
            c.num_q_heads,
            c.num_kv_heads,
            c.head_dim,
            causal=self.causal(batch),
            **{**options, "kv_data_type": TORCH_DTYPES[c.dtype]},
            **self.split_options(batch, 1),
        )

    def prefix_pass(self, batch: Batch) -> PrefixPass:
        """The prefix keys to read and how to mask them (see the module docstring)."""
        w = self.window_left(batch)
        prefix = batch.cpu_list("prefix_lens")
        if w < 0:
            return PrefixPass([(0, p) for p in prefix], -1, None)
        ranges = [(self.kv_start(batch, r), p) for r, p in enumerate(prefix)]
        rows = []  # on the host, from the host positions, then one copy (not one per request)
        for r, (lo, p) in enumerate(ranges):
            qpos = np.array(self.query_positions(batch, r))
            rows.append((np.arange(lo, p)[None, :] >= qpos[:, None] - w).ravel())
        return PrefixPass(ranges, -1, to_device(np.concatenate(rows), batch.device))

    def merge(
        self, o_a: torch.Tensor, s_a: torch.Tensor, o_b: torch.Tensor, s_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Combine two partial attentions by their LSE: FlashInfer's merge_state, base 2 in and out."""
        return flashinfer().merge_state(o_a, s_a, o_b, s_b)

    def run(self, batch: Batch) -> BackendOutput:
        with phase("plan"):
            qo = batch.host_tensor("qo_indptr")
            ragged = self.wrapper("ragged", batch)
            self.plan_ragged(ragged, batch, qo, self.kernel_options(batch, self.ragged_window(batch)))
        out, lse = ragged.run(batch.q, batch.k_new, batch.v_new, return_lse=True)
        with phase("plan"):
            pre = self.prefix_pass(batch)
            cached = any(hi > lo for lo, hi in pre.ranges)  # some request has cached keys to read
            if cached:
                table = self.page_table(batch, pre.ranges)
                paged = self.wrapper("paged", batch)
                options = self.kernel_options(batch, pre.window_left)
                self.plan_paged(paged, batch, table, False, options, pre.custom_mask)
        if cached:
            out_p, lse_p = paged.run(batch.q, self.kv_cache(batch), return_lse=True, **self.run_scales(batch))
            out, lse = self.merge(out, lse, out_p, lse_p)
        self.write_kv(batch)
        return BackendOutput(out=out, lse=self.natural_lse(lse))


BACKENDS = {"flashinfer_ragged": FlashInferRagged}
