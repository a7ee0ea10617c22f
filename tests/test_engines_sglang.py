"""The sglang adapters: the engine's window convention pinned from its own code, the release refusal,
the core harness without sglang, and every sglang mutant caught by the suite's search.

Tests that drive sglang skip where it is not installed (the core environment); `make test-sglang`
runs this file in .venv-sglang, where they run.
"""

import ast
import importlib.util
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.backends import BackendBroken, names
from harness.backends.engines.base import Engine, EngineAdapter
from harness.backends.engines.sglang.engine import SGLANG
from harness.backends.engines.sglang.fa3 import SglangFA3
from harness.backends.engines.sglang.flashinfer import SglangFlashInfer
from harness.backends.engines.sglang.flex import SglangFlex
from harness.backends.engines.sglang.gpu import SGLANG_GPU, one_rank_topology
from harness.backends.engines.sglang.torch_native import SglangTorchNative
from harness.backends.versions import SupportedRange, distribution_version
from harness.checks.known_issues import reaching_issue
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case, Request
from harness.mutants import catalogue, hunt
from harness.search import profiles

ADAPTERS = (SglangTorchNative, SglangFlex)
GPU_ADAPTERS = (SglangFlashInfer, SglangFA3)
SGLANG_RELEASE = SGLANG.release()
needs_sglang = pytest.mark.skipif(SGLANG_RELEASE is None, reason="sglang is not installed here")
SGLANG_MUTANTS = [m for m in catalogue() if m.backend.startswith("sglang_")]


def test_registry_lists_the_adapters_without_importing_sglang():
    code = (
        "import sys, harness.backends as b; n = b.names(); "
        "print({'sglang_native', 'sglang_flex', 'sglang_flashinfer', 'sglang_fa3'} <= set(n), "
        "'sglang' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "False"]


@pytest.mark.skipif(SGLANG_RELEASE is not None, reason="sglang is installed here")
@pytest.mark.parametrize("cls", ADAPTERS)
def test_unavailable_without_sglang_says_why(cls):
    why = cls().available("cpu")
    assert why is not None and "sglang is not installed" in why


def test_a_release_outside_the_range_is_refused_in_one_line():
    torch_release = distribution_version("torch")
    old_range = SupportedRange(
        distribution="torch", module="torch", lowest="0.0.1", below="0.0.2", tested=("0.0.1",),
        why_lowest="too old",
    )
    torch_engine = Engine("torch-engine", old_range)

    class Adapter(EngineAdapter):
        name = "refused"
        engine = torch_engine
        engine_backend = "torch:Tensor"
        capabilities = SglangTorchNative.capabilities

    with pytest.raises(BackendBroken) as e:
        Adapter().available("cpu")
    message = str(e.value)
    assert "\n" not in message and f"torch {torch_release} is installed" in message and "too old" in message


def test_each_adapter_names_its_engine_release():
    for cls in ADAPTERS:
        b = cls()
        assert b.library == "sglang" and b.supported.distribution == "sglang"
        assert b.release() == SGLANG_RELEASE
    assert {"sglang_native", "sglang_flex"} <= set(names())


@needs_sglang
@pytest.mark.parametrize("window", [0, 1, 3, 7])
def test_window_convention_is_read_from_sglangs_mask(window):
    """sglang's own mask (TorchNativeAttnBackend._make_sliding_window_mask) lets a decode query see
    W + 1 keys for sliding_window_size W: the harness's count, so the adapter passes W unchanged."""
    backend = SglangTorchNative().backend_class()
    kv_len = 12
    mask = backend._make_sliding_window_mask(
        q_len=1, kv_len=kv_len, sliding_window_size=window, device="cpu", query_offset=kv_len - 1
    )
    assert int(mask.sum()) == window + 1
    assert SglangTorchNative().engine_window(window) == window


@needs_sglang
@pytest.mark.parametrize("mutant", SGLANG_MUTANTS, ids=[m.name for m in SGLANG_MUTANTS])
def test_sglang_mutant_is_caught(mutant):
    profiles.load("ci")
    d = hunt(mutant, mutant.families[0], device="cpu")
    assert not d.skipped, d.skipped
    assert d.caught, f"mutant {mutant.name} ({mutant.bug}) survived: {d.reason}"
    assert reaching_issue(mutant.backend, d.shrunk) is None, "caught only where sglang itself is wrong"
    print(f"{mutant.name}: caught ({d.status}) after {d.examples} examples; shrunk to {d.shrunk.to_json()}")


def test_every_adapter_has_three_mutants():
    for cls in ADAPTERS:
        assert sum(m.backend == cls.name for m in SGLANG_MUTANTS) >= 3, cls.name


# --- the CUDA adapters (sglang_flashinfer, sglang_fa3) ------------------------------------------

# What sglang 0.5.17's FlashInferAttnBackend and FlashAttentionBackend read of the model runner
# (every `model_runner.a.b` in flashinfer_backend.py and flashattention_backend.py, read with
# `model_runner_reads` from the 0.5.17 wheel). Reads into server_args and ps stop there: those are
# sglang's own objects.
READS_0_5_17 = (
    "attention_chunk_size", "device", "dtype", "is_draft_worker", "kv_cache_dtype", "kv_cache_dtype_str",
    "model_config.attention_arch", "model_config.context_len", "model_config.get_max_num_attention_heads",
    "model_config.get_num_kv_heads", "model_config.head_dim", "model_config.hf_config.architectures",
    "model_config.hf_text_config.num_attention_heads", "model_config.is_encoder_decoder",
    "model_config.is_local_attention_model", "model_config.is_multimodal", "model_config.num_attention_heads",
    "page_size", "ps", "req_to_token_pool.req_to_token.shape", "req_to_token_pool.size", "server_args",
    "sliding_window_size", "spec_algorithm.is_frozen_kv_mtp", "token_to_kv_pool",
    "token_to_kv_pool_allocator.get_kvcache",
)
SGLANG_OWN = ("server_args", "ps")  # the stand-in passes sglang's own objects there
# Read only of another kind of pool than the MHATokenToKVPool the adapters build (FlashAttentionBackend:
# `isinstance(model_runner.token_to_kv_pool, SWAKVPool) and model_runner.token_to_kv_pool.swa_layer_nums`).
SWA_POOL_READS = {"token_to_kv_pool.swa_layer_nums"}


def sglang_source(module: str) -> str:
    """The installed sglang's source of one module, read without importing it (FlashAttentionBackend's
    module imports the CUDA kernels)."""
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    path = Path(spec.submodule_search_locations[0], *module.split(".")[1:]).with_suffix(".py")
    return path.read_text()


def model_runner_reads(source: str) -> set[str]:
    """Every attribute chain `model_runner.a.b...` the source reads, cut after server_args and ps."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        chain, n = [], node
        while isinstance(n, ast.Attribute):
            chain.append(n.attr)
            n = n.value
        if chain and isinstance(n, ast.Name) and n.id == "model_runner":
            chain.reverse()
            cut = next((i + 1 for i, a in enumerate(chain) if a in SGLANG_OWN), len(chain))
            found.add(".".join(chain[:cut]))
    return found


def missing_reads(runner: object, reads: set[str] | tuple[str, ...]) -> list[str]:
    """The chains the model runner stand-in does not carry."""
    missing = []
    for chain in reads:
        obj = runner
        for attr in chain.split("."):
            if not hasattr(obj, attr):
                missing.append(chain)
                break
            obj = getattr(obj, attr)
    return sorted(missing)


def stand_in_runner(cls, monkeypatch, **case_fields):
    """The adapter's model runner stand-in over sglang's real pools for a small CPU batch, its
    ServerArgs replaced by what the runner reads of them (ServerArgs resolves devices at construction).
    The pools come through SglangFlashInfer, whose module imports without CUDA (FA3's needs sgl_kernel)."""
    case = Case(mode="DECODE", requests=(Request(9, 1), Request(3, 1)), page_size=16, **case_fields)
    batch = build_batch(case, make_inputs(case), "cpu")
    pools, adapter = SglangFlashInfer(), cls()
    monkeypatch.setattr(adapter, "server_args", lambda batch: SimpleNamespace(speculative_algorithm=None))
    r2t = pools.req_to_token_pool(batch, pools.req_pool_indices(batch))
    return adapter.model_runner(batch, r2t, pools.token_to_kv_pool(batch))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
@pytest.mark.parametrize("cls", GPU_ADAPTERS)
def test_cuda_adapters_are_unavailable_without_cuda(cls):
    assert cls().available("cpu") == f"{cls.name} does not run on cpu"
    why = cls().available("cuda")
    assert why is not None and "no CUDA device" in why


@pytest.mark.skipif(distribution_version("sglang-kernel") is not None, reason="sglang-kernel is here")
@pytest.mark.parametrize("cls", GPU_ADAPTERS)
def test_on_a_gpu_the_cuda_adapters_name_the_absent_distribution(cls, monkeypatch):
    """Past the device check, the reason names what to install: sglang where it is absent, else
    sglang's CUDA kernels (the CPU environment has sglang without them)."""
    monkeypatch.setattr("harness.backends.base.Backend.available", lambda self, device: None)
    why = cls().available("cuda")
    assert why is not None and "\n" not in why, why
    if SGLANG_RELEASE is None:
        assert why.startswith("sglang is not installed here (supported: sglang>=0.5.17,<0.5.18"), why
    else:
        assert why.startswith("sglang-kernel (sglang's CUDA kernels, sgl_kernel) is not installed here"), why


def test_the_cuda_adapters_refuse_other_releases_in_one_line(monkeypatch):
    monkeypatch.setattr("harness.backends.base.Backend.available", lambda self, device: None)
    monkeypatch.setattr(Engine, "release", lambda self: "0.5.23")
    monkeypatch.setattr("harness.backends.engines.base.distribution_version", lambda name: "1.0")
    for cls in GPU_ADAPTERS:
        assert cls.engine is SGLANG_GPU and cls().library == "sglang"
        with pytest.raises(BackendBroken) as e:
            cls().available("cuda")
        message = str(e.value)
        assert "\n" not in message and message.startswith("sglang 0.5.23 is installed"), message
        assert "kv_index_translator" in message
    assert SGLANG_GPU.supported.contains("0.5.17") and not SGLANG_GPU.supported.contains("0.5.16")


def test_one_rank_topology_sets_every_size_to_one_and_every_rank_to_zero():
    fields = frozenset({"tp_size", "attn_tp_rank", "attn_cp_size", "world_group", "dcp_enabled"})
    assert one_rank_topology(fields) == {"tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1}


@needs_sglang
@pytest.mark.parametrize("cls", GPU_ADAPTERS)
def test_the_model_runner_stand_in_carries_what_0_5_17_reads(cls, monkeypatch):
    runner = stand_in_runner(cls, monkeypatch)
    assert missing_reads(runner, READS_0_5_17) == []


@needs_sglang
def test_the_stand_in_carries_the_installed_releases_reads_exactly_where_it_is_in_range(monkeypatch):
    """Parsed from the installed sglang: in SGLANG_GPU's range the stand-in carries every read of both
    backends; outside it (CI's 0.5.23) some read is missing, which is why that release is refused."""
    reads = set()
    for module in (SglangFlashInfer.engine_backend, SglangFA3.engine_backend):
        reads |= model_runner_reads(sglang_source(module.partition(":")[0]))
    reads -= SWA_POOL_READS
    assert reads, "no model_runner reads found: the parser no longer matches sglang's code"
    missing = missing_reads(stand_in_runner(SglangFlashInfer, monkeypatch), reads)
    in_range = SGLANG_GPU.supported.contains(SGLANG_RELEASE)
    assert (missing == []) == in_range, f"sglang {SGLANG_RELEASE}, in range {in_range}, missing {missing}"


@needs_sglang
def test_the_model_runner_stand_in_follows_the_case(monkeypatch):
    runner = stand_in_runner(SglangFA3, monkeypatch, window_left=5, soft_cap=30.0, kv_dtype="float8_e4m3fn")
    assert runner.sliding_window_size == 5 and runner.kv_cache_dtype_str == "fp8_e4m3"
    assert runner.model_config.hf_text_config.attn_logit_softcapping == 30.0
    assert runner.token_to_kv_pool_allocator.get_kvcache() is runner.token_to_kv_pool
    plain = stand_in_runner(SglangFlashInfer, monkeypatch)
    assert plain.sliding_window_size is None and plain.kv_cache_dtype_str == "auto"
    assert not plain.model_config.is_encoder_decoder and plain.model_config.get_num_kv_heads(1) == 2


# Where each CUDA backend turns the layer's sliding_window_size into the keys a query sees.
WINDOW_SOURCES = {
    # a decode keeps the last W + 1 keys: seq_lens clamped to W + 1 (FlashInferIndicesUpdaterDecode)
    SglangFlashInfer: "max=self.sliding_window_size + 1",
    # FA3's window (left, right) is inclusive at both ends: (W, 0) is keys p - W .. p
    SglangFA3: "(layer.sliding_window_size, 0",
}


@needs_sglang
@pytest.mark.parametrize("cls", GPU_ADAPTERS)
def test_cuda_window_convention_is_read_from_sglangs_code(cls):
    """Both CUDA backends count W + 1 keys for sliding_window_size W, as the harness does: the adapter
    passes W unchanged."""
    source = sglang_source(cls.engine_backend.partition(":")[0])
    assert WINDOW_SOURCES[cls] in source
    assert all(cls().engine_window(w) == w for w in (0, 1, 7))


DOCS = Path(__file__).resolve().parent.parent / "docs" / "engines.md"


@pytest.mark.parametrize("cls", GPU_ADAPTERS)
def test_the_cuda_adapters_and_their_stand_ins_are_documented(cls):
    text = DOCS.read_text()
    assert f"`{cls.name}`" in text
    section = text[text.index("### Stand-ins of the CUDA adapters"):]
    for stand_in in cls.stand_ins:
        assert f"| {stand_in.what} |" in section, stand_in.what


def test_the_gpu_smoke_runs_cases_both_cuda_adapters_declare():
    """engines/sglang-gpu-smoke.py's decode and extend are cases each CUDA adapter declares, so its one
    try on a GPU runs them instead of skipping."""
    path = Path(__file__).resolve().parent.parent / "engines" / "sglang-gpu-smoke.py"
    spec = importlib.util.spec_from_file_location("sglang_gpu_smoke", path)
    assert spec is not None and spec.loader is not None
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    assert set(smoke.ADAPTERS) == {cls.name for cls in GPU_ADAPTERS}
    assert {case.mode for case in smoke.CASES.values()} == {"DECODE", "EXTEND"}
    for cls in GPU_ADAPTERS:
        for case in smoke.CASES.values():
            assert cls().supports(case) is None, (cls.name, case)


@pytest.mark.parametrize("adapter", [SglangTorchNative, SglangFlex, SglangFlashInfer, SglangFA3])
def test_an_adapter_that_imported_sglang_still_goes_to_an_isolation_worker(adapter):
    """A CUDA check sends each backend to its isolation worker pickled; an adapter holding sglang's
    modules could not go ("cannot pickle 'module' object"). The worker imports its own."""
    backend = adapter()
    backend._sg = SimpleNamespace(backend=torch, batch=sys)  # what import_engine leaves: modules
    sent = pickle.loads(pickle.dumps(backend))
    assert type(sent) is adapter and sent._sg is None
