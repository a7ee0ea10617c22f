"""The CUDA-graph path of the vLLM GPU adapters: vLLM's own full-cudagraph mechanism, unmodified, driven
the way its GPU model runner drives it (vllm/v1/worker/gpu_model_runner.py).

vLLM captures attention in `CUDAGraphMode.FULL_DECODE_ONLY` over persistent input buffers, one
metadata builder per KV-cache group that keeps its own persistent state, and rebuilds the metadata
over the same buffers before every replay. The harness's graph protocol (graph_glue.py) maps onto it:

- `graph_buffers`: a VllmConfig whose compilation config is FULL_DECODE_ONLY with the runner's capture
  sizes in tokens (`compilation_config`), the layer, ONE metadata builder for every size (its
  persistent state: FlashAttention's `scheduler_metadata` buffer for FA3's AOT scheduling and its
  `max_num_splits` bound, FlashInfer's per-size cudagraph decode wrappers over its `paged_kv_*`
  buffers), and the runner's persistent buffers `query_start_loc` (with its host copy), `seq_lens`,
  the block table, `slot_mapping` and `positions`, sized for the limits;
- `capture_metadata`: `_dummy_run`'s capture batch: bs requests of `queries` tokens each, seq_lens =
  queries, block-table rows at the null block, slot_mapping -1 (the cache write skips the row),
  max_seq_len = max_model_len, then `build_for_cudagraph_capture`;
- `replay_metadata`: `_prepare_inputs` and `_build_attention_metadata` padded to bs: the real requests,
  then padding requests of no query (query_start_loc repeats its last value), seq_lens 0, the null
  block, slot -1; num_actual_tokens the padded count; then the builder's `build()` over the same
  buffers, which refills its own persistent state (the captured forward keeps the capture-time
  metadata object: its tensors are views of those buffers, its Python values frozen, as in vLLM);
- `graph_forward`: the adapter's `store` (the impl's `do_kv_cache_update`) at the slot_mapping buffer
  and the impl's `forward`.

The cache: vLLM packs a token's K and V in one row ([blocks, block size, kv heads, 2 * head_dim]),
while the runner's PagedPool holds K and V in two allocations, so no single tensor views both. vLLM's
kv_cache is one persistent tensor (allocated once, before the first capture, for the static pool's
pages); before each replay, outside the captured region, every slot of the batch's pool (which the
runner has just loaded into its static pool) goes into it through the backend's own write, as the
eager path fills it (stand-in "earlier steps' cache"). The captured region is then exactly vLLM's:
its write of the step's K/V at the persistent slot_mapping and its forward over the persistent
metadata, reading that cache; a wrong slot, extent, page or plan in the replay shows in the output
the check compares. After the forward the step's K/V are kept in the static pool (graph_write_kv), as
the eager path keeps them (keep_kv).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.backends.engines.vllm.driver import LAYER_NAME
from harness.backends.graph_glue import GraphGlue, GraphLimits, GraphState, StaticInputs, capture_sizes
from harness.core.batch import Batch
from harness.core.modes import Mode

NULL_BLOCK = 0  # vllm.v1.attention.backends.utils.NULL_BLOCK_ID: the block of a padding request
PAD_SLOT = -1  # slot_mapping of a padding token: vLLM's cache writes skip it (_get_slot_mappings)

# What each AttentionCGSupport level of a metadata builder lets vLLM's runner capture in FULL mode
# (vllm/v1/attention/backend.py): uniform single-token decode; uniform batches of 1 + num_speculative_tokens
# queries (decode and verify); ALWAYS adds mixed batches, which the harness does not capture.
CUDAGRAPH_SUPPORT_MODES = {
    "NEVER": frozenset(),
    "UNIFORM_SINGLE_TOKEN_DECODE": frozenset({Mode.DECODE}),
    "UNIFORM_BATCH": frozenset({Mode.DECODE, Mode.TARGET_VERIFY}),
    "ALWAYS": frozenset({Mode.DECODE, Mode.TARGET_VERIFY}),
}

GRAPH_WHY = {
    "graph DRAFT_EXTEND_V2": "vLLM captures FULL graphs of the target model's uniform decode batches "
    "(uniform_decode_query_len = 1 + num_speculative_tokens: decode and verify); a draft extend runs in "
    "its EAGLE proposer, whose graphs the adapter does not drive",
}


def graph_modes_for(support: str) -> frozenset[Mode]:
    """The modes a builder's cudagraph support level (an AttentionCGSupport name) lets vLLM capture."""
    if support not in CUDAGRAPH_SUPPORT_MODES:
        levels = ", ".join(CUDAGRAPH_SUPPORT_MODES)
        raise ValueError(f"unknown AttentionCGSupport level {support!r}: one of {levels}")
    return CUDAGRAPH_SUPPORT_MODES[support]


@dataclass
class VllmGraphState(GraphState):
    """GraphState plus vLLM's own objects, made once for every captured size: its config, the layer,
    the metadata builder, and the layer's kv_cache (allocated at the first, uncaptured, forward)."""

    config: Any = None
    attn_layer: Any = None
    builder: Any = None
    kv_cache: torch.Tensor | None = None


class VllmGraph(GraphGlue):
    """The replay path of a vLLM GPU adapter (module doc). Mixed in after VllmEngine, whose eager
    translation (seq_lens, block_table, slot_mapping, make_layer, fill_cache, store) it reuses."""

    # --- the protocol --------------------------------------------------------------------------

    def graph_buffers(self, limits: GraphLimits, batch: Batch) -> GraphState:
        from vllm.config import set_current_vllm_config

        base = super().graph_buffers(limits, batch)
        state = VllmGraphState(limits, batch, buffers=base.buffers)
        tokens = capture_sizes(limits.max_batch)[-1] * limits.queries
        with self.batch_invariance(batch.case):
            state.config = self.vllm_config(
                batch,
                compilation=self.compilation_config(limits),
                longest=limits.max_kv,
                sequences=limits.max_batch,
                tokens=tokens,
            )
            self.check_full_decode_mode(state.config)
            self.runner_buffers(state, -(-state.config.model_config.max_model_len // limits.page_size))
            state.attn_layer = self.make_layer(batch, state.config)
            spec = self.kv_cache_spec(batch, state.attn_layer, state.config)
            with set_current_vllm_config(state.config):
                builder_cls = state.attn_layer.attn_backend.get_builder_cls()
                state.builder = builder_cls(spec, [LAYER_NAME], state.config, batch.device)
        return state

    def capture_metadata(self, state: GraphState, bs: int) -> None:
        assert isinstance(state, VllmGraphState) and state.pool is not None
        # vLLM's cache holds the static pool's pages (graph_forward): its block count, which flex's
        # builder sizes its block mask by (cache_config.num_gpu_blocks, as the runner sets it)
        state.config.cache_config.num_gpu_blocks = state.pool.num_pages
        self.capture_buffers(state, bs)
        common = self.graph_common_metadata(state, bs, state.config.model_config.max_model_len)
        state.per_size[bs] = self.build(state, common, capture=True)

    def replay_metadata(self, state: GraphState, batch: Batch, bs: int) -> None:
        assert isinstance(state, VllmGraphState)
        self.replay_buffers(state, batch, bs)
        self.replay_out_cache_loc(state, batch, bs)
        self.build(state, self.graph_common_metadata(state, bs, max(self.seq_lens(batch))), capture=False)
        assert state.kv_cache is not None, "the graphs are captured before the first replay"
        self.fill_cache(batch, state.attn_layer, state.kv_cache)

    def graph_forward(self, state: GraphState, static: StaticInputs) -> torch.Tensor:
        """vLLM's write at the slot_mapping buffer and its forward over the capture-time metadata;
        then the step's K/V kept in the static pool, as the eager path keeps them."""
        from vllm.config import set_current_vllm_config

        assert isinstance(state, VllmGraphState)
        layer, rows = state.attn_layer, static.bs * state.limits.queries
        if state.kv_cache is None:  # the first forward is the uncaptured warm-up: allocate here, once
            state.kv_cache = self.kv_cache(state.layer, layer, static.pool.num_pages).zero_()
        slots = state.buffers["slot_mapping"][:rows]
        self.store(state.layer, layer, state.kv_cache, slots, static.k_new, static.v_new)
        out = torch.empty_like(static.q)
        with self.batch_invariance(state.layer.case), set_current_vllm_config(state.config):
            metadata, kv = state.per_size[static.bs], state.kv_cache
            layer.impl.forward(layer, static.q, static.k_new, static.v_new, kv, metadata, output=out)
        self.graph_write_kv(state, static)
        return out

    # --- vLLM's configuration ------------------------------------------------------------------

    def compilation_config(self, limits: GraphLimits) -> Any:
        """`--compilation-config` of a server capturing FULL decode graphs at the runner's sizes, in
        tokens (vLLM's capture sizes count tokens: bs requests of `queries` each)."""
        from vllm.config import CompilationConfig, CUDAGraphMode

        sizes = [bs * limits.queries for bs in capture_sizes(limits.max_batch)]
        return CompilationConfig(
            cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY,
            cudagraph_capture_sizes=sizes,
            max_cudagraph_capture_size=sizes[-1],
        )

    def check_full_decode_mode(self, config: Any) -> None:
        """Raise when VllmConfig turned the FULL decode graphs off (it does on a platform without static
        graphs, under enforce_eager, ...): the builders would then keep no persistent state."""
        from vllm.config import CUDAGraphMode

        mode = config.compilation_config.cudagraph_mode
        if mode.decode_mode() != CUDAGraphMode.FULL:
            raise RuntimeError(f"VllmConfig set cudagraph_mode {mode.name}: no FULL decode graphs")

    # --- the runner's persistent buffers -------------------------------------------------------

    def runner_buffers(self, state: GraphState, blocks_per_request: int) -> None:
        """The model runner's persistent inputs for max_batch requests: query_start_loc [n + 1] (and its
        host copy), seq_lens [n] (and its host copy), the block table [n, blocks_per_request] (vLLM's
        BlockTable: max_model_len in blocks; at least the limits' pages), slot_mapping and positions
        [n * queries] (int64)."""
        limits, dev, b = state.limits, state.device, state.buffers
        n, rows = limits.max_batch, limits.max_batch * limits.queries
        blocks_per_request = max(blocks_per_request, limits.max_pages)
        b["query_start_loc"] = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        b["query_start_loc_cpu"] = torch.zeros(n + 1, dtype=torch.int32)
        b["seq_lens"] = torch.zeros(n, dtype=torch.int32, device=dev)
        b["seq_lens_cpu"] = torch.zeros(n, dtype=torch.int32)
        b["block_table"] = torch.zeros(n, blocks_per_request, dtype=torch.int32, device=dev)
        b["slot_mapping"] = torch.full((rows,), PAD_SLOT, dtype=torch.int64, device=dev)
        b["positions"] = torch.zeros(rows, dtype=torch.int64, device=dev)

    def capture_buffers(self, state: GraphState, bs: int) -> None:
        """_dummy_run's capture batch: bs requests of `queries` tokens, seq_lens = queries (its
        max_query_len), the null block, slot -1 for every token (the dummy run writes no K/V)."""
        b, q = state.buffers, state.limits.queries
        cum = torch.arange(0, (bs + 1) * q, q, dtype=torch.int32)
        self.write_query_start_loc(state, cum, bs)
        seq = torch.full((bs,), q, dtype=torch.int32)
        self.write_seq_lens(state, seq)
        b["block_table"][:bs].fill_(NULL_BLOCK)
        b["slot_mapping"].fill_(PAD_SLOT)
        b["positions"][: bs * q].copy_(torch.arange(q).repeat(bs))

    def replay_buffers(self, state: GraphState, batch: Batch, bs: int) -> None:
        """The real batch padded to bs requests, as _prepare_inputs and _build_attention_metadata write
        it: query_start_loc padded with its last value (padding requests have no query), seq_lens 0
        past the real requests, their block-table rows at the null block, slot -1 past the real tokens."""
        b = state.buffers
        self.write_query_start_loc(state, batch.host_tensor("qo_indptr"), bs)
        self.write_seq_lens(state, torch.tensor(self.seq_lens(batch), dtype=torch.int32))
        self.replay_block_table(state, batch, bs)
        real = int(batch.q.shape[0])
        b["slot_mapping"][:real].copy_(self.slot_mapping(batch))
        b["slot_mapping"][real:].fill_(PAD_SLOT)
        b["positions"][:real].copy_(batch.positions.long())

    def write_query_start_loc(self, state: GraphState, cum: torch.Tensor, bs: int) -> None:
        """query_start_loc of len(cum) - 1 requests, every later entry at the last value (vLLM keeps it
        non-decreasing for FlashAttention)."""
        self.write_padded(state, "query_start_loc", cum, int(cum[-1]))

    def write_seq_lens(self, state: GraphState, seq: torch.Tensor) -> None:
        """seq_lens of the requests, 0 past them (vLLM's `self.seq_lens[num_reqs:].fill_(0)`)."""
        self.write_padded(state, "seq_lens", seq, 0)

    def write_padded(self, state: GraphState, name: str, values: torch.Tensor, pad: int) -> None:
        """`values` then `pad` into the host copy `name`_cpu, then the whole host copy into the device
        buffer `name`, as the runner keeps its CpuGpuBuffers."""
        host = state.buffers[f"{name}_cpu"]
        host[: values.numel()].copy_(values)
        host[values.numel() :].fill_(pad)
        state.buffers[name].copy_(host)

    def replay_block_table(self, state: GraphState, batch: Batch, bs: int) -> None:
        """The real requests' block ids (VllmEngine.block_table) in their rows; a row's columns past its
        pages keep what earlier batches left, as vLLM's block table does; padding rows at the null block."""
        buf = state.buffers["block_table"]
        table = self.block_table(batch)[:, : buf.shape[1]]
        buf[: batch.batch_size, : table.shape[1]].copy_(table)
        buf[batch.batch_size : bs].fill_(NULL_BLOCK)

    # --- vLLM's metadata over the buffers ------------------------------------------------------

    def graph_common_metadata(self, state: GraphState, bs: int, max_seq_len: int) -> Any:
        """CommonAttentionMetadata over views of the persistent buffers, padded to bs requests and
        bs * queries tokens, as _build_attention_metadata builds it under a FULL graph."""
        from vllm.v1.attention.backend import CommonAttentionMetadata

        b, q = state.buffers, state.limits.queries
        return CommonAttentionMetadata(
            query_start_loc=b["query_start_loc"][: bs + 1],
            query_start_loc_cpu=b["query_start_loc_cpu"][: bs + 1],
            seq_lens=b["seq_lens"][:bs],
            num_reqs=bs,
            num_actual_tokens=bs * q,
            max_query_len=q,
            max_seq_len=max_seq_len,
            block_table_tensor=b["block_table"][:bs],
            slot_mapping=b["slot_mapping"][: bs * q],
            causal=True,
            positions=b["positions"][: bs * q],
            seq_lens_cpu_upper_bound=b["seq_lens_cpu"][:bs],
        )

    def build(self, state: VllmGraphState, common: Any, capture: bool) -> Any:
        """The builder's metadata: `build_for_cudagraph_capture` before a capture, `build` before a
        replay (whose result vLLM drops: its side effects on the builder's state are what count)."""
        from vllm.config import set_current_vllm_config

        with self.batch_invariance(state.layer.case), set_current_vllm_config(state.config):
            if capture:
                return state.builder.build_for_cudagraph_capture(common)
            return state.builder.build(common_prefix_len=0, common_attn_metadata=common)
