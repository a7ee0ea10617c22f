"""flashinfer_dec_cc / _tc: FlashInfer's decode wrapper on CUDA cores (its decode kernel, one query
per request) and on tensor cores (its prefill kernel: one row or a bottom-right causal block of
`q_len_per_req` rows per request, as engines run drafts). Skips: docs/flashinfer.md.
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

SINKS_DROPPED = "FlashInfer's fa2 decode paths take sinks= and drop them (use flashinfer_paged)"
CUDA_CORE_GROUP_SIZES = frozenset({1, 2, 3, 4, 6, 8, 16})  # the decode kernel's GQA dispatch


class _FlashInferDecode(FlashInferGlue):
    kind = ""  # decode_tc or decode_cc
    split_tokens = 2048  # sglang's decode default

    def run(self, batch: Batch) -> BackendOutput:
        self.write_kv(batch)
        with phase("plan"):
            table = self.page_table(batch, self.key_ranges(batch))
            wrapper = self.wrapper(self.kind, batch)
            q_len = batch.case.requests[0].extend_len  # the same for every request
            options = self.kernel_options(batch, self.window_left(batch))
            self.plan_decode(wrapper, batch, table, options, q_len)
        out, lse = wrapper.run(batch.q, self.kv_cache(batch), return_lse=True, **self.run_scales(batch))
        return BackendOutput(out=out, lse=self.natural_lse(lse))

    def graph_wrapper(self, state: GraphState, bs: int) -> Any:
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
            "deterministic": "the CUDA-core plan rejects fixed_split_size, ignores disable_split_kv "
            "(use flashinfer_dec_tc)",
            "sinks": SINKS_DROPPED,
            "DRAFT_EXTEND_V2": "one query per request on CUDA cores (use flashinfer_dec_tc)",
            "TARGET_VERIFY": "one query per request on CUDA cores (use flashinfer_dec_tc)",
        },
    )

    def supports(self, case: Case) -> str | None:
        why = super().supports(case)
        group = case.num_q_heads // case.num_kv_heads
        if why is None and group not in CUDA_CORE_GROUP_SIZES:
            return f"the CUDA-core kernel has no GQA group size {group}"
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
            "tree": "the decode wrapper takes no custom mask (use flashinfer_paged)",
        },
    )


BACKENDS = {"flashinfer_dec_cc": FlashInferDecCC, "flashinfer_dec_tc": FlashInferDecTC}
