"""flex_compiled's CUDA-graph path: the padded batch laid out at fixed sizes from buffers written
before each replay; the captured forward gathers K/V, builds the BlockMask and calls the compiled
kernel from those buffers only (docs/flex.md, "Under a CUDA graph").
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch.utils._python_dispatch import _disable_current_modes

from harness.backends.flex_launch import MASK_TERMS, MIN_CAPTURED_LEN, NO_WINDOW, Launch, score_terms
from harness.backends.glue import dequantized
from harness.backends.graph_glue import GraphGlue, GraphLimits, GraphState, StaticInputs
from harness.backends.graphs import kernel as opaque_kernel
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.core.pool import translate_slots
from harness.core.transfer import copy_into

# The graph path's key layout: request r's keys start at r * stride, stride a multiple of this (the
# BlockMask's block size), so a request's blocks hold the same keys as in its own eager launch.
GRAPH_KEY_ALIGN = 128


class FlexGraphPath(GraphGlue):
    """The graph protocol (graph_glue.py) for a flex variant; mixed into FlexCompiled after FlexBase,
    whose launch, mask and kernel methods it calls."""

    # Buffers at the limits, one entry per query row (q_*) or key (kv_*) of the fixed layout: request
    # r's queries at rows r * E.., its keys at r * stride.. (then its virtual sink key, where the
    # kernel returns no LSE). Padding requests and unused rows/keys belong to no document (-1 / -2):
    # a padding request attends to nothing and its output rows (zeros) are never read.

    GRAPH_Q = ("q_doc", "q_pos", "q_tree_row")
    GRAPH_KV = ("kv_doc", "kv_pos", "kv_draft", "kv_free", "kv_sink", "kv_slot")
    GRAPH_FILL = {"q_doc": -1, "kv_doc": -2, "kv_draft": -1}

    def graph_stride(self, limits: GraphLimits) -> int:
        """Keys per request in the layout: max_kv and a sink key, rounded up to GRAPH_KEY_ALIGN."""
        return -(-(limits.max_kv + 1) // GRAPH_KEY_ALIGN) * GRAPH_KEY_ALIGN

    def graph_lengths(self, limits: GraphLimits, device: str, per_request: bool) -> tuple[int, int]:
        """(query rows, keys) of a captured launch: the whole batch at the limits, or one request (in
        deterministic mode, as the eager path's `launches`), laid out as the eager launches are
        (`launch_lengths`)."""
        e, stride = limits.queries, self.graph_stride(limits)
        n = 1 if per_request else limits.max_batch
        return self.launch_lengths(n * e, n * stride, device)

    def graph_buffers(self, limits: GraphLimits, batch: Batch) -> GraphState:
        """The per-row and per-key index buffers, the flattened tree tables, the layer's scalars
        (causal, window, soft cap) and the query buffer [1, Hq, LQ, D], all at the limits (long
        enough for the whole-batch launch and for every per-request one)."""
        state = super().graph_buffers(limits, batch)
        dev, e, case = batch.device.type, limits.queries, batch.case
        (lq, lk), (rq, rk) = self.graph_lengths(limits, dev, False), self.graph_lengths(limits, dev, True)
        last = limits.max_batch - 1  # the last request's per-request launch starts there
        lq, lk = max(lq, last * e + rq), max(lk, last * self.graph_stride(limits) + rk)
        lt = self.padded_len(max(limits.max_batch * e * e, MIN_CAPTURED_LEN), dev)
        b = state.buffers
        for name, n in [(x, lq) for x in self.GRAPH_Q] + [(x, lk) for x in self.GRAPH_KV] + [("tree", lt)]:
            b[name] = torch.full((n,), self.GRAPH_FILL.get(name, 0), dtype=torch.int64, device=batch.device)
        b["q"] = torch.zeros(1, case.num_q_heads, lq, case.head_dim, dtype=batch.q.dtype, device=batch.device)
        w, wr = self.window_left(batch), self.window_right(batch)
        ints = {"causal": int(self.causal(batch)), "window": w if w >= 0 else NO_WINDOW}
        ints["window_right"] = wr if wr >= 0 else NO_WINDOW
        for name, value in ints.items():
            b[name] = torch.tensor(value, dtype=torch.int64, device=batch.device)
        b["cap"] = torch.tensor(float(case.soft_cap), dtype=torch.float32, device=batch.device)
        b["no_sink_logit"] = torch.zeros(case.num_q_heads, dtype=torch.float32, device=batch.device)
        return state

    def capture_metadata(self, state: GraphState, bs: int) -> None:
        """The dummy batch: bs padding requests, i.e. no document anywhere."""
        self.capture_out_cache_loc(state, bs)
        self.write_graph_layout(state, {})

    def replay_metadata(self, state: GraphState, batch: Batch, bs: int) -> None:
        self.replay_out_cache_loc(state, batch, bs)
        self.write_graph_layout(state, self.graph_layout(state, batch))

    def graph_layout(self, state: GraphState, batch: Batch) -> dict[str, list[int]]:
        """The real requests' rows and keys (host lists, from replay_key_ranges), as `pack` lays them
        out but at the fixed offsets; a list is shorter than its buffer, the rest is filled."""
        e, stride = state.limits.queries, self.graph_stride(state.limits)
        virtual_sink = batch.sinks is not None and not self.sinks_via_lse(batch)
        out: dict[str, list[int]] = {name: [] for name in self.GRAPH_Q + self.GRAPH_KV}
        for r, (lo, hi) in enumerate(self.replay_key_ranges(state, batch)):
            out["q_doc"] += [r] * e
            out["q_pos"] += self.query_positions(batch, r)
            verify = batch.mode == Mode.TARGET_VERIFY
            out["q_tree_row"] += [(r * e + j) * e for j in range(e)] if verify else [0] * e
            n = max(hi - lo, 0)
            keys = {
                "kv_doc": [r] * n,
                "kv_pos": self.key_positions(batch, r, lo, hi) if n else [],
                "kv_draft": [-1] * (n - e) + list(range(e)) if verify else [-1] * n,
                "kv_free": [0] * n,
                "kv_sink": [0] * n,
                "kv_slot": self.kv_slots(batch, r, lo, hi).tolist() if n else [],
            }
            if virtual_sink:
                for name, value in (("kv_doc", r), ("kv_pos", 0), ("kv_draft", -1), ("kv_free", 1)):
                    keys[name].append(value)
                keys["kv_sink"].append(1)
                keys["kv_slot"].append(0)
            for name, values in keys.items():
                gap = r * stride - len(out[name])
                out[name] += [self.GRAPH_FILL.get(name, 0)] * gap + values
        if batch.tree_mask is not None:
            out["tree"] = [int(x) for x in batch.tree_mask.reshape(-1).tolist()]
        return out

    def write_graph_layout(self, state: GraphState, layout: dict[str, list[int]]) -> None:
        """Every index buffer rewritten whole: the layout's values, then the fill value."""
        for name in self.GRAPH_Q + self.GRAPH_KV + ("tree",):
            buf, values = state.buffers[name], layout.get(name, [])
            full = values + [self.GRAPH_FILL.get(name, 0)] * (buf.numel() - len(values))
            copy_into(buf, np.array(full, dtype=np.int64))

    def graph_launch(self, state: GraphState, static: StaticInputs) -> Launch:
        """The launch over the buffers: queries copied into the query buffer, K/V gathered through
        kv_slot (this layer's pool), zero where no real key is (a poisoned slot would give 0 * NaN)."""
        b, rows = state.buffers, static.bs * state.limits.queries
        b["q"][0, :, :rows].copy_(static.q.transpose(0, 1))
        k, v = static.pool.read(translate_slots(b["kv_slot"], static.full_to_swa))
        k, v = dequantized(state.layer, k, v, self.shared_kv_scales(state.layer))
        real = ((b["kv_doc"] >= 0) & (b["kv_sink"] == 0)).view(-1, 1, 1)
        k, v = (torch.where(real, x, torch.zeros_like(x)).transpose(0, 1).unsqueeze(0) for x in (k, v))
        virtual_sink = static.sinks is not None and not self.sinks_via_lse(state.layer)
        return Launch(
            q=b["q"],
            k=k,
            v=v,
            **{name: b[name] for name in self.GRAPH_Q + self.GRAPH_KV if name != "kv_slot"},
            tree=b["tree"],
            causal=b["causal"],
            window=b["window"],
            window_right=b["window_right"],
            cap=b["cap"],
            sink_logit=static.sinks.float() if virtual_sink else b["no_sink_logit"],
            num_queries=rows,
            num_keys=k.shape[2],
            terms=MASK_TERMS,
            score_terms=score_terms(state.layer.case.soft_cap, virtual_sink),
            deterministic=state.layer.case.deterministic,
        )

    def graph_call_flex(self, *args: object) -> tuple[torch.Tensor, torch.Tensor | None]:
        """call_flex as one opaque node of the CPU emulator's capture (harness/backends/graphs.py), run
        outside its dispatch mode: under one, dynamo does not compile and flex's eager operator has no
        rule for the mode. On CUDA no mode is active and this is call_flex."""
        with _disable_current_modes():
            return self.call_flex(*args)

    def graph_launches(self, state: GraphState, whole: Launch, bs: int) -> list[Launch]:
        """The captured launches, views of the whole layout at fixed lengths (graph_lengths): one for
        the batch, or in deterministic mode one per request (rows r * E.., keys r * stride..), so a
        request's blocks and their order are those of its eager launch. Padded as the eager launches
        are, a request's launch may reach into the next request's first row or key; its BlockMask
        counts only its own rows (`visible_grid`), and the document mask hides the next's keys."""
        e, stride, dev = state.limits.queries, self.graph_stride(state.limits), state.device.type
        per_request = state.layer.case.deterministic
        lq, lk = self.graph_lengths(state.limits, dev, per_request)
        starts = [(r * e, r * stride, e) for r in range(bs)] if per_request else [(0, 0, bs * e)]
        out = []
        for q0, k0, n in starts:
            rows, keys = slice(q0, q0 + lq), slice(k0, k0 + lk)
            out.append(
                dataclasses.replace(
                    whole,
                    q=whole.q[:, :, rows].contiguous(),
                    k=whole.k[:, :, keys].contiguous(),
                    v=whole.v[:, :, keys].contiguous(),
                    **{name: getattr(whole, name)[rows] for name in self.GRAPH_Q},
                    **{name: getattr(whole, name)[keys] for name in self.GRAPH_KV if name != "kv_slot"},
                    num_queries=n,
                    num_keys=lk,
                )
            )
        return out

    def graph_kernel(self, state: GraphState, static: StaticInputs) -> torch.Tensor:
        """Per launch, the BlockMask built from the buffers as the eager path builds it (`block_mask`:
        torch ops at fixed sizes, no host read, so it is captured and rebuilt by each replay), then
        the compiled kernel at the fixed shapes; sinks through the LSE where it has one."""
        want_lse = self.returns_lse_on(state.device.type)
        scale, call = state.layer.case.scale, opaque_kernel(self.graph_call_flex)
        outs = []
        for launch in self.graph_launches(state, self.graph_launch(state, static), static.bs):
            block_mask = self.block_mask(launch)
            o, lse = call(launch, self.score_mod(launch), block_mask, scale, want_lse)
            if static.sinks is not None and self.sinks_via_lse(state.layer):
                o = self.apply_sinks(o, lse, static.sinks)
            outs.append(o[0, :, : launch.num_queries])
        return torch.cat(outs, dim=1).transpose(0, 1)
