"""flashinfer_dec_cc / flashinfer_dec_tc: FlashInfer's decode wrapper on CUDA cores and on tensor cores.

The two take different kernels: CUDA cores run FlashInfer's decode kernel (one query per
request); tensor cores run its prefill kernel with one query row per request, or a
bottom-right causal block of `q_len_per_req` rows, which is how engines verify draft chains and
run DRAFT_EXTEND_V2 through a decode wrapper. A tree (topk > 1) needs a custom mask, which the
decode wrapper has no way to take: flashinfer_paged verifies trees.

What 0.7.2.post1 does not do, declared as skips: the CUDA-core plan rejects `fixed_split_size`
and never forwards `disable_split_kv`, so its split-KV follows the batch (deterministic mode needs
tensor cores, as sglang switches to); and both decode paths accept `sinks=` at run() and drop it.
"""

from __future__ import annotations

from typing import Any

from harness.backends.base import BackendOutput
from harness.backends.flashinfer_glue import (
    KERNEL_BACKEND,
    FlashInferGlue,
    PageTable,
    capabilities,
    flashinfer,
    workspace,
)
from harness.backends.graph_glue import GraphState
from harness.core.batch import Batch
from harness.core.case import Case
from harness.core.modes import Mode
from harness.core.timing import phase

SINKS_DROPPED = (
    "FlashInfer 0.7.2.post1's fa2 decode paths accept sinks= at run() and drop them "
    "(flashinfer_paged runs sinks through BatchAttentionWithAttentionSinkWrapper)"
)
CUDA_CORE_GROUP_SIZES = frozenset({1, 2, 3, 4, 6, 8, 16})  # the decode kernel's GQA dispatch


class _FlashInferDecode(FlashInferGlue):
    kind = ""  # the wrapper kind: decode_tc or decode_cc
    split_tokens = 2048  # sglang's decode default

    def run(self, batch: Batch) -> BackendOutput:
        self.write_kv(batch)
        with phase("plan"):
            table = self.page_table(batch, self.key_ranges(batch))
            wrapper = self.wrapper(self.kind, batch)
            q_len = batch.case.requests[0].extend_len  # one per request, the same for the whole batch
            options = self.kernel_options(batch, self.window_left(batch))
            self.plan_decode(wrapper, batch, table, options, q_len)
        out, lse = wrapper.run(batch.q, self.kv_cache(batch), return_lse=True, **self.run_scales(batch))
        return BackendOutput(out=out, lse=self.natural_lse(lse))

    def graph_wrapper(self, state: GraphState, bs: int) -> Any:
        """The decode wrapper with use_cuda_graph=True over the first bs + 1 / bs entries of the
        indptr / last-page buffers (its fixed batch size) and the whole indices buffer."""
        b = state.buffers
        return flashinfer().BatchDecodeWithPagedKVCacheWrapper(
            workspace(state.device),
            state.layer.case.kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=self.kind == "decode_tc",
            paged_kv_indptr_buffer=b["kv_indptr"][: bs + 1],
            paged_kv_indices_buffer=b["kv_indices"],
            paged_kv_last_page_len_buffer=b["kv_last_page_len"][:bs],
            backend=KERNEL_BACKEND,
        )

    def plan_graph(self, state: GraphState, bs: int, table: PageTable, options: dict) -> None:
        args, kwargs = self.plan_arguments(state.layer, table, options["options"], options["split"])
        state.per_size[bs].plan(*args, q_len_per_req=state.limits.queries, **kwargs)


class FlashInferDecCC(_FlashInferDecode):
    name = "flashinfer_dec_cc"
    kind = "decode_cc"
    capabilities = capabilities(
        {Mode.DECODE},
        ("window", "soft_cap", "hybrid_pool", "returns_lse"),
        graph_modes=frozenset({Mode.DECODE}),
        why_not={
            "deterministic": "FlashInfer 0.7.2.post1's CUDA-core decode plan rejects fixed_split_size "
            "and ignores disable_split_kv, so its split-KV follows the batch (flashinfer_dec_tc pins it)",
            "sinks": SINKS_DROPPED,
            "DRAFT_EXTEND_V2": "the CUDA-core decode kernel takes one query per request "
            "(flashinfer_dec_tc runs q_len_per_req > 1)",
            "TARGET_VERIFY": "the CUDA-core decode kernel takes one query per request "
            "(flashinfer_dec_tc verifies chains, flashinfer_paged trees)",
        },
    )

    def supports(self, case: Case) -> str | None:
        why = super().supports(case)
        group = case.num_q_heads // case.num_kv_heads
        if why is None and group not in CUDA_CORE_GROUP_SIZES:
            return f"FlashInfer's CUDA-core decode kernel has no GQA group size {group}"
        return why


class FlashInferDecTC(_FlashInferDecode):
    name = "flashinfer_dec_tc"
    kind = "decode_tc"
    capabilities = capabilities(
        {Mode.DECODE, Mode.DRAFT_EXTEND_V2, Mode.TARGET_VERIFY},
        ("window", "soft_cap", "hybrid_pool", "deterministic", "returns_lse"),
        graph_modes=frozenset({Mode.DECODE, Mode.DRAFT_EXTEND_V2, Mode.TARGET_VERIFY}),
        why_not={
            "sinks": SINKS_DROPPED,
            "tree": "the decode wrapper masks q_len_per_req rows causally and takes no custom mask "
            "(flashinfer_paged verifies trees)",
        },
    )


BACKENDS = {"flashinfer_dec_cc": FlashInferDecCC, "flashinfer_dec_tc": FlashInferDecTC}
