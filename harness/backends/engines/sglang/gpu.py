"""What sglang's CUDA attention backends read from a serving process, made here: the model runner,
the model config, the published server args and a one-rank parallel state (the stand-ins), and the
adapter base that drives a CUDA backend through engine.py's translation.

sglang's FlashInferAttnBackend and FlashAttentionBackend read far more of the ModelRunner at
construction than the CPU backends (heads, context length, page size, KV dtype, the model's window,
the speculative algorithm, the parallel sizes) and, through sglang.srt.runtime_context, the server
args its scheduler published and the parallel topology. Each read is carried here, enumerated from
the code of every release in SGLANG_GPU's range (0.5.17 .. 0.5.23); where a release reads more, the
stand-in carries it from that release on (RUNNER_READS_FROM), chosen by the installed release;
docs/engines.md lists them.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
from collections.abc import Iterator
from functools import cache
from types import SimpleNamespace
from typing import Any

import torch
from packaging.version import Version

from harness.backends.engines.base import Engine, StandIn, model_dir
from harness.backends.engines.sglang import spec
from harness.backends.engines.sglang.engine import SglangAdapter, declare_torchvision_schemas
from harness.backends.versions import SupportedRange
from harness.core.batch import Batch
from harness.core.modes import Mode

SGLANG_GPU = Engine(
    "sglang",
    SupportedRange(
        distribution="sglang",
        module="sglang",
        lowest="0.5.17",
        below="0.5.24",
        tested=(),
        why_lowest="the stand-ins carry what FlashInferAttnBackend and FlashAttentionBackend read from "
        "0.5.17 on (ModelRunner attributes, runtime_context's get_parallel() and published ServerArgs, "
        "the metadata methods init_forward_metadata_out_graph / _in_graph); 0.5.16 and older plan graphs "
        "through other methods; 0.5.24 and newer are not read yet",
    ),
)

# The model runner's attributes a release's backends read beyond 0.5.17's, with the first release
# that reads each (read from flashinfer_backend.py and flashattention_backend.py of each release).
# FlashInferAttnBackend reads the backend names there, where 0.5.17 asked
# server_args.get_attention_backends().
RUNNER_READS_FROM = {
    "prefill_attention_backend_str": "0.5.18",
    "decode_attention_backend_str": "0.5.18",
    "kv_index_translator": "0.5.19",  # both backends: write ids, read sources, page tables
    "attn_cp_size": "0.5.21",  # FlashAttentionBackend 0.5.21 only; 0.5.22 reads get_parallel()'s
}

# From this release on ServerArgs has no `override`; EAGLE's settings are given at construction.
SPEC_ARGS_AT_CONSTRUCTION_FROM = "0.5.18"
# From this release on a ForwardBatch carries a KV location plan (kv_loc_plan) that ForwardBatch.init_new
# binds through the model runner's KVIndexTranslator and both backends pass on to it.
KV_LOC_PLAN_FROM = "0.5.22"
# From this release on runtime_context lists its parallel fields with _parallel_fields(), not
# _PARALLEL_FIELDS.
PARALLEL_FIELDS_FUNCTION_FROM = "0.5.21"


def sglang_from(release: str) -> bool:
    """Whether the installed sglang is `release` or newer (the stand-ins differ by release)."""
    installed = SGLANG_GPU.release()
    return installed is not None and Version(installed) >= Version(release)


# sglang's modules the CUDA adapters use beyond engine.MODULES, by short name.
GPU_MODULES = {
    "context": "sglang.srt.runtime_context",
    "server_args": "sglang.srt.server_args",
    "model_config": "sglang.srt.configs.model_config",
    "allocator": "sglang.srt.mem_cache.allocator.token",
    "spec": "sglang.srt.speculative.spec_info",
    "eagle": "sglang.srt.speculative.eagle_info",
}

# sglang's KVIndexTranslator (0.5.19 on).
KV_INDEX_TRANSLATOR = "sglang.srt.mem_cache.kv_index_translator"

# The harness's speculative modes, which sglang's ForwardMode names alike.
SPEC_MODES = (Mode.TARGET_VERIFY, Mode.DRAFT_EXTEND_V2)

# The Case's FP8 KV dtypes as sglang's --kv-cache-dtype names them (ModelRunner.kv_cache_dtype_str).
KV_CACHE_DTYPE_STR = {None: "auto", "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}

MODEL_RUNNER = StandIn(
    "model runner",
    "sglang's real pools and TokenToKVPoolAllocator; device, dtype (the case's), page_size, kv_cache_dtype "
    "and kv_cache_dtype_str (the pool's), sliding_window_size (the layer's window, None without one), "
    "attention_chunk_size None, is_draft_worker False, spec_algorithm (SpeculativeAlgorithm of the server "
    "args), ps (sglang's get_parallel()), server_args and model_config (below); from 0.5.18 "
    "prefill_attention_backend_str and decode_attention_backend_str (the adapter's backend), from 0.5.19 "
    "kv_index_translator (sglang's own KVIndexTranslator over the pools, as ModelRunner builds it), from "
    "0.5.21 attn_cp_size 1",
    "the backends read only these attributes of the ModelRunner at construction (0.5.17 .. 0.5.23); a real "
    "one loads a model, captures graphs and starts distributed groups, nothing of which reaches attention",
)
MODEL_CONFIG = StandIn(
    "model config",
    "num_attention_heads, get_num_kv_heads(tp), get_max_num_attention_heads(), head_dim, v_head_dim, "
    "context_len (the row width), is_encoder_decoder (a cross layer), is_multimodal False, "
    "is_local_attention_model False, attention_arch MHA, attention_chunk_size None, hf_config.architectures "
    "['LlamaForCausalLM'], hf_text_config (num_attention_heads, attn_logit_softcapping: the case's soft cap)",
    "sglang's ModelConfig parses a served model's config and weights index; the backends read only the "
    "attention geometry and these flags from it",
)
SERVER_ARGS = StandIn(
    "server args",
    "sglang's own ServerArgs for a local one-layer Llama of the case's heads (config.json only), "
    "attention_backend the adapter's, enable_deterministic_inference the case's deterministic, published "
    "with sglang's set_global_server_args_for_scheduler (whose runtime_context bags, get_spec() / "
    "get_exec() / ..., the backends read from 0.5.18)",
    "a scheduler publishes its ServerArgs before it builds the model runner; the backends read their "
    "switches (deterministic inference, multi-item scoring, speculative settings, graph batch sizes) from "
    "them, every other one left at sglang's default",
)
PARALLEL_STATE = StandIn(
    "parallel state",
    "a one-rank topology (every *_size 1, every *_rank 0) through sglang's own "
    "runtime_context.get_parallel().override, while the backend is built and runs",
    "get_parallel() reads the sizes from distributed groups a serving process initialises over NCCL; the "
    "harness runs one rank, where every size is 1, and no group is used on the attention path",
)
KV_SCALES = StandIn(
    "KV-cache scales",
    "the layer's k_scale/v_scale tensors and k_scale_float/v_scale_float, set to the case's FP8 scales",
    "a checkpoint with KV-cache scales leaves them so after loading (BaseKVCacheMethod."
    "process_weights_after_loading); there is no checkpoint",
)


def one_rank_topology(fields: frozenset[str]) -> dict[str, int]:
    """The values of sglang's parallel fields (runtime_context._PARALLEL_FIELDS) in a one-rank world:
    every size 1, every rank 0; flags and groups are left to sglang."""
    return {f: 1 if f.endswith("_size") else 0 for f in fields if f.endswith(("_size", "_rank"))}


@cache
def server_args(cls: type, attention_backend: str, model_path: str, device: str, deterministic: bool) -> Any:
    """sglang's ServerArgs for a model directory, attention backend and device, with or without
    `--enable-deterministic-inference` (which both CUDA backends read at construction: FA3's
    num_splits 1, FlashInfer's fixed split tiles and paged extend), built once per process: its
    __post_init__ reads the model's config and resolves every default (seconds)."""
    return resolved_server_args(cls, attention_backend, model_path, device, deterministic)


def resolved_server_args(
    cls: type, attention_backend: str, model_path: str, device: str, deterministic: bool, **settings: Any
) -> Any:
    """A ServerArgs as a server resolves it from its flags: these, `settings`, and sglang's defaults."""
    return cls(
        model_path=model_path,
        attention_backend=attention_backend,
        device=device,
        skip_tokenizer_init=True,
        enable_deterministic_inference=deterministic,
        **settings,
    )


@cache
def spec_server_args(
    cls: type,
    attention_backend: str,
    model_path: str,
    device: str,
    deterministic: bool,
    topk: int,
    steps: int,
    num_draft: int,
) -> Any:
    """ServerArgs with EAGLE's settings of one tree shape, built once per process for each: the args a run
    publishes are the ones its model runner holds. 0.5.17 copies server_args' and sets them through
    ServerArgs.override (resolved server args are read-only; the copy leaves the cached ones as they
    were). Later releases have no override and take them at construction, where sglang's resolution
    sets a chain's (topk 1) speculative_num_draft_tokens to speculative_num_steps + 1
    (_handle_eagle_family): a chain of num_draft tokens is given num_draft - 1 steps, which keeps
    its width (the steps drive the draft model's multi-step decode, no verify)."""
    settings = {
        "speculative_algorithm": "EAGLE",
        "speculative_eagle_topk": topk,
        "speculative_num_steps": steps,
        "speculative_num_draft_tokens": num_draft,
    }
    if sglang_from(SPEC_ARGS_AT_CONSTRUCTION_FROM):
        if topk == 1:
            settings["speculative_num_steps"] = num_draft - 1
        return resolved_server_args(cls, attention_backend, model_path, device, deterministic, **settings)
    args = copy.deepcopy(server_args(cls, attention_backend, model_path, device, deterministic))
    args.override(spec.SPEC_INPUTS.what, **settings)
    return args


class SglangGpuAdapter(SglangAdapter):
    """A CUDA sglang backend: engine.py's translation, with the stand-ins above around it."""

    engine = SGLANG_GPU
    requires = (("sglang-kernel", "sglang's CUDA kernels, sgl_kernel"),)
    stand_ins = (MODEL_RUNNER, MODEL_CONFIG, SERVER_ARGS, PARALLEL_STATE, KV_SCALES, spec.SPEC_INPUTS)
    attention_backend_name: str  # sglang's --attention-backend for this backend

    def gpu(self) -> SimpleNamespace:
        """sglang's runtime context, server args, model config, allocator and speculative modules
        (imported without the backend's module, which needs the CUDA kernels)."""
        declare_torchvision_schemas()
        return SimpleNamespace(**{k: importlib.import_module(m) for k, m in GPU_MODULES.items()})

    # --- the stand-ins --------------------------------------------------------------------------

    def server_args(self, batch: Batch) -> Any:
        """The SERVER_ARGS stand-in (not yet published); in a speculative mode a copy with EAGLE's
        settings of the batch's trees (SPEC_INPUTS), which FlashAttentionBackend reads at construction."""
        case = batch.case
        key = (
            self.gpu().server_args.ServerArgs,
            self.attention_backend_name,
            model_dir(case.num_q_heads, case.num_kv_heads, case.head_dim),
            batch.device.type,
            case.deterministic,
        )
        if batch.mode not in SPEC_MODES:
            return server_args(*key)
        return spec_server_args(*key, *spec.spec_shape(batch))

    def model_config(self, batch: Batch, context_len: int) -> SimpleNamespace:
        """The MODEL_CONFIG stand-in; `context_len` is the ReqToTokenPool's row width (the eager run's
        table, or the graph path's persistent one), which the backends size their buffers by."""
        case = batch.case
        arch = self.gpu().model_config.AttentionArch
        cap = case.soft_cap or None
        text = SimpleNamespace(num_attention_heads=case.num_q_heads, attn_logit_softcapping=cap)
        return SimpleNamespace(
            num_attention_heads=case.num_q_heads,
            get_num_kv_heads=lambda tp_size: max(1, case.num_kv_heads // tp_size),
            get_max_num_attention_heads=lambda: case.num_q_heads,
            head_dim=case.head_dim,
            v_head_dim=case.head_dim,
            context_len=context_len,
            is_encoder_decoder=batch.mode == Mode.CROSS,
            is_multimodal=False,
            is_local_attention_model=False,
            attention_arch=arch.MHA,
            attention_chunk_size=None,
            hf_config=SimpleNamespace(architectures=["LlamaForCausalLM"]),
            hf_text_config=text,
        )

    def model_runner(self, batch: Batch, r2t: Any, kv: Any) -> SimpleNamespace:
        """The MODEL_RUNNER stand-in, over sglang's real pools and allocator, with what the installed
        release reads beyond 0.5.17's (RUNNER_READS_FROM)."""
        case, g = batch.case, self.gpu()
        args = self.server_args(batch)
        window = self.window_left(batch)
        allocator = g.allocator.TokenToKVPoolAllocator(
            size=kv.size, dtype=kv.dtype, device=str(batch.device), kvcache=kv, need_sort=False
        )
        runner = SimpleNamespace(
            device=str(batch.device),
            dtype=batch.q.dtype,
            page_size=case.page_size,
            req_to_token_pool=r2t,
            token_to_kv_pool=kv,
            token_to_kv_pool_allocator=allocator,
            kv_cache_dtype=kv.dtype,
            kv_cache_dtype_str=KV_CACHE_DTYPE_STR[case.kv_dtype],
            sliding_window_size=window if window >= 0 else None,
            attention_chunk_size=None,
            is_draft_worker=False,
            spec_algorithm=self.spec_algorithm(batch),
            ps=g.context.get_parallel(),
            server_args=args,
            model_config=self.model_config(batch, r2t.req_to_token.shape[1]),
        )
        later = {
            "prefill_attention_backend_str": lambda: self.attention_backend_name,
            "decode_attention_backend_str": lambda: self.attention_backend_name,
            "kv_index_translator": lambda: self.kv_index_translator(runner),
            "attn_cp_size": lambda: 1,
        }
        for name, release in RUNNER_READS_FROM.items():
            if sglang_from(release):
                setattr(runner, name, later[name]())
        return runner

    def kv_index_translator(self, runner: SimpleNamespace) -> Any:
        """sglang's KVIndexTranslator over the stand-in's pools, as ModelRunner.init_kv_index_translator
        builds it (0.5.19 on; is_draft_worker, from 0.5.22, left at its default False)."""
        module = importlib.import_module(KV_INDEX_TRANSLATOR)
        return module.KVIndexTranslator(
            req_to_token=runner.req_to_token_pool.req_to_token,
            token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
            token_to_kv_pool=runner.token_to_kv_pool,
            page_size=runner.page_size or 1,
            device=runner.device,
        )

    def forward_mode(self, batch: Batch) -> Any:
        """sglang's TARGET_VERIFY and DRAFT_EXTEND_V2 for the speculative modes, else engine.py's."""
        if batch.mode in SPEC_MODES:
            return getattr(self.sg().batch.ForwardMode, str(batch.mode))
        return super().forward_mode(batch)

    def spec_info(self, batch: Batch, rows: torch.Tensor) -> Any:
        """The SPEC_INPUTS stand-in of a speculative mode, None in the others."""
        g = self.gpu()
        if batch.mode == Mode.TARGET_VERIFY:
            return spec.verify_input(g.eagle, self.sg().batch.CaptureHiddenMode, batch)
        if batch.mode == Mode.DRAFT_EXTEND_V2:
            return spec.draft_extend_input(g.eagle, batch, rows)
        return None

    def forward_batch(self, batch: Batch, rows: torch.Tensor) -> Any:
        """engine.py's ForwardBatch with the speculative input (sglang's worker sets spec_info before
        init_forward_metadata; a verify's positions are the tree's depths, the Batch's already)."""
        fb = super().forward_batch(batch, rows)
        fb.spec_info = self.spec_info(batch, rows)
        fb.spec_algorithm = self.spec_algorithm(batch)
        return fb

    def spec_algorithm(self, batch: Batch) -> Any:
        """The batch's SpeculativeAlgorithm, as ForwardBatch.init_new copies it from the schedule batch
        (FlashAttentionBackend.forward_extend asks it is_uno() in a verify tree's cascade from 0.5.20)."""
        algorithm = self.server_args(batch).speculative_algorithm
        return self.gpu().spec.SpeculativeAlgorithm.from_string(algorithm)

    def bind_forward_batch(self, backend: Any, fb: Any) -> None:
        """From 0.5.22 (KV_LOC_PLAN_FROM), the plan ForwardBatch.init_new binds: the translator's
        own_plan of the batch, bound to it (kv_loc_plan, kv_loc_cols, its write ids)."""
        if sglang_from(KV_LOC_PLAN_FROM):
            translator = backend.kv_index_translator
            translator.own_plan(fb).bind(fb, translator)

    @contextlib.contextmanager
    def serving_context(self, batch: Batch) -> Iterator[None]:
        """SERVER_ARGS published and PARALLEL_STATE in force while the backend is built and runs."""
        g = self.gpu()
        g.server_args.set_global_server_args_for_scheduler(self.server_args(batch))
        fields = (
            g.context._parallel_fields()
            if sglang_from(PARALLEL_FIELDS_FUNCTION_FROM)
            else g.context._PARALLEL_FIELDS
        )
        topology = one_rank_topology(fields)
        with g.context.get_parallel().override(**topology):
            yield

    def layer(self, batch: Batch) -> Any:
        """engine.py's RadixAttention, with the KV_SCALES stand-in for an FP8 cache."""
        layer = super().layer(batch)
        if batch.case.kv_dtype is not None:
            k, v = batch.case.k_scale, batch.case.v_scale
            layer.k_scale = torch.tensor(k, dtype=torch.float32, device=batch.device)
            layer.v_scale = torch.tensor(v, dtype=torch.float32, device=batch.device)
            layer.k_scale_float, layer.v_scale_float = k, v
        return layer
