"""The CUDA-graph path of the CUDA sglang adapters: sglang's own capture and replay metadata path, driven
as its graph runners drive it (sglang 0.5.17; the same methods through 0.5.23, where the runners also
bind a KV location plan from 0.5.22: `bind_replay_plan`).

sglang 0.5.17's AttentionBackend has three metadata methods (base_attn_backend.py); the legacy
`init_forward_metadata_capture_cuda_graph` / `..._replay_cuda_graph` are gone. Its runners
(model_executor/runner/decode_cuda_graph_runner.py for DECODE and TARGET_VERIFY,
speculative/eagle_draft_extend_cuda_graph_runner.py for DRAFT_EXTEND_V2) do, and so does this module:

- `graph_buffers`: the runner's static buffers (req_pool_indices 0, seq_lens and seq_lens_cpu at the
  backend's `get_cuda_graph_seq_len_fill_value()`, out_cache_loc and positions 0, the verify's custom
  mask of ones, the draft extend's extend_seq_lens / num_accept_tokens / num_correct_drafts at the
  captured width); sglang's objects are built at the first capture, over the runner's static pool
  (`EngineGraph`), and `init_cuda_graph_state(max_bs, max_bs * queries)` runs once;
- `capture_metadata`: the dummy ForwardBatch of capture_prepare / capture_one_shape over views of
  the buffers, then `init_forward_metadata_out_graph(fb, in_capture=True)`;
- `replay_metadata`: the real batch copied into the buffers, padded as load_batch / execute pad it,
  and `init_forward_metadata_out_graph(view)` over the view build_replay_fb_view makes (the batch's
  own spec_info, seq_lens_sum plus the fill value per padding request);
- `graph_forward`: run_once's `init_forward_metadata_in_graph(fb)`, then the backend's
  `forward(q, k, v, layer, fb, save_kv_cache=True)`, whose own `set_kv_buffer` writes the step's K/V.

The cache is shared, not copied: sglang's MHATokenToKVPool takes the static pool's storage through its
own hook for buffers it does not allocate (`_assign_post_capture_tensors`, then
`_init_data_ptrs_and_strides`, as its `_create_buffers` does), so its K/V buffers ARE views of the
harness pool; its ReqToTokenPool is built once and its rows refilled before every replay.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from harness.backends.engines.base import StandIn
from harness.backends.engines.sglang import spec
from harness.backends.engines.sglang.gpu import KV_LOC_PLAN_FROM, SglangGpuAdapter, sglang_from
from harness.backends.graph_glue import GraphGlue, GraphLimits, GraphState, StaticInputs
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.core.pool import PagedPool

GRAPH_RUNNER = StandIn(
    "graph runner",
    "the static buffers of DecodeCudaGraphRunner / EAGLEDraftExtendCudaGraphRunner (req_pool_indices, "
    "seq_lens, seq_lens_cpu, out_cache_loc, positions, input_ids; the verify's custom mask; the draft "
    "extend's extend_seq_lens, num_accept_tokens, num_correct_drafts) with their fill values, the capture "
    "ForwardBatch per size, the replay view of build_replay_fb_view, and the padding of load_batch / execute",
    "sglang's runners capture a whole model's forward and need a loaded model, its logits buffers and "
    "distributed groups; the attention backend sees only these buffers and the ForwardBatch over them, "
    "which the harness's replay check captures around the backend's forward alone",
)

# sglang's process-wide capture flag (model_capture_mode), under which its runners warm up and capture:
# set_kv_buffer then writes K and V on two streams, as in a served graph.
CAPTURE_MODE = "sglang.srt.model_executor.runner_utils.capture_mode"

# The runners' static buffers an adapter allocates (name -> dtype, per request or per token).
REQUEST_BUFFERS = {"req_pool_indices": torch.int64, "seq_lens": torch.int64}
TOKEN_BUFFERS = {"input_ids": torch.int64, "positions": torch.int64}
DRAFT_EXTEND_BUFFERS = ("extend_seq_lens", "num_accept_tokens", "num_correct_drafts")  # int32


@dataclass(kw_only=True)
class EngineGraph:
    """sglang's objects of one GraphState: the backend, its layer, its pools (over the static pool),
    the server's speculative shape, and the capture ForwardBatch of each size."""

    backend: Any
    layer: Any
    req_to_token: Any
    kv: Any
    shape: tuple[int, int, int] | None
    batches: dict[int, Any] = field(default_factory=dict)


@dataclass
class SglangGraphState(GraphState):
    """A GraphState with sglang's objects, built at the first capture (`engine`)."""

    engine: EngineGraph | None = None


class SglangGraphAdapter(SglangGpuAdapter, GraphGlue):
    """A CUDA sglang adapter with sglang's CUDA-graph path (module doc)."""

    stand_ins = (*SglangGpuAdapter.stand_ins, GRAPH_RUNNER)

    # --- the buffers ---------------------------------------------------------------------------

    def graph_buffers(self, limits: GraphLimits, batch: Batch) -> SglangGraphState:
        state = SglangGraphState(limits, batch)
        dev, bs, rows = batch.device, limits.max_batch, limits.max_batch * limits.queries
        b = state.buffers
        b["out_cache_loc"] = torch.zeros(rows, dtype=torch.int64, device=dev)  # sglang's cache_loc_dtype
        for name, dtype in REQUEST_BUFFERS.items():
            b[name] = torch.zeros(bs, dtype=dtype, device=dev)
        for name, dtype in TOKEN_BUFFERS.items():
            b[name] = torch.zeros(rows, dtype=dtype, device=dev)
        b["seq_lens_cpu"] = torch.zeros(bs, dtype=torch.int64)
        if batch.mode == Mode.DRAFT_EXTEND_V2:
            for name in DRAFT_EXTEND_BUFFERS:
                b[name] = torch.full((bs,), limits.queries, dtype=torch.int32, device=dev)
        return state

    def table_width(self, limits: GraphLimits) -> int:
        """The persistent ReqToTokenPool's row width: every page a request can hold."""
        return limits.max_pages * limits.page_size

    # --- sglang's objects, once per GraphState -------------------------------------------------

    def engine_graph(self, state: SglangGraphState) -> EngineGraph:
        """sglang's pools, backend and layer over the static pool, and init_cuda_graph_state (the
        runner's __init__), built at the first capture; the seq_lens buffers at the fill value."""
        if state.engine is not None:
            return state.engine
        if state.pool is None:
            raise ValueError("the graph runner set no static pool before the first capture")
        layer_batch, limits = state.layer, state.limits
        r2t = self.sg().pools.ReqToTokenPool(
            size=limits.max_batch,
            max_context_len=self.table_width(limits),
            device=str(state.device),
            enable_memory_saver=False,
        )
        kv = self.shared_kv_pool(state.pool, layer_batch)
        with self.serving_context(layer_batch):
            backend = self.attention_backend(layer_batch, r2t, kv)
            backend.init_cuda_graph_state(limits.max_batch, limits.max_batch * limits.queries)
            layer = self.layer(layer_batch)
        fill, b = self.seq_len_fill_value(backend), state.buffers
        b["seq_lens"].fill_(fill)
        b["seq_lens_cpu"].fill_(fill)
        shape = None
        if layer_batch.mode == Mode.TARGET_VERIFY:  # DecodeInputBuffers.custom_mask: ones
            shape = spec.spec_shape(layer_batch)
            size = (limits.max_batch * fill + limits.max_batch * limits.queries) * limits.queries
            b["custom_mask"] = torch.ones(size, dtype=torch.bool, device=state.device)
        state.engine = EngineGraph(backend=backend, layer=layer, req_to_token=r2t, kv=kv, shape=shape)
        return state.engine

    def shared_kv_pool(self, pool: PagedPool, batch: Batch) -> Any:
        """sglang's MHATokenToKVPool whose K/V buffers are the static pool's storage (module doc):
        slot s is the same slot in both, as in the eager `token_to_kv_pool`."""
        kv = self.token_to_kv_pool_shell(pool, batch)
        heads, dim = batch.case.num_kv_heads, batch.case.head_dim
        views = [t.view(pool.num_slots, heads, dim).view(kv.store_dtype) for t in (pool.k, pool.v)]
        kv._assign_post_capture_tensors(views)
        kv._init_data_ptrs_and_strides()
        return kv

    def token_to_kv_pool_shell(self, pool: PagedPool, batch: Batch) -> Any:
        """sglang's MHATokenToKVPool of the static pool's size and dtype (its own buffers replaced next)."""
        return self.sg().pools.MHATokenToKVPool(
            size=pool.num_slots - pool.page_size,
            page_size=pool.page_size,
            dtype=pool.k.dtype,
            head_num=batch.case.num_kv_heads,
            head_dim=batch.case.head_dim,
            layer_num=1,
            device=str(batch.device),
            enable_memory_saver=False,
        )

    def seq_len_fill_value(self, backend: Any) -> int:
        """seq_lens of a padding request: the backend's own get_cuda_graph_seq_len_fill_value()."""
        return int(backend.get_cuda_graph_seq_len_fill_value())

    # --- capture -------------------------------------------------------------------------------

    def capture_metadata(self, state: GraphState, bs: int) -> None:
        """The dummy batch of size bs over the buffers at their capture values, then the backend's
        out-of-graph metadata with in_capture=True."""
        assert isinstance(state, SglangGraphState)
        eg = self.engine_graph(state)
        fb = self.capture_forward_batch(state, eg, bs)
        if sglang_from(KV_LOC_PLAN_FROM):  # the runner's capture: bind_runner_slots (0.5.22 on)
            eg.backend.kv_index_translator.bind_runner_slots(fb)
        with self.serving_context(state.layer), self.capture_mode():
            eg.backend.init_forward_metadata_out_graph(fb, in_capture=True)
        eg.batches[bs] = fb

    @contextlib.contextmanager
    def capture_mode(self) -> Iterator[None]:
        """sglang's model_capture_mode, which its runners hold around warm-up and capture."""
        with importlib.import_module(CAPTURE_MODE).model_capture_mode():
            yield

    def capture_forward_batch(self, state: SglangGraphState, eg: EngineGraph, bs: int) -> Any:
        """sglang's ForwardBatch of a capture: views of the static buffers (capture_prepare for DECODE and
        TARGET_VERIFY, capture_one_shape of the draft-extend runner for DRAFT_EXTEND_V2)."""
        b, n = state.buffers, bs * state.limits.queries
        seq = b["seq_lens"][:bs]
        extend: dict[str, Any] = {}
        if state.mode == Mode.DRAFT_EXTEND_V2:
            extend = {
                "extend_seq_lens": b["extend_seq_lens"][:bs],
                "extend_seq_lens_cpu": [state.limits.queries] * bs,
            }
        return self.sg().batch.ForwardBatch(
            forward_mode=self.forward_mode(state.layer),
            batch_size=bs,
            input_ids=b["input_ids"][:n],
            req_pool_indices=b["req_pool_indices"][:bs],
            seq_lens=seq,
            seq_lens_cpu=b["seq_lens_cpu"][:bs],
            orig_seq_lens=seq,
            out_cache_loc=b["out_cache_loc"][:n],
            seq_lens_sum=int(b["seq_lens_cpu"][:bs].sum()),
            positions=b["positions"][:n],
            encoder_lens=None,
            spec_info=self.capture_spec_info(state, eg, bs),
            spec_algorithm=self.spec_algorithm(state.layer),
            **extend,
        )

    def capture_spec_info(self, state: SglangGraphState, eg: EngineGraph, bs: int) -> Any:
        """The capture's speculative input: get_spec_info's EagleVerifyInput over the custom-mask buffer
        (TARGET_VERIFY), the draft-extend runner's EagleDraftExtendInput (DRAFT_EXTEND_V2), else None."""
        g, b = self.gpu(), state.buffers
        if state.mode == Mode.TARGET_VERIFY:
            assert eg.shape is not None
            capture = self.sg().batch.CaptureHiddenMode
            return spec.capture_verify_input(g.eagle, capture, eg.shape, b["custom_mask"])
        if state.mode == Mode.DRAFT_EXTEND_V2:
            return spec.capture_draft_extend_input(
                g.eagle, b["num_correct_drafts"][:bs], b["num_accept_tokens"][:bs], state.limits.queries
            )
        return None

    # --- replay --------------------------------------------------------------------------------

    def replay_metadata(self, state: GraphState, batch: Batch, bs: int) -> None:
        """The real batch into the ReqToTokenPool rows and the buffers, padded to bs, then the backend's
        out-of-graph metadata over the replay view."""
        assert isinstance(state, SglangGraphState)
        eg = self.engine_graph(state)
        self.check_spec_shape(eg, batch)
        rows = self.req_pool_indices(batch)
        self.replay_req_to_token(eg, batch, rows)
        fill = self.seq_len_fill_value(eg.backend)
        self.replay_request_buffers(state, batch, rows, bs, fill)
        self.replay_out_cache_loc(state, batch, bs)
        self.replay_positions(state, batch, bs)
        view = self.replay_view(state, batch, rows, bs, fill)
        self.bind_replay_plan(eg, batch, rows, view)
        with self.serving_context(state.layer):
            eg.backend.init_forward_metadata_out_graph(view)

    def check_spec_shape(self, eg: EngineGraph, batch: Batch) -> None:
        """A verify replays in a graph captured for the server's speculative settings: a batch whose
        trees need a cascade (topk > 1) the capture's chain path (topk 1) lacks cannot run there."""
        if eg.shape is None or batch.mode != Mode.TARGET_VERIFY:
            return
        topk = spec.spec_shape(batch)[0]
        if topk > 1 and eg.shape[0] == 1:
            raise ValueError(
                f"a verify tree of topk {topk} replayed in a graph captured for chains (topk 1): sglang's "
                "server fixes speculative_eagle_topk for every graph"
            )

    def replay_req_to_token(self, eg: EngineGraph, batch: Batch, rows: torch.Tensor) -> None:
        """The batch's req_to_token rows into the persistent ReqToTokenPool at `rows` (a row's tail past
        the batch's table at slot 0); row 0, the padding requests' row, stays zero."""
        table = eg.req_to_token.req_to_token
        padded = torch.zeros(batch.batch_size, table.shape[1], dtype=table.dtype, device=table.device)
        padded[:, : batch.req_to_token.shape[1]] = batch.req_to_token
        eg.req_to_token.write(rows, padded)

    def replay_request_buffers(
        self, state: GraphState, batch: Batch, rows: torch.Tensor, bs: int, fill: int
    ) -> None:
        """req_pool_indices (padding: 0), seq_lens and seq_lens_cpu (padding: the fill value), and in
        DRAFT_EXTEND_V2 the accepted counts (padding: the captured width), as sglang's runners pad."""
        b, raw = state.buffers, batch.batch_size
        seq = torch.tensor(self.seq_lens(batch), dtype=torch.int64)
        b["req_pool_indices"][:raw].copy_(rows)
        b["req_pool_indices"][raw:bs].zero_()
        for name in ("seq_lens", "seq_lens_cpu"):
            b[name][:raw].copy_(seq)
            b[name][raw:bs].fill_(fill)
        if state.mode == Mode.DRAFT_EXTEND_V2:
            width = state.limits.queries
            extend = torch.tensor(batch.cpu_list("extend_lens"), dtype=torch.int32)
            for name in DRAFT_EXTEND_BUFFERS:
                b[name][raw:bs].fill_(width)
            b["extend_seq_lens"][:raw].copy_(extend)
            b["num_accept_tokens"][:raw].copy_(extend)  # every draft accepted (spec.draft_extend_input)
            b["num_correct_drafts"][:raw].copy_(extend - 1)

    def replay_positions(self, state: GraphState, batch: Batch, bs: int) -> None:
        """positions of the padded batch: the real ones, then 0 (the registry's ZERO policy)."""
        buf, real = state.buffers["positions"], batch.positions.numel()
        buf[:real].copy_(batch.positions)
        buf[real : bs * state.limits.queries].zero_()

    def replay_view(self, state: GraphState, batch: Batch, rows: torch.Tensor, bs: int, fill: int) -> Any:
        """The ForwardBatch view a replay plans from (build_replay_fb_view; the draft-extend runner's
        fb_view): the capture's mode, the padded buffers, the batch's own spec_info, and seq_lens_sum
        with the fill value of each padding request."""
        b, n = state.buffers, bs * state.limits.queries
        spec_info = self.spec_info(batch, rows)
        if state.mode == Mode.DRAFT_EXTEND_V2:
            spec_info.extend_seq_lens_cpu = [state.limits.queries] * bs
            spec_info.extend_seq_lens_tensor = b["extend_seq_lens"][:bs]
            if bs != batch.batch_size:
                spec_info.positions = b["positions"][:n]
                spec_info.num_correct_drafts = b["num_correct_drafts"][:bs]
                spec_info.num_accept_tokens = b["num_accept_tokens"][:bs]
        return SimpleNamespace(
            batch_size=bs,
            forward_mode=self.forward_mode(state.layer),
            actual_forward_mode=self.forward_mode(batch),
            input_ids=b["input_ids"][:n],
            positions=b["positions"][:n],
            req_pool_indices=b["req_pool_indices"][:bs],
            seq_lens=b["seq_lens"][:bs],
            seq_lens_sum=sum(self.seq_lens(batch)) + (bs - batch.batch_size) * fill,
            seq_lens_cpu=b["seq_lens_cpu"][:bs],
            num_padding=bs - batch.batch_size,
            encoder_lens=None,
            out_cache_loc=b["out_cache_loc"][:n],
            out_cache_loc_dsv4=None,
            mamba_track_indices=None,
            spec_info=spec_info,
        )

    def bind_replay_plan(self, eg: EngineGraph, batch: Batch, rows: torch.Tensor, view: Any) -> None:
        """From 0.5.22 (KV_LOC_PLAN_FROM), build_replay_fb_view hands the backend the live batch's
        kv_loc_plan and kv_loc_cols: the plan ForwardBatch.init_new bound over the real requests' rows,
        lengths and write slots (bind_forward_batch); the view keeps the padded buffers otherwise."""
        if not sglang_from(KV_LOC_PLAN_FROM):
            return
        live = self.forward_batch(batch, rows)
        live.spec_info = view.spec_info
        self.bind_forward_batch(eg.backend, live)
        view.kv_loc_plan, view.kv_loc_cols = live.kv_loc_plan, live.kv_loc_cols

    # --- the captured forward ------------------------------------------------------------------

    def graph_forward(self, state: GraphState, static: StaticInputs) -> torch.Tensor:
        """run_once: the backend's in-graph metadata, then its forward over the static inputs, whose
        set_kv_buffer writes the step's K/V into the shared pool."""
        assert isinstance(state, SglangGraphState)
        eg = self.engine_graph(state)
        fb = eg.batches[static.bs]
        rows = static.q.shape[0]
        q = static.q.reshape(rows, -1)
        with self.serving_context(state.layer), self.capture_mode():
            eg.backend.init_forward_metadata_in_graph(fb)
            kwargs = self.graph_forward_kwargs(static)
            o = eg.backend.forward(q, static.k_new, static.v_new, eg.layer, fb, save_kv_cache=True, **kwargs)
        return o.view(rows, state.layer.case.num_q_heads, -1)

    def graph_forward_kwargs(self, static: StaticInputs) -> dict[str, Any]:
        """Keyword arguments of the captured forward beyond q, k, v, layer and the batch (the eager
        `forward_kwargs` over the static inputs)."""
        return {}
