"""Engine glue shared by the FlashInfer adapters (flashinfer-python 0.6.16 to 0.7.x). Registers no backend.

An engine plans a FlashInfer wrapper once per batch with the page table and every kernel option,
then runs it. The shared decisions are one method each, so a mutant overrides exactly one: the
engine's reads in glue.py (kv_start rounded down to a page here), and here the page table, options
at plan, split parameters, the LSE base, and an FP8 cache's dtype at plan and scales at run. Every
wrapper names backend="fa2": "auto" picks fa3 on an H100, whose plan ignores the split parameters.
With an FP8 cache fa2 takes a half-precision query (it refuses an FP8 one) and rounds nothing else to
FP8: K and V are dequantized to the query's dtype, P kept in it (prefill.cuh compute_sfm_v) or in fp32
(decode.cuh), so no adapter declares `fp8_queries` or `fp8_probabilities` (docs/design.md).
The supported releases and what differs between them: flashinfer_versions.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from harness.backends.base import Capabilities
from harness.backends.flashinfer_versions import RANGE
from harness.backends.graph_glue import GraphGlue, GraphLimits, GraphState, StaticInputs
from harness.backends.versions import import_library
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.core.pool import RESERVED_PAGE
from harness.core.vocab import KV_DTYPES, TORCH_DTYPES

KERNEL_BACKEND = "fa2"
WORKSPACE_BYTES = 512 * 1024 * 1024  # the float workspace every wrapper shares (split-KV partials)
HEAD_DIMS = frozenset({64, 128, 256})
# Measured on the H100 (tests/test_flashinfer_gpu.py::test_fa2_prefill_tile_follows_the_batch).
PREFILL_NOT_INVARIANT = (
    "FlashInfer's fa2 prefill picks its query tile (16/64/128 rows, FA2DetermineCtaTileQ) "
    "from the batch's mean query length, so a prefill request's rounding follows its neighbours even "
    "with fixed split sizes: no deterministic mode for EXTEND or a CROSS prefill (uniform-length "
    "batches: decode, verify, DRAFT_EXTEND_V2, decoder steps, keep the tile and stay deterministic)"
)
# The batches in which fa2 prefill sizes a request's query tile from its neighbours (queries of any
# length), by mode: the trait (vocab.case_traits) that is exclusive with deterministic mode.
QUERY_TILE_FOLLOWS_BATCH = {
    Mode.EXTEND: "EXTEND",
    Mode.ENCODER_ONLY: "ENCODER_ONLY",
    Mode.CROSS: "cross_prefill",
}
NO_RIGHT_WINDOW = (
    "FlashInfer's attention kernels take window_left only: no right window edge "
    "(a two-sided encoder window would need a custom mask)"
)
_WORKSPACES: dict[str, torch.Tensor] = {}
# plan()'s custom_mask: flat bool, request-major, each request's [queries, keys] row-major; or None.
CustomMask = torch.Tensor | None


def flashinfer() -> Any:
    """The flashinfer module, imported only when a kernel is about to run."""
    import flashinfer as fi

    return fi


def why_unavailable() -> str | None:
    """None when flashinfer imports at a release in RANGE, the reason when it is not installed; raises
    BackendBroken when it is installed but fails to import or is at a release outside RANGE."""
    return import_library("flashinfer", RANGE)[1]


def workspace(device: torch.device) -> torch.Tensor:
    """The float workspace, one per device, shared by every wrapper (runs are sequential)."""
    key = str(device)
    if key not in _WORKSPACES:
        _WORKSPACES[key] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _WORKSPACES[key]


def sink_module_name(uri: str, kv_dtype: torch.dtype, head_dim_qk: int, head_dim_vo: int) -> str:
    """The AttentionSink module's name with what FlashInfer leaves out of it: the KV cache dtype and the
    head dims (known issue flashinfer-sink-module-name)."""
    return f"{uri}_kv_{str(kv_dtype).removeprefix('torch.')}_hd_{head_dim_qk}_{head_dim_vo}"


@cache
def sink_wrapper_class(fi: Any) -> type:
    """FlashInfer's BatchAttentionWithAttentionSinkWrapper, its JIT module named per KV dtype and head dims.

    The library names the module batch_prefill_attention_sink_{q dtype}_swa_{window on}_{backend}, so
    an FP8 cache's variant shares the bf16 one's name: the first loaded serves both in a process, and a
    prebuilt copy of one serves every process (docs/known-issues.md, measured on the H100). The sink
    wrapper hands its jit_args (the name first, then q, KV and output dtypes, index dtype, head dims) to
    the paged prefill wrapper's constructor; a class placed between the two in the method order adds
    the missing parameters to the name, and changes nothing else.
    """

    class NamedSinkModule(fi.BatchPrefillWithPagedKVCacheWrapper):
        def __init__(self, *args: Any, jit_args: list | None = None, **kwargs: Any) -> None:
            if jit_args:
                name = sink_module_name(jit_args[0], jit_args[2], jit_args[5], jit_args[6])
                jit_args = [name, *jit_args[1:]]
            super().__init__(*args, jit_args=jit_args, **kwargs)

    return type("AttentionSinkWrapper", (fi.BatchAttentionWithAttentionSinkWrapper, NamedSinkModule), {})


def capabilities(
    modes_: set[Mode],
    features: tuple[str, ...],
    exclusive: dict[tuple[str, str], str] | None = None,
    **fields: Any,
) -> Capabilities:
    """The capabilities every FlashInfer adapter shares, plus its own modes, features, exclusive
    pairs (pair -> why) and fields. No adapter has a right window edge (NO_RIGHT_WINDOW), whatever
    `features` names. Deterministic mode excludes the batches whose fa2 prefill query
    tile follows the batch (PREFILL_NOT_INVARIANT): EXTEND, ENCODER_ONLY and a CROSS prefill. Every
    fa2 paged path reads an FP8 cache (e4m3 or e5m2) under a half-precision query: plan's
    `kv_data_type`, run's `k_scale` / `v_scale` (prefill.py and decode.py of 0.6.18.post1 and 0.7.2.post1)."""
    pairs = dict(exclusive or {})
    if "deterministic" in features:
        tiled = (trait for mode, trait in QUERY_TILE_FOLLOWS_BATCH.items() if mode in modes_)
        pairs |= {("deterministic", trait): PREFILL_NOT_INVARIANT for trait in tiled}
    why_not = {
        "window_right": NO_RIGHT_WINDOW,
        **fields.pop("why_not", {}),
        **{"+".join(p): why for p, why in pairs.items()},
    }
    return Capabilities.with_features(
        *(f for f in features if f != "window_right"),
        modes=frozenset(modes_),
        dtypes=frozenset({"bfloat16", "float16"}),
        head_dims=HEAD_DIMS,
        kv_layouts=frozenset({"NHD", "HND"}),
        devices=frozenset({"cuda"}),
        exclusive=frozenset(pairs),
        why_not=why_not,
        kv_dtypes=frozenset(KV_DTYPES),
        **fields,
    )


@dataclass(frozen=True)
class PageTable:
    """One key range per request in FlashInfer's paged form (int32; `indices` where the pool is, the
    rest on the host, where plan reads them).

    A request's keys start on a page boundary. An empty range has no pages and
    `last_page_len = page_size`: FlashInfer's kernel reads a request without pages as 0 keys, and
    plan's custom-mask offsets ((pages - 1) * page_size + last_page_len, unclamped) are then 0 as
    well. The true lengths travel separately as `kv_lens` (plan's `seq_lens`).
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor
    kv_lens: torch.Tensor


def paged_kv_table(indices: torch.Tensor, pages: list[int], lengths: list[int], page_size: int) -> PageTable:
    """Assemble the table from every request's page ids, concatenated (`indices`), and each request's
    page count and key count."""
    indptr = [0]
    last = []
    for n_pages, n in zip(pages, lengths):
        if n_pages != -(-n // page_size):
            raise ValueError(f"{n_pages} pages cannot hold exactly {n} keys of page size {page_size}")
        indptr.append(indptr[-1] + n_pages)
        last.append(n - (n_pages - 1) * page_size if n else page_size)
    if indices.numel() != indptr[-1]:
        raise ValueError(f"{indices.numel()} page ids for {indptr[-1]} pages")
    return PageTable(
        indptr=torch.tensor(indptr, dtype=torch.int32),
        indices=indices.to(torch.int32),
        last_page_len=torch.tensor(last, dtype=torch.int32),
        kv_lens=torch.tensor(lengths, dtype=torch.int32),
    )


class FlashInferGlue(GraphGlue):
    """Base adapter for every FlashInfer path. Subclasses set name, capabilities, run(); a capturable
    one declares graph_modes and `graph_wrapper` (the CUDA-graph path below)."""

    library = "flashinfer"
    supported = RANGE  # the releases this glue supports; `list` shows the installed one against it
    split_tokens = 4096  # keys per split-KV chunk in deterministic mode (sglang's prefill default)

    def __init__(self) -> None:
        self._wrappers: dict[tuple, Any] = {}

    def __getstate__(self) -> dict:
        """Sent to an isolation worker without its wrappers: they hold device memory; it builds its own."""
        return {**self.__dict__, "_wrappers": {}}

    def available(self, device: str) -> str | None:
        return super().available(device) or why_unavailable()

    # --- where the keys are (the rest is the shared engine glue, glue.py) ----------------------

    def kv_start(self, batch: Batch, r: int) -> int:
        """First key a windowed layer reads, rounded down to its page: FlashInfer's page table
        addresses whole pages, so a request's keys start on a page boundary."""
        return super().kv_start(batch, r) // batch.case.page_size * batch.case.page_size

    def page_table(self, batch: Batch, ranges: list[tuple[int, int]]) -> PageTable:
        """The page table of this layer's pool for each range (kv_indices: `page_ids` of each page's
        first key, built on the device; nothing is read back)."""
        ps = batch.case.page_size
        firsts = [self.kv_slots(batch, r, lo, hi)[::ps] for r, (lo, hi) in enumerate(ranges)]
        pages = self.page_ids(batch, torch.cat(firsts))
        return paged_kv_table(pages, [f.numel() for f in firsts], [hi - lo for lo, hi in ranges], ps)

    def kv_cache(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's pool as FlashInfer takes it: (k, v) in the case's NHD or HND page layout."""
        return batch.pool.k, batch.pool.v

    def kv_data_type(self, batch: Batch) -> torch.dtype:
        """What plan is told the paged cache holds: the pool's dtype (FP8 codes in an FP8 cache)."""
        return batch.pool.k.dtype

    def run_scales(self, batch: Batch) -> dict:
        """What a paged run() takes for an FP8 cache: k_scale (FlashInfer folds it into sm_scale) and
        v_scale (it multiplies the output); nothing for a cache in the model's dtype."""
        if batch.case.kv_dtype is None:
            return {}
        k_scale, v_scale = self.shared_kv_scales(batch)
        return {"k_scale": k_scale, "v_scale": v_scale}

    # --- what goes to plan() ------------------------------------------------------------------

    def kernel_options(self, batch: Batch, window_left: int) -> dict:
        """Options every plan() takes. All of them go to plan: run() reuses what plan compiled."""
        c = batch.case
        dt = TORCH_DTYPES[c.dtype]
        return {
            "sm_scale": c.scale,
            "window_left": window_left,
            "logits_soft_cap": float(c.soft_cap),
            "q_data_type": dt,
            "kv_data_type": self.kv_data_type(batch),
        }

    def kv_path(self, batch: Batch) -> str:
        """Which engine path plans this layer: 'cross', 'swa' (a windowed layer) or 'full'."""
        if batch.mode == Mode.CROSS:
            return "cross"
        return "swa" if self.window_left(batch) >= 0 else "full"

    def split_options(self, batch: Batch, page_size: int) -> dict:
        """Deterministic mode pins the split-KV chunk (in pages) on every path, so a request's
        reduction order never depends on what else is in the batch; `disable_split_kv` is the
        CUDA-graph alternative, which an eager engine leaves off."""
        if not batch.case.deterministic:
            return {}
        return {"fixed_split_size": max(1, self.split_tokens // page_size), "disable_split_kv": False}

    def plan_arguments(
        self, batch: Batch, table: PageTable, options: dict, split: dict | None = None
    ) -> tuple[tuple, dict]:
        """What every paged plan() takes: the page table and the head shape (positional), the true key
        counts, the kernel options and the split parameters (keywords; `split`: these instead of the
        batch's split_options)."""
        c = batch.case
        args = (table.indptr, table.indices, table.last_page_len)
        args += (c.num_q_heads, c.num_kv_heads, c.head_dim, c.page_size)
        split = self.split_options(batch, c.page_size) if split is None else split
        return args, {"seq_lens": table.kv_lens, **options, **split}

    def plan_paged(
        self, wrapper: Any, batch: Batch, table: PageTable, causal: bool, options: dict, mask: CustomMask
    ) -> None:
        """Plan a paged prefill wrapper over the batch's queries: page table, causality (`causal`,
        from the engine glue's `causal` or the path) or a custom mask, kernel options and split
        parameters."""
        args, kwargs = self.plan_arguments(batch, table, options)
        wrapper.plan(batch.host_tensor("qo_indptr"), *args, custom_mask=mask, causal=causal, **kwargs)

    def plan_decode(self, wrapper: Any, batch: Batch, table: PageTable, options: dict, q_len: int) -> None:
        """Plan a decode wrapper; q_len > 1 (tensor cores only) is a bottom-right causal block."""
        args, kwargs = self.plan_arguments(batch, table, options)
        wrapper.plan(*args, q_len_per_req=q_len, **kwargs)

    # --- wrappers and results -----------------------------------------------------------------

    def wrapper(self, kind: str, batch: Batch) -> Any:
        """A FlashInfer wrapper of one kind, built once per adapter and re-planned per batch.

        kinds: ragged, paged, sink (paged with attention sinks; its JIT module fixes the dtypes,
        head_dim and whether a window exists), decode_tc / decode_cc (tensor / CUDA cores).
        """
        c = batch.case
        key = (kind, c.kv_layout, str(batch.device))
        if kind == "sink":
            key += (c.dtype, self.kv_data_type(batch), c.head_dim, self.window_left(batch) >= 0)
        if key not in self._wrappers:
            self._wrappers[key] = self._build_wrapper(kind, batch)
        return self._wrappers[key]

    def _build_wrapper(self, kind: str, batch: Batch) -> Any:
        fi = flashinfer()
        c = batch.case
        ws = workspace(batch.device)
        if kind == "ragged":  # in-flight K/V are [tokens, heads, dim]
            return fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=KERNEL_BACKEND)
        if kind == "paged":
            return fi.BatchPrefillWithPagedKVCacheWrapper(ws, c.kv_layout, backend=KERNEL_BACKEND)
        if kind == "sink":
            dt = TORCH_DTYPES[c.dtype]
            return sink_wrapper_class(fi)(
                ws,
                c.kv_layout,
                backend=KERNEL_BACKEND,
                q_data_type=dt,
                kv_data_type=self.kv_data_type(batch),
                head_dim_qk=c.head_dim,
                head_dim_vo=c.head_dim,
                window_left=self.window_left(batch),
            )
        if kind in ("decode_tc", "decode_cc"):
            return fi.BatchDecodeWithPagedKVCacheWrapper(
                ws, c.kv_layout, use_tensor_cores=kind == "decode_tc", backend=KERNEL_BACKEND
            )
        raise ValueError(f"unknown FlashInfer wrapper kind {kind!r}")

    # --- the CUDA-graph path (harness/backends/graph_glue.py) ----------------------------------
    # As sglang's FlashInfer backend: the page-table buffers allocated once at the limits; per
    # captured size a wrapper made with use_cuda_graph=True over views of them; plan() before the
    # capture (a dummy batch) and before every replay (the real batch, padded) writes into them.

    def graph_buffers(self, limits: GraphLimits, batch: Batch) -> GraphState:
        """kv_indptr [n + 1], kv_indices [n * max_pages], kv_last_page_len [n] for n = max_batch."""
        state = super().graph_buffers(limits, batch)
        n, dev = limits.max_batch, batch.device
        state.buffers["kv_indptr"] = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        state.buffers["kv_indices"] = torch.zeros(n * limits.max_pages, dtype=torch.int32, device=dev)
        state.buffers["kv_last_page_len"] = torch.zeros(n, dtype=torch.int32, device=dev)
        return state

    def graph_wrapper(self, state: GraphState, bs: int) -> Any:
        """A use_cuda_graph=True wrapper of `bs` requests over views of the state's buffers."""
        raise NotImplementedError

    def padding_table(
        self, state: GraphState, real: PageTable, bs: int, extent: int | None = None
    ) -> PageTable:
        """The real requests' table, then bs - real requests of `extent` keys (default padding_extent,
        the engine's fill value) on the reserved page."""
        ps = state.layer.case.page_size
        n = self.padding_extent(state) if extent is None else extent
        pad = bs - real.kv_lens.numel()
        pages = -(-n // ps)
        real_pages = (real.indptr[1:] - real.indptr[:-1]).tolist()  # a host tensor: no device read
        indices = torch.cat(
            [
                real.indices,
                torch.full((pad * pages,), RESERVED_PAGE, dtype=torch.int32, device=real.indices.device),
            ]
        )
        return paged_kv_table(indices, real_pages + [pages] * pad, real.kv_lens.tolist() + [n] * pad, ps)

    def capture_extent(self, state: GraphState) -> int:
        """Keys of each dummy request at capture: the fill value, or in deterministic mode the largest
        extent the buffers hold. With fixed_split_size, FlashInfer's plan splits a request's KV only
        where it needs more than one chunk, and run() picks the split or the unsplit kernel on the
        host, so the capture freezes that choice: a short dummy batch froze the unsplit kernel, and a
        replay whose plan split (a context past the chunk) was then not bitwise the eager output
        (measured on the H100, flashinfer_dec_tc, 2049 keys: 0.000488). Capturing at the limits
        freezes the split kernel whenever a replay can need it."""
        return state.limits.max_kv if state.layer.case.deterministic else self.padding_extent(state)

    def capture_table(self, state: GraphState, bs: int) -> PageTable:
        """The dummy batch's table: bs requests of capture_extent keys on the reserved page."""
        empty = torch.zeros(0, dtype=torch.int32, device=state.device)
        none = PageTable(torch.zeros(1, dtype=torch.int32), empty, empty.cpu(), empty.cpu())
        return self.padding_table(state, none, bs, self.capture_extent(state))

    def replay_table(self, state: GraphState, batch: Batch, bs: int) -> PageTable:
        """The real batch's table over its replay key ranges, padded to bs."""
        return self.padding_table(state, self.page_table(batch, self.replay_key_ranges(state, batch)), bs)

    def graph_options(self, state: GraphState) -> dict:
        """The layer's plan options (kernel options: window, soft cap, scale, dtypes) and its split
        parameters (deterministic mode pins them), as the eager path plans them."""
        layer = state.layer
        split = self.split_options(layer, layer.case.page_size)
        return {"options": self.kernel_options(layer, self.window_left(layer)), "split": split}

    def capture_options(self, state: GraphState) -> dict:
        """What plan() gets before a capture. The kernel's scalar arguments (window, soft cap, scale)
        are fixed by the launch the capture records: what this plan set."""
        return self.graph_options(state)

    def replay_options(self, state: GraphState, batch: Batch) -> dict:
        """What plan() gets before a replay: the same (its work partition, the split, is in the
        wrapper's int workspace, which the kernel reads at replay)."""
        return self.graph_options(state)

    def plan_graph(self, state: GraphState, bs: int, table: PageTable, options: dict) -> None:
        """plan() the size-bs wrapper with `options` (of graph_options' shape): it writes the table
        into the state's buffers."""
        raise NotImplementedError

    def capture_metadata(self, state: GraphState, bs: int) -> None:
        self.capture_out_cache_loc(state, bs)
        state.per_size[bs] = self.graph_wrapper(state, bs)
        self.plan_graph(state, bs, self.capture_table(state, bs), self.capture_options(state))

    def replay_metadata(self, state: GraphState, batch: Batch, bs: int) -> None:
        self.replay_out_cache_loc(state, batch, bs)
        self.plan_graph(state, bs, self.replay_table(state, batch, bs), self.replay_options(state, batch))

    def graph_kernel(self, state: GraphState, static: StaticInputs) -> torch.Tensor:
        """run() of the size-bs wrapper over the static queries and pool (the scales of the layer)."""
        scales = self.run_scales(state.layer)
        return state.per_size[static.bs].run(static.q, (static.pool.k, static.pool.v), **scales)

    def natural_lse(self, lse: torch.Tensor) -> torch.Tensor:
        """FlashInfer's kernels return log2(sum 2^x) of log2-scaled logits; the harness wants ln."""
        return lse.float() * math.log(2.0)
