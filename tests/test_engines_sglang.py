"""The sglang adapters: the engine's window convention pinned from its own code, the release refusal,
the core harness without sglang, and every sglang mutant caught by the suite's search.

Tests that drive sglang skip where it is not installed (the core environment); `make test-sglang`
runs this file in .venv-sglang, where they run.
"""

import ast
import contextlib
import importlib.util
import inspect
import json
import pickle
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

from harness.backends import BackendBroken, names
from harness.backends.engines.base import Engine, EngineAdapter, model_dir
from harness.backends.engines.sglang import spec
from harness.backends.engines.sglang.engine import SGLANG, declare_torchvision_schemas
from harness.backends.engines.sglang.fa3 import SglangFA3
from harness.backends.engines.sglang.flashinfer import SglangFlashInfer
from harness.backends.engines.sglang.flex import SglangFlex
from harness.backends.engines.sglang.gpu import (
    KV_LOC_PLAN_FROM,
    RUNNER_READS_FROM,
    SGLANG_GPU,
    one_rank_topology,
    sglang_from,
)
from harness.backends.engines.sglang.graph import EngineGraph
from harness.backends.engines.sglang.torch_native import SglangTorchNative
from harness.backends.graph_glue import GraphLimits
from harness.backends.versions import SupportedRange, distribution_version
from harness.checks.known_issues import reaching_issue
from harness.checks.replay import GraphRunner, replay_result
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case, Request, case_traits
from harness.core.graph_case import SEQ_LEN_FILL, GraphCase
from harness.core.modes import FAMILY_MODE, Mode, tree_ancestry
from harness.core.results import GRAPH_CHECK
from harness.mutants import catalogue, hunt
from harness.run import graph_suite
from harness.run.graph_suite import GraphTarget
from harness.search import profiles

ADAPTERS = (SglangTorchNative, SglangFlex)
GPU_ADAPTERS = (SglangFlashInfer, SglangFA3)
SGLANG_RELEASE = SGLANG.release()
needs_sglang = pytest.mark.skipif(SGLANG_RELEASE is None, reason="sglang is not installed here")
INSTALLED = "sglang is not installed" if SGLANG_RELEASE is None else f"sglang {SGLANG_RELEASE} is installed"
needs_cuda_adapters_release = pytest.mark.skipif(
    SGLANG_RELEASE is None or not SGLANG_GPU.supported.contains(SGLANG_RELEASE),
    reason=f"{INSTALLED} here, not one in the CUDA adapters' range {SGLANG_GPU.supported.spec}",
)
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


def test_the_local_model_config_is_one_directory_per_geometry_shared_across_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model_dir.cache_clear()
    first = model_dir(8, 2, 64)
    (Path(first) / "config.json").write_text("{}")  # another process's stale or torn file is rewritten
    model_dir.cache_clear()
    assert model_dir(8, 2, 64) == first and model_dir(4, 4, 128) != first
    assert json.loads((Path(first) / "config.json").read_text())["num_key_value_heads"] == 2
    made = sorted(p.name for p in (tmp_path / "attn-harness-models").iterdir())
    assert made == ["llama-4-4-128", "llama-8-2-64"]
    assert [p.name for p in Path(first).iterdir()] == ["config.json"]
    model_dir.cache_clear()


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
        assert why.startswith("sglang is not installed here (supported: sglang>=0.5.17,<0.5.24"), why
    else:
        assert why.startswith("sglang-kernel (sglang's CUDA kernels, sgl_kernel) is not installed here"), why


def test_the_cuda_adapters_refuse_other_releases_in_one_line(monkeypatch):
    monkeypatch.setattr("harness.backends.base.Backend.available", lambda self, device: None)
    monkeypatch.setattr(Engine, "release", lambda self: "0.5.24")
    monkeypatch.setattr("harness.backends.engines.base.distribution_version", lambda name: "1.0")
    for cls in GPU_ADAPTERS:
        assert cls.engine is SGLANG_GPU and cls().library == "sglang"
        with pytest.raises(BackendBroken) as e:
            cls().available("cuda")
        message = str(e.value)
        assert "\n" not in message and message.startswith("sglang 0.5.24 is installed"), message
        assert "0.5.24 and newer are not read yet" in message
    releases = [f"0.5.{minor}" for minor in range(17, 24)]
    assert all(SGLANG_GPU.supported.contains(r) for r in releases), SGLANG_GPU.supported.spec
    assert not SGLANG_GPU.supported.contains("0.5.16") and not SGLANG_GPU.supported.contains("0.5.24")


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
    backends (run it with each release's source first on PYTHONPATH); outside it some read is missing."""
    reads = set()
    for module in (SglangFlashInfer.engine_backend, SglangFA3.engine_backend):
        reads |= model_runner_reads(sglang_source(module.partition(":")[0]))
    reads -= SWA_POOL_READS
    assert reads, "no model_runner reads found: the parser no longer matches sglang's code"
    missing = missing_reads(stand_in_runner(SglangFlashInfer, monkeypatch), reads)
    in_range = SGLANG_GPU.supported.contains(SGLANG_RELEASE)
    assert (missing == []) == in_range, f"sglang {SGLANG_RELEASE}, in range {in_range}, missing {missing}"


@needs_sglang
def test_each_later_read_is_carried_from_a_release_no_later_than_one_that_reads_it():
    """RUNNER_READS_FROM, checked against the installed release's code: every attribute of it the
    installed backends read has a first release at or before the installed one (run with each
    release's source first on PYTHONPATH)."""
    reads = set()
    for module in (SglangFlashInfer.engine_backend, SglangFA3.engine_backend):
        reads |= model_runner_reads(sglang_source(module.partition(":")[0]))
    installed = Version(SGLANG_RELEASE)
    late = {n: r for n, r in RUNNER_READS_FROM.items() if n in reads and Version(r) > installed}
    assert late == {}, f"sglang {SGLANG_RELEASE} reads {late} before the stand-in carries them"


@needs_cuda_adapters_release
def test_the_model_runner_stand_in_carries_each_later_read_from_its_release_on(monkeypatch):
    """The installed release chooses what the stand-in carries beyond 0.5.17's reads (shown here for
    every range release up to the installed one, whose sglang modules the later reads need)."""
    releases = [f"0.5.{minor}" for minor in range(17, 24)]
    for release in [r for r in releases if Version(r) <= Version(SGLANG_RELEASE)]:
        monkeypatch.setattr(Engine, "release", lambda self, release=release: release)
        runner = stand_in_runner(SglangFA3, monkeypatch)
        carried = {name for name in RUNNER_READS_FROM if hasattr(runner, name)}
        want = {name for name, first in RUNNER_READS_FROM.items() if Version(first) <= Version(release)}
        assert carried == want, release
        if "kv_index_translator" in carried:
            translator = runner.kv_index_translator
            assert type(translator).__name__ == "KVIndexTranslator" and not translator.is_translating
            assert translator.req_to_token is runner.req_to_token_pool.req_to_token
        if "decode_attention_backend_str" in carried:
            assert runner.prefill_attention_backend_str == runner.decode_attention_backend_str == "fa3"


@needs_sglang
def test_the_model_runner_stand_in_follows_the_case(monkeypatch):
    runner = stand_in_runner(SglangFA3, monkeypatch, window_left=5, soft_cap=30.0, kv_dtype="float8_e4m3fn")
    assert runner.sliding_window_size == 5 and runner.kv_cache_dtype_str == "fp8_e4m3"
    assert runner.model_config.hf_text_config.attn_logit_softcapping == 30.0
    assert runner.token_to_kv_pool_allocator.get_kvcache() is runner.token_to_kv_pool
    plain = stand_in_runner(SglangFlashInfer, monkeypatch)
    assert plain.sliding_window_size is None and plain.kv_cache_dtype_str == "auto"
    assert not plain.model_config.is_encoder_decoder and plain.model_config.get_num_kv_heads(1) == 2


@needs_sglang
def test_the_layer_and_the_runner_carry_the_window_cap_and_scale_as_sglangs_models_give_them(monkeypatch):
    """sglang's model runner takes its sliding_window_size from the model (resolve_sliding_window_size:
    `model.get_attention_sliding_window_size()`, gemma2's `config.sliding_window - 1`), the value
    gemma2's windowed layers give RadixAttention, with `logit_cap = config.attn_logit_softcapping` and
    their own `scaling`: the adapter's layer and runner carry one W, the case's soft cap and scale."""
    gemma2 = sglang_source("sglang.srt.models.gemma2")
    assert "return config.sliding_window - 1" in gemma2
    assert "logit_cap = self.config.attn_logit_softcapping" in gemma2
    resolve = sglang_source("sglang.srt.model_executor.model_runner_components.load_model_utils")
    assert "sliding_window_size = model.get_attention_sliding_window_size()" in resolve
    fields = dict(window_left=5, soft_cap=30.0, sm_scale=0.1)
    case = Case(mode="DECODE", requests=(Request(9, 1), Request(3, 1)), page_size=16, **fields)
    layer = SglangFlashInfer().layer(build_batch(case, make_inputs(case), "cpu"))
    runner = stand_in_runner(SglangFlashInfer, monkeypatch, **fields)
    assert layer.sliding_window_size == runner.sliding_window_size == 5
    assert layer.logit_cap == 30.0 and layer.scaling == 0.1


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
    """engines/sglang-gpu-smoke.py's cases (decode, extend, verify chain and tree, draft extend) and graph
    sequences (every captured mode) are ones each CUDA adapter declares, so its one try on a GPU runs them
    instead of skipping."""
    path = Path(__file__).resolve().parent.parent / "engines" / "sglang-gpu-smoke.py"
    spec = importlib.util.spec_from_file_location("sglang_gpu_smoke", path)
    assert spec is not None and spec.loader is not None
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    assert set(smoke.ADAPTERS) == {cls.name for cls in GPU_ADAPTERS}
    modes = {case.mode for case in smoke.CASES.values()}
    assert modes == {"DECODE", "EXTEND", "TARGET_VERIFY", "DRAFT_EXTEND_V2"}
    assert any("tree" in case_traits(case) for case in smoke.CASES.values())
    for cls in GPU_ADAPTERS:
        for case in smoke.CASES.values():
            assert cls().supports(case) is None, (cls.name, case)
    assert {str(g.mode) for g in smoke.GRAPHS.values()} == {"DECODE", "TARGET_VERIFY", "DRAFT_EXTEND_V2"}
    for cls in GPU_ADAPTERS:
        for g in smoke.GRAPHS.values():
            assert cls.capabilities.graph_reason(g.mode) is None, (cls.name, g.mode)
            for case in g.batches:
                assert cls().supports(case) is None and cls().graph_supports(case) is None, (cls.name, case)


@pytest.mark.parametrize("adapter", [SglangTorchNative, SglangFlex, SglangFlashInfer, SglangFA3])
def test_an_adapter_that_imported_sglang_still_goes_to_an_isolation_worker(adapter):
    """A CUDA check sends each backend to its isolation worker pickled; an adapter holding sglang's
    modules could not go ("cannot pickle 'module' object"). The worker imports its own."""
    backend = adapter()
    backend._sg = SimpleNamespace(backend=torch, batch=sys)  # what import_engine leaves: modules
    sent = pickle.loads(pickle.dumps(backend))
    assert type(sent) is adapter and sent._sg is None


# --- the speculative modes of the CUDA adapters ---------------------------------------------------


def verify_case(tree: tuple[int, ...], **fields) -> Case:
    """A TARGET_VERIFY case of two requests over cached prefixes of different lengths, one tree."""
    reqs = (Request(9, len(tree), tree=tree), Request(3, len(tree), tree=tree))
    return Case(mode="TARGET_VERIFY", requests=reqs, page_size=16, dtype="bfloat16", **fields)


CHAIN, TREE, FOREST = (-1, 0, 1), (-1, 0, 0, 1), (-1, -1, 1)


@pytest.mark.parametrize(("tree", "shape"), [(CHAIN, (1, 3, 3)), (TREE, (2, 3, 4)), (FOREST, (2, 2, 3))])
def test_the_spec_settings_are_the_trees_branching_depth_and_size(tree, shape):
    """topk: the most children of one node, the last accepted token (-1) included; spec_steps: the
    depth; draft_token_num: the drafts per request."""
    batch = build_batch(verify_case(tree), make_inputs(verify_case(tree)), "cpu")
    assert spec.spec_shape(batch) == shape


@pytest.mark.parametrize("tree", [CHAIN, TREE, FOREST])
def test_the_verify_mask_is_eagles_layout_of_the_batchs_tree(tree):
    """Per request, num_draft rows of seq_len + num_draft columns: every cached key, then the draft's
    ancestors and itself. Its length is the one EagleVerifyInput.generate_attn_arg_prefill plans for
    (a shorter mask is padded there with True: every draft would see every other)."""
    case = verify_case(tree)
    batch = build_batch(case, make_inputs(case), "cpu")
    mask, n = spec.verify_custom_mask(batch), len(tree)
    seq = batch.cpu_list("seq_lens")
    assert mask.numel() == sum(seq) * n + n * n * len(seq)
    start = 0
    for s in seq:
        rows = mask[start : start + n * (s + n)].view(n, s + n)
        assert rows[:, :s].all()
        assert torch.equal(rows[:, s:], torch.tensor(tree_ancestry(tree)))
        start += n * (s + n)


@needs_sglang
def test_the_spec_inputs_are_sglangs_own_classes_filled_from_the_batch():
    adapter = SglangFlashInfer()
    case = verify_case(TREE)
    batch = build_batch(case, make_inputs(case), "cpu")
    eagle = adapter.gpu().eagle
    capture = adapter.sg().batch.CaptureHiddenMode
    verify = spec.verify_input(eagle, capture, batch)
    assert type(verify) is eagle.EagleVerifyInput and verify.is_verify_input()
    assert (verify.draft_token_num, verify.topk, verify.spec_steps) == (4, 2, 3)
    assert torch.equal(verify.positions, batch.positions.long())
    assert verify.seq_lens_sum == 12 and verify.seq_lens_cpu.tolist() == [9, 3]

    draft = Case(mode="DRAFT_EXTEND_V2", requests=(Request(9, 3), Request(3, 3)), page_size=16)
    batch = build_batch(draft, make_inputs(draft), "cpu")
    rows = adapter.req_pool_indices(batch)
    extend = spec.draft_extend_input(eagle, batch, rows)
    assert type(extend) is eagle.EagleDraftExtendInput
    assert extend.num_tokens_per_req == 3 and extend.num_accept_tokens_cpu == [3, 3]
    assert extend.seq_lens_cpu.tolist() == [12, 6] and extend.kv_indptr is None


@pytest.mark.parametrize("cls", GPU_ADAPTERS)
def test_the_cuda_adapters_declare_verify_chains_trees_and_draft_extend(cls):
    for tree in (CHAIN, TREE, FOREST):
        assert cls().supports(verify_case(tree)) is None, (cls.name, tree)
    draft = Case(mode="DRAFT_EXTEND_V2", requests=(Request(9, 3), Request(3, 3)), page_size=16)
    assert cls().supports(draft) is None


@pytest.mark.parametrize(
    ("cls", "tree", "fields", "why"),
    [
        (SglangFlashInfer, CHAIN, {"window_left": 4}, "takes no kv_start_idx"),
        (SglangFA3, TREE, {"window_left": 4}, "_init_sliding_window_attn_spec_metadata"),
        (SglangFA3, TREE, {"sinks": True}, "the sink counts twice"),
        (SglangFA3, TREE, {"kv_dtype": "float8_e4m3fn"}, "k_descale / v_descale expanded"),
    ],
)
def test_the_cuda_adapters_refuse_what_sglangs_verify_path_gets_wrong(cls, tree, fields, why):
    reason = cls().supports(verify_case(tree, **fields))
    assert reason is not None and why in reason, reason


def test_fa3_verifies_chains_with_a_window_sinks_or_fp8():
    for fields in ({"window_left": 4}, {"sinks": True}, {"kv_dtype": "float8_e4m3fn"}):
        assert SglangFA3().supports(verify_case(CHAIN, **fields)) is None, fields


# sglang's FlashAttentionBackend plans on a CPU: its module imports sgl_kernel, whose CUDA library does
# not load here, so the kernel entry points are replaced by ones that raise; init_forward_metadata calls
# none of them (get_scheduler_metadata: None, as when it is absent).


def kernel_stand_ins(monkeypatch) -> None:
    """sgl_kernel and sgl_kernel.flash_attn as modules whose kernels raise, where sgl_kernel does not
    import (no CUDA)."""
    try:
        importlib.import_module("sgl_kernel.flash_attn")
        return
    except ImportError:
        pass

    def kernel(*args, **kwargs):
        raise RuntimeError("no CUDA kernel on this machine")

    fa = ModuleType("sgl_kernel.flash_attn")
    fa.flash_attn_varlen_func = fa.flash_attn_with_kvcache = kernel
    fa.get_scheduler_metadata = None
    root = ModuleType("sgl_kernel")
    root.merge_state_v2, root.flash_attn = kernel, fa
    monkeypatch.setitem(sys.modules, "sgl_kernel", root)
    monkeypatch.setitem(sys.modules, "sgl_kernel.flash_attn", fa)


def fa3_planned_with(case: Case, monkeypatch):
    """The batch, sglang's FlashAttentionBackend after init_forward_metadata over it, and that
    ForwardBatch, built, bound and planned as SglangFA3.run does."""
    kernel_stand_ins(monkeypatch)
    batch = build_batch(case, make_inputs(case), "cpu")
    adapter = SglangFA3()
    with adapter.serving_context(batch):
        backend, fb, _ = adapter.planned(batch)
    return batch, backend, fb


def fa3_planned(case: Case, monkeypatch):
    """The batch and the planned backend of fa3_planned_with."""
    batch, backend, _ = fa3_planned_with(case, monkeypatch)
    return batch, backend


@needs_cuda_adapters_release
def test_fa3_plans_cross_attention_in_token_slots_where_it_reads_pages(monkeypatch):
    """sglang's own finding (0.5.17 and 0.5.23 alike), pinned: on pages of 16,
    FlashAttentionBackend.init_forward_metadata gives FA3 the encoder's page table as req_to_token's
    token slots (never `// page_size`, as its self-attention table is) and starts each request's text
    table at column encoder_len, mid-page unless encoder_len is a multiple of the page size. On an
    H200 the CROSS cases then failed (err up to 4e37, docs/engines.md); when sglang converts them this
    test fails and the docs change."""
    case = Case(mode="CROSS", requests=(Request(0, 1, 1), Request(6, 1, 20)), num_kv_heads=2, head_dim=64)
    batch, backend = fa3_planned(case, monkeypatch)
    m, ps, rows = backend.forward_metadata, case.page_size, batch.req_to_token
    assert m.encoder_page_table[0, :1].tolist() == rows[0, :1].tolist()  # a token slot ...
    assert rows[0, 0] // ps != rows[0, 0]  # ... which is not its page
    text_first_slot = int(rows[1, 20])
    assert text_first_slot % ps != 0  # the text starts mid-page ...
    assert int(m.page_table[1, 0]) == text_first_slot // ps  # ... and FA3 reads that page from slot 0


@needs_cuda_adapters_release
@pytest.mark.parametrize("deterministic,splits", [(True, 1), (False, 0)])
def test_a_deterministic_case_builds_fa3_under_sglangs_deterministic_inference(
    deterministic, splits, monkeypatch
):
    """FlashAttentionBackend reads `--enable-deterministic-inference` from the model runner's ServerArgs
    at construction (num_splits 1; 0 lets FA3 choose): a deterministic case gets sglang's own switch,
    a plain one does not."""
    case = Case(mode="DECODE", requests=(Request(40, 1), Request(7, 1)), deterministic=deterministic)
    batch, backend = fa3_planned(case, monkeypatch)
    assert backend.num_splits == splits
    assert SglangFA3().server_args(batch).enable_deterministic_inference is deterministic


@needs_cuda_adapters_release
def test_fa3_plans_a_verify_chain_over_the_prefix_and_the_drafts(monkeypatch):
    batch, backend = fa3_planned(verify_case(CHAIN), monkeypatch)
    m = backend.forward_metadata
    assert backend.topk == 1 and backend.speculative_num_draft_tokens == 3
    assert m.cache_seqlens_int32.tolist() == [p + 3 for p in batch.cpu_list("prefix_lens")]
    assert m.cu_seqlens_q.tolist() == batch.cpu_list("qo_indptr")
    pages = batch.req_to_token[:, :: batch.case.page_size] // batch.case.page_size
    assert torch.equal(m.page_table[:, : pages.shape[1]].long(), pages.long())


@needs_cuda_adapters_release
@pytest.mark.parametrize("tree", [TREE, FOREST])
def test_fa3_plans_a_verify_tree_from_the_custom_mask(tree, monkeypatch):
    """The cascade's first pass reads the cached keys; its second, per draft, the slots of the draft's
    ancestors and itself, which FA3 takes from the custom mask."""
    batch, backend = fa3_planned(verify_case(tree), monkeypatch)
    assert backend.topk == 2
    assert backend.forward_metadata.cache_seqlens_int32.tolist() == batch.cpu_list("prefix_lens")
    expand = backend.forward_metadata_spec_decode_expand
    ancestry = tree_ancestry(tree)
    want_lens, want_slots = [], []
    for r, p in enumerate(batch.cpu_list("prefix_lens")):
        for row in ancestry:
            slots = [int(batch.req_to_token[r, p + i]) for i, seen in enumerate(row) if seen]
            want_lens.append(len(slots))
            want_slots.append(slots)
    assert expand.cache_seqlens_int32.tolist() == want_lens
    got = [expand.page_table[j, :n].tolist() for j, n in enumerate(want_lens)]
    assert got == want_slots


@needs_cuda_adapters_release
@pytest.mark.parametrize("tree", [CHAIN, TREE])
def test_the_verify_forward_batch_carries_eagle_and_the_releases_kv_location_plan(tree, monkeypatch):
    """The ForwardBatch the backend plans and attends with: EAGLE as its spec_algorithm (the verify
    cascade asks it is_uno() from 0.5.20) and, from 0.5.22, the plan ForwardBatch.init_new binds,
    over the batch's own rows, lengths and write slots."""
    batch, _, fb = fa3_planned_with(verify_case(tree), monkeypatch)
    rows = fb.req_pool_indices
    assert fb.spec_algorithm.is_eagle()
    if sglang_from(KV_LOC_PLAN_FROM):
        plan = fb.kv_loc_plan
        assert plan is not None and torch.equal(plan.req_pool_indices, rows)
        assert plan.seq_lens.tolist() == batch.cpu_list("seq_lens") and plan.read_extent == len(tree)
        assert fb.out_cache_loc.tolist() == batch.out_cache_loc.tolist()
    else:
        assert getattr(fb, "kv_loc_plan", None) is None


@needs_cuda_adapters_release
def test_fa3_plans_a_draft_extend_over_the_bumped_seq_lens(monkeypatch):
    case = Case(mode="DRAFT_EXTEND_V2", requests=(Request(9, 3), Request(3, 3)), page_size=16)
    batch, backend = fa3_planned(case, monkeypatch)
    m = backend.forward_metadata
    assert m.cache_seqlens_int32.tolist() == [12, 6] == batch.cpu_list("seq_lens")
    assert m.cu_seqlens_q.tolist() == batch.cpu_list("qo_indptr") and m.max_seq_len_q == 3


# --- the CUDA-graph path of the CUDA adapters (harness/backends/engines/sglang/graph.py) ---------------


def graph_state(adapter, mode: str = "DECODE", queries: int = 1) -> GraphRunner:
    """A replay runner for a small layer of `mode`, 4 requests of up to 96 keys (its static pool set,
    nothing captured)."""
    tree = (-1, 0, 1) if mode == "TARGET_VERIFY" else None
    case = Case(mode=mode, requests=(Request(20, queries, tree=tree),), page_size=16)
    batch = build_batch(case, make_inputs(case), "cpu")
    return GraphRunner(adapter, GraphLimits(4, queries, 96, 16), [batch])


def two_requests(mode: str = "DECODE", queries: int = 1):
    reqs = (Request(37, queries), Request(5, queries))
    case = Case(mode=mode, requests=reqs, page_size=16)
    return build_batch(case, make_inputs(case), "cpu")


@pytest.mark.parametrize("cls", GPU_ADAPTERS)
def test_a_replay_pads_the_buffers_as_sglangs_graph_runner_does(cls):
    """The real requests first; then, up to the captured size, req_pool_indices 0 (the padding row),
    seq_lens at the fill value, out_cache_loc 0 (the reserved slot) and positions 0
    (build_decode_registry's ZERO and FILL_SENTINEL policies)."""
    adapter = cls()
    state = graph_state(adapter).state
    for name in ("req_pool_indices", "out_cache_loc", "positions"):
        state.buffers[name].fill_(7)  # what an earlier, larger replay left
    batch, fill = two_requests(), 3
    rows = adapter.req_pool_indices(batch)
    adapter.replay_request_buffers(state, batch, rows, 4, fill)
    adapter.replay_out_cache_loc(state, batch, 4)
    adapter.replay_positions(state, batch, 4)
    b = state.buffers
    assert b["req_pool_indices"].tolist() == [2, 1, 0, 0]
    assert b["seq_lens"].tolist() == b["seq_lens_cpu"].tolist() == [38, 6, fill, fill]
    assert b["out_cache_loc"].tolist() == batch.out_cache_loc.tolist() + [0, 0]
    assert b["positions"].tolist() == batch.positions.tolist() + [0, 0]


def test_a_draft_extend_replay_pads_the_accepted_counts_at_the_captured_width():
    """EAGLEDraftExtendCudaGraphRunner.execute: extend_seq_lens, num_accept_tokens and num_correct_drafts
    of a padding request at the captured width; the real ones every draft accepted."""
    adapter = SglangFA3()
    state = graph_state(adapter, "DRAFT_EXTEND_V2", 3).state
    batch = two_requests("DRAFT_EXTEND_V2", 3)
    adapter.replay_request_buffers(state, batch, adapter.req_pool_indices(batch), 4, 1)
    b = state.buffers
    assert b["extend_seq_lens"].tolist() == b["num_accept_tokens"].tolist() == [3, 3, 3, 3]
    assert b["num_correct_drafts"].tolist() == [2, 2, 3, 3]


def test_a_verify_tree_cannot_replay_in_a_graph_captured_for_chains():
    adapter = SglangFA3()
    eg = EngineGraph(backend=None, layer=None, req_to_token=None, kv=None, shape=(1, 3, 3))
    tree = verify_case(TREE)
    with pytest.raises(ValueError, match="captured for chains"):
        adapter.check_spec_shape(eg, build_batch(tree, make_inputs(tree), "cpu"))
    chain = verify_case(CHAIN)
    adapter.check_spec_shape(eg, build_batch(chain, make_inputs(chain), "cpu"))


def test_flashinfer_refuses_a_windowed_draft_extend_under_a_graph_only():
    case = Case(mode="DRAFT_EXTEND_V2", requests=(Request(9, 3),), page_size=16, window_left=4)
    assert SglangFlashInfer().supports(case) is None
    assert "kv_start_idx" in SglangFlashInfer().graph_supports(case)
    assert SglangFlashInfer().graph_supports(case.replace(window_left=-1)) is None


@pytest.mark.parametrize(
    ("pinned", "installed", "refused"),
    [("0.6.15.post1", "0.6.18.post1", True), ("0.6.15.post1", "0.6.15.post1", False)],
)
def test_flashinfer_refuses_a_draft_extend_replay_on_a_flashinfer_other_than_sglangs_pin(
    monkeypatch, pinned, installed, refused
):
    """The replay's fast_prefill_plan calls FlashInfer's private plan with the pinned release's arguments
    (the H200's crash: 'Expected 20 but got 19 arguments'): the graph suite skips the mode and a replay
    of it is refused, with both releases named; eager draft extends and other captured modes run."""
    from harness.backends.engines.sglang import flashinfer as adapter
    from harness.checks import replay
    from harness.run import listing

    monkeypatch.setattr(
        adapter, "pinned_requirement", lambda dist, dep: Requirement(f"flashinfer_python[cu13]=={pinned}")
    )
    releases = {"flashinfer-python": installed, "sglang": "0.5.17"}
    monkeypatch.setattr(adapter, "distribution_version", releases.get)
    backend = SglangFlashInfer()
    why = backend.graph_mode_reason(Mode.DRAFT_EXTEND_V2)
    if not refused:
        assert why is None
        return
    assert "sglang 0.5.17 pins flashinfer_python==0.6.15.post1" in why and installed in why
    assert backend.graph_mode_reason(Mode.DECODE) is None
    monkeypatch.setattr(type(backend), "available", lambda self, device: None)
    draft = Case(mode="DRAFT_EXTEND_V2", requests=(Request(9, 3),), page_size=16)
    assert replay.why_not(backend, GraphCase((draft,), 4, 64), "cuda") == why
    assert backend.supports(draft) is None
    with pytest.raises(pytest.skip.Exception, match="pins flashinfer_python"):
        graph_suite.run(GraphTarget(backend.name, "cuda", GRAPH_CHECK, "full", "draft_extend_v2"))
    monkeypatch.setattr(listing, "load_backend", lambda name: backend)
    assert f"  CUDA graph: no DRAFT_EXTEND_V2 here: {why}" in listing.describe_backend(backend.name)[0]


@pytest.mark.parametrize(
    ("cls", "family", "why"),
    [
        (SglangFlashInfer, "verify", "takes no kv_start_idx"),
        (SglangFlashInfer, "draft_extend_v2", "gets no window_left"),
        (SglangFlashInfer, "decode", None),
        (SglangFA3, "verify", None),
        (SglangFA3, "draft_extend_v2", None),
    ],
)
def test_a_windowed_graph_test_skips_where_no_windowed_case_can_be_drawn(cls, family, why):
    """The graph suite skips a windowed family the adapter excludes a window from, eagerly or under a
    graph alone (its search would draw nothing), and runs every other."""
    target = GraphTarget(cls.name, "cuda", GRAPH_CHECK, "swa", family)
    reason = graph_suite.window_reason(cls(), target, FAMILY_MODE[family])
    assert reason == why or (why is not None and why in reason), reason
    full = GraphTarget(cls.name, "cuda", GRAPH_CHECK, "full", family)
    assert graph_suite.window_reason(cls(), full, FAMILY_MODE[family]) is None


# Where each CUDA backend's out-of-graph metadata path takes each captured mode (sglang 0.5.17 .. 0.5.23).
GRAPH_SOURCES = {
    SglangFlashInfer: (
        "init_forward_metadata_out_graph",
        {"DECODE": "is_decode_or_idle()", "TARGET_VERIFY": "is_target_verify()",
         "DRAFT_EXTEND_V2": "is_draft_extend_v2()"},
    ),
    SglangFA3: (
        "_apply_cuda_graph_metadata",
        {"DECODE": "is_decode_or_idle()", "TARGET_VERIFY": "is_target_verify()",
         "DRAFT_EXTEND_V2": "is_draft_extend_v2()"},
    ),
}


def method_source(source: str, name: str) -> str:
    """The source of the first function `name` in a module's source."""
    tree = ast.parse(source)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(source, node) or ""


@needs_cuda_adapters_release
@pytest.mark.parametrize("cls", GPU_ADAPTERS)
def test_the_declared_graph_modes_are_the_ones_sglangs_graph_metadata_path_takes(cls):
    method, markers = GRAPH_SOURCES[cls]
    body = method_source(sglang_source(cls.engine_backend.partition(":")[0]), method)
    taken = {mode for mode, marker in markers.items() if f"forward_mode.{marker}" in body}
    assert taken == {str(m) for m in cls.capabilities.graph_modes}


@needs_cuda_adapters_release
@pytest.mark.parametrize("cls", GPU_ADAPTERS)
def test_the_fill_value_is_the_backends_and_the_harness_pads_with_it(cls):
    """Both backends pad seq_lens with 1 (get_cuda_graph_seq_len_fill_value), the harness's
    SEQ_LEN_FILL, which its reference reads a padding request's extent from."""
    source = sglang_source(cls.engine_backend.partition(":")[0])
    body = method_source(source, "get_cuda_graph_seq_len_fill_value")
    assert body.rstrip().endswith(f"return {SEQ_LEN_FILL}")


@needs_cuda_adapters_release
def test_sglangs_pools_are_built_once_over_the_runners_static_pool(monkeypatch):
    """The MHATokenToKVPool's K/V buffers are the static pool's storage (sglang's own set_kv_buffer
    writes into it), the ReqToTokenPool is as wide as every page a request can hold, and
    init_cuda_graph_state ran for the largest captured size, its page table that wide."""
    kernel_stand_ins(monkeypatch)
    adapter = SglangFA3()
    runner = graph_state(adapter)
    eg = adapter.engine_graph(runner.state)
    assert adapter.engine_graph(runner.state) is eg
    pool = runner.pool
    assert eg.kv.get_key_buffer(0).data_ptr() == pool.k.data_ptr()
    assert eg.kv.get_value_buffer(0).data_ptr() == pool.v.data_ptr()
    case = runner.state.layer.case
    k = torch.randn(1, case.num_kv_heads, case.head_dim).to(pool.k.dtype)
    eg.kv.set_kv_buffer(eg.layer, torch.tensor([40]), k, k.clone())
    assert torch.equal(pool.k.view(-1, case.num_kv_heads, case.head_dim)[40], k[0])
    assert eg.req_to_token.req_to_token.shape == (5, 96)
    assert eg.backend.decode_cuda_graph_metadata["page_table"].shape == (4, 6)
    assert runner.state.buffers["seq_lens"].tolist() == [SEQ_LEN_FILL] * 4


@needs_cuda_adapters_release
def test_a_replay_refills_the_persistent_req_to_token_rows(monkeypatch):
    """Each real request's row at its req_pool_indices entry (rows B..1), zero past its table; row 0,
    the padding requests', stays zero."""
    kernel_stand_ins(monkeypatch)
    adapter = SglangFA3()
    eg = adapter.engine_graph(graph_state(adapter).state)
    eg.req_to_token.req_to_token.fill_(9)  # rows an earlier replay left
    eg.req_to_token.req_to_token[0].zero_()
    batch = two_requests()
    rows = adapter.req_pool_indices(batch)
    adapter.replay_req_to_token(eg, batch, rows)
    table, width = eg.req_to_token.req_to_token, batch.req_to_token.shape[1]
    for r, row in enumerate(rows.tolist()):
        assert table[row, :width].tolist() == batch.req_to_token[r].tolist()
        assert not table[row, width:].any()
    assert not table[0].any() and (table[3:] == 9).all()


class PagedDecodeBackend:
    """A decode-only attention backend with sglang's graph-path methods in plain torch, where sglang's
    kernels do not run: its replay metadata is the padded batch's key slots read from the ReqToTokenPool
    by req_pool_indices and seq_lens; its forward writes the step's K/V through the pool's own
    set_kv_buffer at out_cache_loc and attends over the pool's buffers."""

    def __init__(self, r2t, kv, kv_index_translator):
        self.r2t, self.kv, self.kv_index_translator = r2t, kv, kv_index_translator
        self.plans = []  # the kv_loc_plan of each batch planned out of the graph

    def get_cuda_graph_seq_len_fill_value(self):
        return SEQ_LEN_FILL

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        width = self.r2t.req_to_token.shape[1]
        self.slots = torch.zeros(max_bs, width, dtype=torch.int64)
        self.keep = torch.zeros(max_bs, width, dtype=torch.bool)

    def init_forward_metadata_out_graph(self, fb, in_capture=False):
        self.plans.append(getattr(fb, "kv_loc_plan", None))
        bs, width = fb.batch_size, self.slots.shape[1]
        self.slots[:bs] = self.r2t.req_to_token[fb.req_pool_indices[:bs]].long()
        self.keep[:bs] = torch.arange(width) < fb.seq_lens[:bs, None]

    def init_forward_metadata_in_graph(self, fb):
        pass

    def forward(self, q, k, v, layer, fb, save_kv_cache=True):
        bs = fb.batch_size
        self.kv.set_kv_buffer(layer, fb.out_cache_loc, k, v)
        keep = self.keep[:bs]
        group = layer.tp_q_head_num // layer.tp_k_head_num
        keys = self.kv.get_key_buffer(0)[self.slots[:bs]].float().repeat_interleave(group, 2)
        vals = self.kv.get_value_buffer(0)[self.slots[:bs]].float().repeat_interleave(group, 2)
        vals = vals.masked_fill(~keep[:, :, None, None], 0)  # poison past each request's extent
        scores = torch.einsum("bhd,bwhd->bhw", q.view(bs, layer.tp_q_head_num, -1).float(), keys)
        scores = (scores * layer.scaling).masked_fill(~keep[:, None, :], float("-inf"))
        return torch.einsum("bhw,bwhd->bhd", scores.softmax(-1), vals).to(q.dtype).reshape(bs, -1)


@needs_cuda_adapters_release
def test_the_graph_path_replays_a_sequence_through_sglangs_pools(monkeypatch):
    """The replay check, on the CPU's emulated graphs, over the adapter's graph path with sglang's own
    pools and a plain-torch backend in place of FA3's kernels: each replay reads this step's K/V from
    the static pool, where the captured set_kv_buffer wrote it, and the refilled table and padded
    buffers; a batch of 3 replays padded to 4, then 1 and 2."""
    kernel_stand_ins(monkeypatch)
    adapter = SglangFA3()
    monkeypatch.setattr(adapter, "available", lambda device: None)

    built = []

    def backend(batch, r2t, kv):
        runner = adapter.model_runner(batch, r2t, kv)  # its KVIndexTranslator where the release has one
        built.append(PagedDecodeBackend(r2t, kv, getattr(runner, "kv_index_translator", None)))
        return built[-1]

    monkeypatch.setattr(adapter, "attention_backend", backend)
    monkeypatch.setattr(adapter, "serving_context", lambda batch: contextlib.nullcontext())

    def batch(prefixes, seed):
        return Case(mode="DECODE", requests=tuple(Request(p, 1) for p in prefixes), page_size=16, seed=seed)

    g = GraphCase((batch((37, 5, 20), 0), batch((9,), 1), batch((50, 2), 2)), max_batch=3, max_kv=96)
    result = replay_result(adapter, g, "cpu")
    assert result.status == "pass", result.reason
    plans = [plan for b in built for plan in b.plans]  # captures, then replays
    assert plans and all((plan is not None) == sglang_from(KV_LOC_PLAN_FROM) for plan in plans), plans


def test_the_graph_suite_skips_flashinfers_windowed_verify_and_draft_extend(monkeypatch):
    monkeypatch.setattr(SglangFlashInfer, "available", lambda self, device: None)
    for family, why in (("verify", "takes no kv_start_idx"), ("draft_extend_v2", "gets no window_left")):
        with pytest.raises(pytest.skip.Exception, match=why):
            graph_suite.run(GraphTarget("sglang_flashinfer", "cuda", GRAPH_CHECK, "swa", family))


# --- known issue sglang-fa3-cross-page-table: its confirmation and its script ------------------------

CROSS_PAGES = Case(mode="CROSS", requests=(Request(0, 1, 1), Request(6, 1, 20)), num_kv_heads=2, head_dim=64)


def fa3_reading_pages(  # noqa: ANN201 - flash_attn_with_kvcache's keywords
    q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, softmax_scale, causal, **kw
):
    """flash_attn_with_kvcache as FA3 reads a paged cache: key j of sequence b from page
    page_table[b, j // page_size] at offset j % page_size of k_cache [pages, page_size, heads, dim]."""
    ps = k_cache.shape[1]
    out = torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype, device=q.device)
    for b in range(len(cache_seqlens)):
        n, q0, q1 = int(cache_seqlens[b]), int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        j = torch.arange(n, device=q.device)
        k, v = (c[page_table[b, j // ps].long(), j % ps].float() for c in (k_cache, v_cache))
        g = q.shape[1] // k.shape[1]
        s = torch.einsum("qhd,khd->hqk", q[q0:q1].float(), k.repeat_interleave(g, 1)) * softmax_scale
        if causal:
            s = s.masked_fill(j > torch.arange(q1 - q0, device=q.device)[:, None] + n - (q1 - q0), -torch.inf)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v.repeat_interleave(g, 1)).to(q.dtype)
    return out


def converted_to_pages(init_forward_metadata):  # noqa: ANN001, ANN201
    """FlashAttentionBackend.init_forward_metadata with the encoder's table then reduced to pages, as
    its self-attention table is (`[:, strided_indices] // page_size`): sglang with the bug fixed."""

    def init(self, fb):  # noqa: ANN001, ANN202
        init_forward_metadata(self, fb)
        m, ps = self.forward_metadata, self.page_size
        m.encoder_page_table = m.encoder_page_table[:, ::ps] // ps

    return init


@needs_cuda_adapters_release
def test_the_cross_page_table_confirmation_reads_sglangs_plan(monkeypatch):
    """Confirmed where sglang's plan gives FA3 token slots as pages (pages of 16), not where a slot
    is its page (pages of 1), nor in another mode, nor once sglang converts the table."""
    from harness.checks import engine_confirm

    kernel_stand_ins(monkeypatch)
    assert engine_confirm.sglang_fa3_cross_page_table(CROSS_PAGES, "cpu")
    assert not engine_confirm.sglang_fa3_cross_page_table(CROSS_PAGES.replace(page_size=1), "cpu")
    decode = Case(mode="DECODE", requests=(Request(6, 1),), num_kv_heads=2, head_dim=64)
    assert not engine_confirm.sglang_fa3_cross_page_table(decode, "cpu")
    fab = importlib.import_module("sglang.srt.layers.attention.flashattention_backend")
    cls = fab.FlashAttentionBackend
    monkeypatch.setattr(cls, "init_forward_metadata", converted_to_pages(cls.init_forward_metadata))
    assert not engine_confirm.sglang_fa3_cross_page_table(CROSS_PAGES, "cpu")


@needs_cuda_adapters_release
@pytest.mark.parametrize("fixed", [False, True], ids=["as released", "table converted to pages"])
def test_the_cross_page_table_script_reproduces_with_fa3s_page_reads(fixed, monkeypatch, capsys):
    """known_issues/sglang_fa3_cross_page_table.py on the CPU, FA3 replaced by a torch kernel that reads
    a page table as FA3 does: as released, pages of 1 are right and pages of 16 wrong (exit 1); with
    the encoder's table converted to pages both are right (exit 0)."""
    import runpy

    kernel_stand_ins(monkeypatch)
    declare_torchvision_schemas()
    fab = importlib.import_module("sglang.srt.layers.attention.flashattention_backend")
    monkeypatch.setattr(fab, "flash_attn_with_kvcache", fa3_reading_pages)
    if fixed:
        cls = fab.FlashAttentionBackend
        monkeypatch.setattr(cls, "init_forward_metadata", converted_to_pages(cls.init_forward_metadata))
    script = Path(__file__).resolve().parent.parent / "known_issues" / "sglang_fa3_cross_page_table.py"
    code = runpy.run_path(str(script))["main"]()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("page_size")]
    assert [line.endswith(": right") for line in lines] == [True, fixed]
    assert code == (0 if fixed else 1)


# --- known issue sglang-fa3-cross-text-table: its confirmation and its script ------------------------

# The CROSS case that crashed sglang_fa3 on an H200 (0.5.17): request 0's encoder (33) plus the longest
# text (18) is 51 columns, its rows 46.
CROSS_LONGER_TEXT = Case(
    mode="CROSS",
    requests=(Request(0, 13, 33), Request(0, 13, 33), Request(0, 13, 33), Request(0, 18, 18)),
    soft_cap=30.0,
    sinks=True,
    sm_scale=0.3,
    logits="ties",
    seed=4702,
)


def text_table_clamped_to_the_row(fab: ModuleType):
    """FlashAttentionBackend.init_forward_metadata with its text page table's gather clamped to the
    ReqToTokenPool's row: each request's own text (inside its row) gathered as released, the columns
    past it, which FA3 never reads (cache_seqlens bounds each request), the row's last slot. sglang with
    the bug fixed: the installed release's own source compiled again with that one gather changed."""
    source = textwrap.dedent(inspect.getsource(fab.FlashAttentionBackend.init_forward_metadata))
    gather = "text_row, text_col"
    assert source.count(gather) == 1, "the released gather is not where the known issue says"
    clamped = "text_row, text_col.clamp(max=self.req_to_token_pool.req_to_token.shape[1] - 1)"
    scope: dict = {}
    exec(compile(source.replace(gather, clamped), fab.__file__, "exec"), vars(fab), scope)
    return scope["init_forward_metadata"]


@needs_cuda_adapters_release
def test_the_cross_text_table_confirmation_reads_sglangs_plan(monkeypatch):
    """Confirmed where sglang's own plan gathers past the row (the H200's case, asked for CUDA: planned
    on the CPU all the same), not where every gather stays in it (equal texts; a longer text whose
    request has the longest encoder too), nor in another mode, nor once sglang clamps its gather."""
    from harness.checks import engine_confirm

    kernel_stand_ins(monkeypatch)
    confirm = engine_confirm.sglang_fa3_cross_text_table
    assert confirm(CROSS_LONGER_TEXT, "cuda")
    equal = CROSS_LONGER_TEXT.replace(requests=(Request(0, 13, 33), Request(0, 13, 18)))
    longest_both = CROSS_LONGER_TEXT.replace(requests=(Request(0, 13, 18), Request(0, 18, 33)))
    decode = Case(mode="DECODE", requests=(Request(6, 1),), num_kv_heads=2, head_dim=64)
    assert not any(confirm(c, "cpu") for c in (equal, longest_both, decode))
    fab = importlib.import_module("sglang.srt.layers.attention.flashattention_backend")
    init = text_table_clamped_to_the_row(fab)
    monkeypatch.setattr(fab.FlashAttentionBackend, "init_forward_metadata", init)
    assert not confirm(CROSS_LONGER_TEXT, "cpu")


@needs_cuda_adapters_release
@pytest.mark.parametrize("fixed", [False, True], ids=["as released", "gather clamped to the row"])
def test_the_cross_text_table_script_reproduces(fixed, monkeypatch, capsys):
    """known_issues/sglang_fa3_cross_text_table.py on the CPU: as released, rows of 51 plan in bounds and
    rows of 46 raise (exit 1, BUG); with the gather clamped to the row both plan each request's text
    (exit 0)."""
    import runpy

    kernel_stand_ins(monkeypatch)
    declare_torchvision_schemas()
    if fixed:
        fab = importlib.import_module("sglang.srt.layers.attention.flashattention_backend")
        init = text_table_clamped_to_the_row(fab)
        monkeypatch.setattr(fab.FlashAttentionBackend, "init_forward_metadata", init)
    script = Path(__file__).resolve().parent.parent / "known_issues" / "sglang_fa3_cross_text_table.py"
    code = runpy.run_path(str(script))["main"]()
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("rows of")]
    plans = [line.rpartition("init_forward_metadata: ")[2] for line in rows]
    assert plans[0] == "in bounds"
    assert (plans[1] == "in bounds") == fixed and ("BUG:" in out) != fixed
    assert code == (0 if fixed else 1)


# --- sglang's FA3 decoder self-attention in an encoder-decoder batch on pages: its script ----------


def reading_token_slots(init):  # noqa: ANN001, ANN201
    """FlashAttentionBackend.__init__ planning and reading an encoder-decoder model's pool in token
    slots (pages of one token: no reduction, the pool viewed slot by slot) whatever the pool's page size:
    sglang with the bug fixed."""

    def init_in_slots(self, model_runner, *args, **kwargs):  # noqa: ANN001, ANN202
        init(self, model_runner, *args, **kwargs)
        if model_runner.model_config.is_encoder_decoder:
            self.page_size = 1

    return init_in_slots


@needs_cuda_adapters_release
@pytest.mark.parametrize("fixed", [False, True], ids=["as released", "read in token slots"])
def test_the_encoder_decoder_self_attention_pages_script_reproduces(fixed, monkeypatch, capsys):
    """known_issues/sglang_fa3_encdec_self_pages.py on the CPU: as released, the text's page table is
    right on pages of 1 and with encoders of whole pages, wrong on pages of 16 after encoders of 5 and
    20 tokens (exit 1, BUG); an encoder-decoder backend reading token slots is right on each (exit 0)."""
    import runpy

    kernel_stand_ins(monkeypatch)
    declare_torchvision_schemas()
    if fixed:
        cls = importlib.import_module(
            "sglang.srt.layers.attention.flashattention_backend"
        ).FlashAttentionBackend
        monkeypatch.setattr(cls, "__init__", reading_token_slots(cls.__init__))
    script = Path(__file__).resolve().parent.parent / "known_issues" / "sglang_fa3_encdec_self_pages.py"
    code = runpy.run_path(str(script))["main"]()
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("page_size")]
    assert [line.endswith(": right") for line in lines] == [True, fixed, True]
    assert ("BUG:" in out) != fixed
    assert code == (0 if fixed else 1)
