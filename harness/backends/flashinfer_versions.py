"""The FlashInfer releases the glue supports, and every difference between them, named, in one place.

Found by diffing the Python sources of the wheels (0.6.13 to 0.6.18.post1, 0.7.0 to 0.7.2.post1): the
wrappers, their plan() / run() keywords, merge_state, segment_packbits and the JIT spec API that
harness/run/speed/warmup/flashinfer.py uses. Each `Difference` says where it is (file:line in each
wheel) and what the glue does about it (docs/flashinfer.md has them as a table). Every adapter asks
RANGE before it runs (`why_unavailable` in flashinfer_glue.py); `list` and the report show the
installed release against it. The keywords the adapters pass are the same in every supported
release: none of `KEYWORDS_SINCE` is passed (tests/test_availability.py checks the recorded calls, and
tests/test_flashinfer_glue.py runs the adapters on a fake posing as 0.6.18.post1).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.backends.versions import SupportedRange

RANGE = SupportedRange(
    distribution="flashinfer-python",
    module="flashinfer",
    lowest="0.6.16",
    below="0.8",
    tested=("0.6.18.post1", "0.7.2.post1"),
    why_lowest="decode plan() takes q_len_per_req only from 0.6.13, and plans its rows as a bottom-right "
    "causal block (qo_indptr * q_len_per_req, is_causal) only from 0.6.16: before, flashinfer_dec_tc's "
    "DRAFT_EXTEND_V2 and verify batches would run unmasked",
)


@dataclass(frozen=True)
class Difference:
    """One way releases in RANGE differ: from `since` on (earlier supported releases lack it)."""

    name: str
    since: str
    where: str
    glue: str


DIFFERENCES = (
    Difference(
        "init-variant-owns-mask",
        "0.7.0",
        "prefill.py:2672 and :4778 (0.7.2.post1) __init__(variant_owns_mask=False); absent in "
        "0.6.18.post1 prefill.py:1641 and :3285",
        "not passed: no adapter builds a custom variant",
    ),
    Difference(
        "decode-plan-is-causal",
        "0.7.0",
        "decode.py:1975 _plan_impl(is_causal=None) (0.7.2.post1); 0.6.18.post1 decode.py:1469 derives "
        "is_causal = q_len_per_req > 1 with no keyword",
        "not passed: q_len_per_req > 1 is causal on both (flashinfer_dec_tc relies on it)",
    ),
    Difference(
        "run-lse-base-layout",
        "0.7.1",
        "prefill.py:3977 / :5845 run(lse_base='log2', lse_layout='NH') (0.7.2.post1); absent in "
        "0.6.18.post1 prefill.py:2652 / :3968",
        "not passed: both return base-2 [tokens, heads] LSE by default; the glue converts it (natural_lse)",
    ),
    Difference(
        "plan-uniform-q-len",
        "0.7.2.post1",
        "prefill.py:3215 / :5022 plan(uniform_q_len=None) (0.7.2.post1); absent in 0.6.18.post1 "
        "prefill.py:2120 / :3443 and in 0.7.2",
        "not passed: a CUDA-graph hint (and the gate of 0.7.2.post1's SM90 FP8 verify kernel, "
        "prefill.py:2050), which an eager engine leaves off",
    ),
    Difference(
        "sink-masked-chunk-nan",
        "0.7.0",
        "jit/attention/variants.py:41 (0.6.18.post1) AttentionSink's M/D update computes "
        "exp2(m - m_new) unguarded; 0.7.2.post1 variants.py:42 takes max(m - m_new, -inf), 'drops the "
        "NaN from (-inf) - (-inf) on chunks whose rows are fully masked'",
        "none (kernel code): on 0.6 a sink case whose row sees no key of a KV chunk may be NaN; the "
        "suite's sink cases show it, a known issue keyed on the 0.6 release if it does",
    ),
    Difference(
        "sink-jit-paged-kv-stride-mode",
        "0.7.0",
        "attention/_core.py:449 (0.7.2.post1) the AttentionSink JIT kwargs add paged_kv_stride_mode and "
        "module_surface; 0.6.18.post1 attention/_core.py:389 has neither",
        "none: the sink module's name differs by release; flashinfer_warmup discovers the names by running",
    ),
    Difference(
        "jit-aot-lookup",
        "0.7.0",
        "jit/core.py:500 (0.7.2.post1) JitSpec.is_aot reads AOT providers (aot_artifacts); 0.6.18.post1 "
        "jit/core.py:367 checks aot_path exists",
        "none: the warm-up (flashinfer_warmup.ninja_plan) asks spec.is_aot, which both have, and leaves "
        "prebuilt modules to FlashInfer",
    ),
)

# The plan()/run()/__init__ keywords that not every release in RANGE takes: keyword -> first release.
KEYWORDS_SINCE = {
    "variant_owns_mask": "0.7.0",
    "is_causal": "0.7.0",
    "lse_base": "0.7.1",
    "lse_layout": "0.7.1",
    "uniform_q_len": "0.7.2.post1",
}


