"""flashinfer_enc: cross-attention with FlashInfer, non-causal over each request's encoder keys.

The encoder's K/V lead each request's `req_to_token` row. A prefill batch (decoder queries of any
length) goes through the paged prefill wrapper with causal=False; a batch of one decoder step per
request goes through the tensor-core decode wrapper, as an engine's decode path does. Both plans
carry the split parameters in deterministic mode: a cross-attention path that drops them was a
real source of batch-dependent outputs.
"""

from __future__ import annotations

from harness.backends.base import BackendOutput
from harness.backends.flashinfer_glue import FlashInferGlue, capabilities
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.core.timing import phase


class FlashInferEnc(FlashInferGlue):
    name = "flashinfer_enc"
    split_tokens = 2048
    capabilities = capabilities(
        {Mode.CROSS},
        ("soft_cap", "deterministic", "returns_lse"),
        why_not={
            "sinks": "attention sinks are a decoder self-attention feature; not wired for CROSS",
            "graph": "no CUDA-graph path for CROSS (its decoder steps could be captured; not written)",
        },
    )

    def decoder_step(self, batch: Batch) -> bool:
        """One query per request: the engine's decode path (decode wrapper), else its prefill path."""
        return all(n == 1 for n in batch.cpu_list("extend_lens"))

    def run(self, batch: Batch) -> BackendOutput:
        with phase("plan"):
            table = self.page_table(batch, self.key_ranges(batch))
            options = self.kernel_options(batch, -1)
            if self.decoder_step(batch):
                wrapper = self.wrapper("decode_tc", batch)
                self.plan_decode(wrapper, batch, table, options, 1)
            else:
                wrapper = self.wrapper("paged", batch)
                self.plan_paged(wrapper, batch, table, False, options, None)
        out, lse = wrapper.run(batch.q, self.kv_cache(batch), return_lse=True, **self.run_scales(batch))
        return BackendOutput(out=out, lse=self.natural_lse(lse))


BACKENDS = {"flashinfer_enc": FlashInferEnc}
