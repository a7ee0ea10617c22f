"""FlexAttention (`torch.nn.attention.flex_attention`): an eager and a `torch.compile`d variant.

The glue a serving engine writes around flex: each request's keys are gathered from the paged pool
through `req_to_token` and laid end to end like documents, and one `mask_mod` built from the
engine's metadata says who sees whom (written independently of references/masks.py). Soft cap is a
`score_mod`; sinks renormalise through the LSE, or join as a virtual key where the compiled CPU
kernel returns none. Why each choice, shapes and compile cost: docs/flex.md.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import torch

from harness.backends.base import ALL_CAPABILITIES, BackendOutput
from harness.backends.flex_launch import MIN_CAPTURED_LEN, NO_WINDOW, Launch, ScoreMod, score_terms
from harness.backends.flex_masks import FlexMasks
from harness.backends.glue import EngineGlue
from harness.backends.versions import import_library
from harness.core.batch import Batch
from harness.core.modes import Mode
from harness.core.timing import phase
from harness.core.transfer import to_device

FLEX_MODULE = "torch.nn.attention.flex_attention"
CPU_SUITE_ENV = "ATTN_HARNESS_FLEX_CPU_SUITE"
# "static" makes the compiled CUDA kernel use padded static shapes too (the CPU always does).
SHAPES_ENV = "ATTN_HARNESS_FLEX_SHAPES"

# The compiled CUDA kernel's tiles. Measured on the H100 with torch 2.11: the autotuned default for
# bf16, head_dim 128 with this score_mod needs 267264 bytes of shared memory (limit 232448), so
# inductor raised NoValidChoicesError on some launches. 64 x 64 tiles in two stages fit, and
# divide the block mask's 128 x 128 blocks as flex requires.
CUDA_KERNEL_OPTIONS = {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2, "num_warps": 4}
# Deterministic mode also pins flex's main kernel. For a short query inductor otherwise picks its
# decoding kernel, which splits the keys into SPLIT_KV tiles of cdiv(KV_LEN, SPLIT_KV) keys: the tiles
# (so the order of the sum) follow the launch's key length, which a CUDA-graph launch fixes at its
# stride while the eager launch has the request's own (torch/_inductor/kernel/flex/flex_decode.py.jinja,
# TILE_KV_OG). The main kernel walks a query block's key blocks in order, whatever the length.
DETERMINISTIC_KERNEL_OPTIONS = {**CUDA_KERNEL_OPTIONS, "FORCE_USE_FLEX_ATTENTION": True}

# Why the eager variant has no CUDA-graph path (docs/flex.md, "Under a CUDA graph").
FLEX_NOT_CAPTURED = (
    "not capturable as glued: each call packs the batch's keys end to end in a per-request Python "
    "loop (lengths, positions and the tree read on the host, sizes from the batch) and builds a new "
    "BlockMask for that shape; flex_compiled has the graph path (fixed-size buffers), the unfused "
    "eager kernel is not what an engine captures"
)


@cache
def _flex_api() -> tuple[Callable, dict]:
    """flex_attention, and the keyword that asks for the LSE in this torch.

    torch >= 2.9 takes `return_aux=AuxRequest(lse=True)` (and deprecates `return_lse`); older
    versions only know `return_lse=True`. Both return the LSE in natural log.
    """
    from torch.nn.attention import flex_attention as fa

    if "return_aux" in inspect.signature(fa.flex_attention).parameters:
        lse_kwargs = {"return_aux": fa.AuxRequest(lse=True)}
    else:
        lse_kwargs = {"return_lse": True}
    return fa.flex_attention, lse_kwargs


def _unpack_lse(result: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    out, aux = result
    return out, aux if isinstance(aux, torch.Tensor) else aux.lse


def _cxx_compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@dataclass(kw_only=True)
class PackedTokens:
    """A launch's tokens before padding: per-request query and K/V tensors, and per-token metadata
    (the Launch's index tensors as host lists)."""

    q_parts: list[torch.Tensor] = field(default_factory=list)
    k_parts: list[torch.Tensor] = field(default_factory=list)
    v_parts: list[torch.Tensor] = field(default_factory=list)
    q_doc: list[int] = field(default_factory=list)
    q_pos: list[int] = field(default_factory=list)
    q_tree_row: list[int] = field(default_factory=list)
    kv_doc: list[int] = field(default_factory=list)
    kv_pos: list[int] = field(default_factory=list)
    kv_draft: list[int] = field(default_factory=list)
    kv_free: list[int] = field(default_factory=list)
    kv_sink: list[int] = field(default_factory=list)

    def add_sink_key(self, doc: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """A virtual sink key for document `doc`: zero K/V, seen by every query of it."""
        self.k_parts.append(torch.zeros_like(k[:1]))
        self.v_parts.append(torch.zeros_like(v[:1]))
        self.kv_doc.append(doc)
        self.kv_pos.append(0)
        self.kv_draft.append(-1)
        self.kv_free.append(1)
        self.kv_sink.append(1)


def _padded_rows(parts: list[torch.Tensor], length: int) -> torch.Tensor:
    """[n, H, D] parts end to end, zero-padded to `length` rows, as flex's [1, H, length, D]."""
    x = torch.cat(parts)
    pad = x.new_zeros((length - x.shape[0], *x.shape[1:]))
    return torch.cat([x, pad]).transpose(0, 1).unsqueeze(0).contiguous()


def _padded_ints(values: list[int], length: int, fill: int, device: torch.device) -> torch.Tensor:
    """`values` padded with `fill`, built in numpy (torch.tensor converts a long Python list about
    three times slower: 181 vs 55 us for 3,000 ints, on the CPU), queued to the device."""
    host = np.full(length, fill, dtype=np.int64)
    host[: len(values)] = values
    return to_device(host, device)


def _scalar(value: float, dtype: type[np.generic], device: torch.device) -> torch.Tensor:
    return to_device(np.array(value, dtype=dtype), device)


class FlexBase(FlexMasks, EngineGlue):
    """The shared glue; variants differ in the kernel they call (`kernel`, `calling`, `kernel_kwargs`)
    and whether it returns the LSE (`returns_lse_on`)."""

    library = "torch.nn.attention.flex_attention"
    capabilities = dataclasses.replace(
        ALL_CAPABILITIES,
        head_dims=frozenset({16, 32, 64, 128, 256}),
        why_not={"graph": FLEX_NOT_CAPTURED},
    )

    def available(self, device: str) -> str | None:
        why = super().available(device)
        if why:
            return why
        _, absent = import_library(FLEX_MODULE)  # raises BackendBroken where it fails to import
        return f"torch {torch.__version__} has no flex_attention: {absent}" if absent else None

    # --- engine glue: the shared reads (glue.py), and how flex lays a batch out --------------

    def sinks_via_lse(self, batch: Batch) -> bool:
        """Renormalise with the kernel's LSE where it has one; otherwise a virtual sink key."""
        return self.returns_lse_on(batch.device.type)

    def launches(self, batch: Batch) -> list[list[int]]:
        """Requests per flex call: all in one (block-sparse), or one each in deterministic mode."""
        if batch.case.deterministic:
            return [[r] for r in range(batch.batch_size)]
        return [list(range(batch.batch_size))]

    def padded_len(self, n: int, device: str) -> int:
        """Rows a launch is padded to (identity unless a variant compiles per shape)."""
        return n

    def launch_lengths(self, num_queries: int, num_keys: int, device: str) -> tuple[int, int]:
        """(query rows, keys) a launch of this many real ones is laid out at: `padded_len` of each."""
        return self.padded_len(num_queries, device), self.padded_len(num_keys, device)

    # --- laying a launch out ------------------------------------------------------------------

    def pack(self, batch: Batch, requests: list[int]) -> Launch:
        """Gather the requests' K/V from the pool and lay queries and keys end to end, padded."""
        case, dev = batch.case, batch.device
        virtual_sink = batch.sinks is not None and not self.sinks_via_lse(batch)
        p = self.packed_tokens(batch, requests, virtual_sink)
        nq, nk = len(p.q_doc), len(p.kv_doc)
        lq, lk = self.launch_lengths(nq, nk, dev.type)
        w, wr, causal = self.window_left(batch), self.window_right(batch), self.causal(batch)
        tree = [1] if batch.tree_mask is None else [int(x) for x in batch.tree_mask.reshape(-1).tolist()]
        return Launch(
            q=_padded_rows(p.q_parts, lq),
            k=_padded_rows(p.k_parts, lk),
            v=_padded_rows(p.v_parts, lk),
            q_doc=_padded_ints(p.q_doc, lq, -1, dev),
            q_pos=_padded_ints(p.q_pos, lq, 0, dev),
            q_tree_row=_padded_ints(p.q_tree_row, lq, 0, dev),
            kv_doc=_padded_ints(p.kv_doc, lk, -2, dev),
            kv_pos=_padded_ints(p.kv_pos, lk, 0, dev),
            kv_draft=_padded_ints(p.kv_draft, lk, -1, dev),
            kv_free=_padded_ints(p.kv_free, lk, 0, dev),
            kv_sink=_padded_ints(p.kv_sink, lk, 0, dev),
            tree=_padded_ints(tree, self.padded_len(max(len(tree), MIN_CAPTURED_LEN), dev.type), 0, dev),
            causal=_scalar(int(causal), np.int64, dev),
            window=_scalar(w if w >= 0 else NO_WINDOW, np.int64, dev),
            window_right=_scalar(wr if wr >= 0 else NO_WINDOW, np.int64, dev),
            cap=_scalar(case.soft_cap, np.float32, dev),
            sink_logit=(
                batch.sinks.float()
                if virtual_sink
                else torch.zeros(case.num_q_heads, dtype=torch.float32, device=dev)
            ),
            num_queries=nq,
            num_keys=nk,
            terms=self.launch_terms(batch, virtual_sink),
            score_terms=score_terms(case.soft_cap, virtual_sink),
            deterministic=case.deterministic,
        )

    def packed_tokens(self, batch: Batch, requests: list[int], virtual_sink: bool) -> PackedTokens:
        """The requests' queries and keys end to end (each request a document), unpadded, with each
        token's metadata; after each request's keys its virtual sink key where it needs one."""
        ranges = self.key_ranges(batch)
        qo = batch.cpu_list("qo_indptr")
        p = PackedTokens()
        e = batch.num_draft
        verify = batch.mode == Mode.TARGET_VERIFY
        for doc, r in enumerate(requests):
            q0, q1 = qo[r], qo[r + 1]
            p.q_parts.append(batch.q[q0:q1])
            p.q_doc += [doc] * (q1 - q0)
            p.q_pos += self.query_positions(batch, r)
            p.q_tree_row += [(r * e + j) * e for j in range(q1 - q0)] if verify else [0] * (q1 - q0)
            lo, hi = ranges[r]
            k, v = batch.pool.read(self.layer_slots(batch, self.kv_slots(batch, r, lo, hi)))
            k, v = self.dequantize(batch, r, k, v)  # an FP8 cache into the case dtype (glue.py)
            p.k_parts.append(k)
            p.v_parts.append(v)
            n = hi - lo
            p.kv_doc += [doc] * n
            p.kv_pos += self.key_positions(batch, r, lo, hi)
            p.kv_draft += [-1] * (n - e) + list(range(e)) if verify else [-1] * n
            p.kv_free += [int(batch.mode == Mode.CROSS)] * n
            p.kv_sink += [0] * n
            if virtual_sink:
                p.add_sink_key(doc, k, v)
        return p

    def launch_terms(self, batch: Batch, virtual_sink: bool) -> frozenset[str]:
        """The mask terms (of MASK_TERMS) this batch needs besides "same request"."""
        terms = {"free"} if batch.mode == Mode.CROSS or virtual_sink else set()
        if self.causal(batch):
            terms.add("causal")
        if self.window_left(batch) >= 0:
            terms.add("window")
        if self.window_right(batch) >= 0:
            terms.add("window_right")
        if batch.mode == Mode.TARGET_VERIFY:
            terms.add("tree")
        return frozenset(terms)

    # --- the variant's call -------------------------------------------------------------------

    def returns_lse_on(self, device: str) -> bool:
        """Whether this variant's kernel returns the LSE on `device`."""
        return True

    def kernel(self, device: str) -> Callable:
        """The flex_attention function this variant calls on `device`."""
        raise NotImplementedError

    def kernel_kwargs(self, device: str, launch: Launch) -> dict:
        """Keyword arguments of the variant's own (none here)."""
        return {}

    def calling(self) -> AbstractContextManager:
        """The context the variant's call runs in (none here)."""
        return nullcontext()

    def kernel_inputs(self, launch: Launch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v as the variant hands them to its kernel (the launch's own here)."""
        return launch.q, launch.k, launch.v

    def call_flex(
        self,
        launch: Launch,
        score_mod: ScoreMod | None,
        block_mask: object,
        scale: float,
        want_lse: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One flex call: output [1, Hq, Lq, D], and the LSE (natural log) when `want_lse`."""
        _, lse_kwargs = _flex_api()
        device = launch.q.device.type
        kwargs = {**(lse_kwargs if want_lse else {}), **self.kernel_kwargs(device, launch)}
        gqa = launch.q.shape[1] != launch.k.shape[1]
        flex = self.kernel(device)
        q, k, v = self.kernel_inputs(launch)
        with self.calling():
            res = flex(q, k, v, score_mod, block_mask, scale=scale, enable_gqa=gqa, **kwargs)
        return _unpack_lse(res) if want_lse else (res, None)

    # --- the forward --------------------------------------------------------------------------

    def run(self, batch: Batch) -> BackendOutput:
        self.write_kv(batch)
        case = batch.case
        want_lse = self.returns_lse_on(batch.device.type)
        out = torch.empty_like(batch.q)
        lse = torch.empty(batch.q.shape[:2], dtype=torch.float32, device=batch.device) if want_lse else None
        qo = batch.cpu_list("qo_indptr")
        for requests in self.launches(batch):
            with phase("plan"):  # packing the launch and building its BlockMask
                launch = self.pack(batch, requests)
                block_mask = self.block_mask(launch)
            o, l_ = self.call_flex(launch, self.score_mod(launch), block_mask, case.scale, want_lse)
            if batch.sinks is not None and self.sinks_via_lse(batch):
                o = self.apply_sinks(o, l_, batch.sinks)
            o = o[0, :, : launch.num_queries].transpose(0, 1)
            at = 0
            for r in requests:
                n = qo[r + 1] - qo[r]
                out[qo[r] : qo[r + 1]] = o[at : at + n]
                if lse is not None:
                    lse[qo[r] : qo[r + 1]] = l_[0, :, at : at + n].transpose(0, 1).float()
                at += n
        return BackendOutput(out=out, lse=lse)
