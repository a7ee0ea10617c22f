"""The CUDA-graph protocol: the second metadata path of an engine's attention backend.

Engines run decode, target verify and draft extend under CUDA graphs. The backend then has two
metadata paths: the eager one (`run`) and the replay one. At init the engine allocates every
metadata buffer once, for its largest batch and context (sglang's `init_cuda_graph_state`); for each
captured batch size it fills them for a dummy batch and captures the forward
(`init_forward_metadata_capture_cuda_graph`); before every replay it writes the real batch, padded
to the captured size with fill values, into the SAME buffers (`..._replay_cuda_graph`). The captured
forward reads only those buffers: every Python value it used is frozen at capture.

`GraphGlue` writes that path as one method per engine decision, so a mutant overrides exactly one:

- `Capabilities.graph_modes`: the modes the backend can capture (empty: not capturable, with
  `why_not["graph"]` the reason `list` and the suite show);
- `graph_buffers(limits, batch) -> GraphState`: allocate every buffer for `limits`;
- `capture_metadata(state, bs)`: fill them for a dummy batch of bs requests (seq_len fill value,
  the reserved page, out_cache_loc 0 = the reserved slot) before capturing size bs;
- `replay_metadata(state, batch, bs)`: write the real batch, padded to bs, into the same buffers;
  made of small steps (`replay_kv_extents`, `replay_out_cache_loc`, ...) a mutant can override one of;
- `graph_forward(state, static) -> Tensor`: the captured part: writes this step's K/V at the
  out_cache_loc buffer and runs the kernel reading only buffers and the static inputs.

The graph runner and the replay check (harness/checks/replay.py) drive these; harness/backends/graphs.py
captures and replays (torch.cuda.CUDAGraph on a GPU, an emulator with the same semantics on the CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from harness.backends.glue import EngineGlue
from harness.core import graph_case
from harness.core.batch import Batch
from harness.core.case import Case
from harness.core.modes import Mode
from harness.core.pool import PagedPool, translate_slots

RESERVED_SLOT = 0  # out_cache_loc of a padding request: slot 0 of the reserved page 0


def capture_sizes(max_batch: int) -> list[int]:
    """The batch sizes an engine captures up to `max_batch`: 1, 2, 4, 8, then steps of 8 (sglang's
    capture_bs), the last one the first that holds max_batch."""
    sizes = [1, 2, 4, 8]
    while sizes[-1] < max_batch:
        sizes.append(sizes[-1] + 8)
    return [s for s in sizes if s < max_batch] + [next(s for s in sizes if s >= max_batch)]


def padded_size(sizes: list[int], bs: int) -> int:
    """The captured size a batch of bs real requests replays at: the smallest one >= bs."""
    fits = [s for s in sizes if s >= bs]
    if not fits:
        raise ValueError(f"batch of {bs} requests exceeds the largest captured size {max(sizes)}")
    return min(fits)


@dataclass(frozen=True)
class GraphLimits:
    """What the buffers are allocated for: the largest batch, the queries per request (1 in DECODE,
    num_draft in TARGET_VERIFY and DRAFT_EXTEND_V2: the captured shape), the largest KV extent of a
    request (keys), and the page size."""

    max_batch: int
    queries: int
    max_kv: int
    page_size: int

    @property
    def max_pages(self) -> int:
        """Pages one request's KV can take (the page-table width)."""
        return -(-self.max_kv // self.page_size)


@dataclass
class GraphState:
    """What `graph_buffers` allocates: the limits, the layer it was made for (`layer`: a Batch whose
    Case gives the fixed shape and options: mode, heads, window, soft cap, dtypes; its metadata is
    never read), the metadata buffers by name (allocated once, never replaced), and per captured
    size whatever the backend builds over views of them (wrappers). `pool` is the static pool every
    captured forward reads (StaticInputs.pool), set by the runner before the first capture: an engine
    that holds its cache in its own objects builds them over its storage."""

    limits: GraphLimits
    layer: Batch
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    per_size: dict[int, Any] = field(default_factory=dict)
    pool: PagedPool | None = field(default=None, init=False)

    @property
    def mode(self) -> Mode:
        return self.layer.mode

    @property
    def device(self) -> torch.device:
        return self.layer.device


@dataclass(kw_only=True)
class StaticInputs:
    """The persistent tensors a graph of `bs` requests was captured with (views of the runner's
    buffers at the largest size): this step's queries and new K/V (bs * queries rows; padding rows
    keep what the last replay left), the layer's pool, the hybrid pool's map, the sinks."""

    bs: int
    q: torch.Tensor
    k_new: torch.Tensor
    v_new: torch.Tensor
    pool: PagedPool
    full_to_swa: torch.Tensor | None
    sinks: torch.Tensor | None


class GraphGlue(EngineGlue):
    """The replay path of an adapter, one engine decision per method. A capturable adapter inherits
    it, declares `Capabilities.graph_modes`, and implements the four protocol methods; the shared
    steps (extents, padding, out_cache_loc, the K/V write) are written here once."""

    # --- the protocol --------------------------------------------------------------------------

    def graph_buffers(self, limits: GraphLimits, batch: Batch) -> GraphState:
        """Allocate every metadata buffer once for `limits` (the layer's shape from `batch`). The base
        allocates out_cache_loc; an adapter adds its own and calls this."""
        state = GraphState(limits, batch)
        rows = limits.max_batch * limits.queries
        state.buffers["out_cache_loc"] = torch.zeros(rows, dtype=torch.int32, device=batch.device)
        return state

    def graph_supports(self, case: Case) -> str | None:
        """None if the graph path runs this (eagerly supported) case, else why not: a feature the
        eager path has and the graph path lacks."""
        return self.graph_window_reason(case.mode) if case.window_left >= 0 else None

    def graph_window_reason(self, mode: Mode) -> str | None:
        """Why the graph path cannot run a sliding window in `mode` where the eager path can, or None
        (the graph suite skips that mode's windowed tests with it)."""
        return None

    def graph_mode_reason(self, mode: Mode) -> str | None:
        """Why the graph path cannot replay `mode` in this environment although the backend captures it
        (e.g. an engine whose replay needs the library release it pins), or None: the graph suite skips
        the mode's tests with it, and a replay of it is refused."""
        return None

    def capture_metadata(self, state: GraphState, bs: int) -> None:
        """Fill the buffers for a dummy batch of bs requests, before size bs is captured."""
        raise NotImplementedError

    def replay_metadata(self, state: GraphState, batch: Batch, bs: int) -> None:
        """Write the real batch, padded to bs requests, into the buffers, before a replay at size bs."""
        raise NotImplementedError

    def graph_forward(self, state: GraphState, static: StaticInputs) -> torch.Tensor:
        """The captured forward: the K/V write at the out_cache_loc buffer, then the kernel."""
        self.graph_write_kv(state, static)
        return self.graph_kernel(state, static)

    # --- the shared steps ----------------------------------------------------------------------

    def graph_kernel(self, state: GraphState, static: StaticInputs) -> torch.Tensor:
        """The attention kernel over the buffers: [bs * queries, Hq, D]."""
        raise NotImplementedError

    def graph_write_kv(self, state: GraphState, static: StaticInputs) -> None:
        """Store the step's K/V (every row, padding included) at the out_cache_loc buffer, translated
        into this layer's pool, as the eager `write_kv` does."""
        rows = static.bs * state.limits.queries
        slots = state.buffers["out_cache_loc"][:rows]
        static.pool.write(translate_slots(slots, static.full_to_swa), static.k_new, static.v_new)

    def padding_extent(self, state: GraphState) -> int:
        """The KV extent of a padding request (and of every dummy request at capture): seq_lens at
        the engine's fill value (graph_case.padding_extent)."""
        return graph_case.padding_extent(state.mode, state.limits.queries)

    def replay_kv_extents(self, state: GraphState, batch: Batch) -> list[int]:
        """The real requests' KV extents as the replay path computes them: from seq_lens by the mode's
        convention, as the eager path (DRAFT_EXTEND_V2: the bumped seq_lens)."""
        return self.kv_extents(batch)

    def replay_key_ranges(self, state: GraphState, batch: Batch) -> list[tuple[int, int]]:
        """[lo, hi) key positions each real request reads on replay (kv_start as eager)."""
        return [(self.kv_start(batch, r), n) for r, n in enumerate(self.replay_kv_extents(state, batch))]

    def replay_out_cache_loc(self, state: GraphState, batch: Batch, bs: int) -> None:
        """out_cache_loc of the padded batch: the real slots, then RESERVED_SLOT for every padding
        row (a padding request writes its K/V to the reserved slot, never into a live one)."""
        buf = state.buffers["out_cache_loc"]
        real = batch.out_cache_loc.numel()
        buf[:real].copy_(batch.out_cache_loc)
        buf[real : bs * state.limits.queries].fill_(RESERVED_SLOT)

    def capture_out_cache_loc(self, state: GraphState, bs: int) -> None:
        """out_cache_loc of the dummy batch: every row at the reserved slot."""
        state.buffers["out_cache_loc"][: bs * state.limits.queries].fill_(RESERVED_SLOT)
