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
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
from torch.utils._python_dispatch import _disable_current_modes

from harness.backends.base import ALL_CAPABILITIES, BackendOutput
from harness.backends.flex_blocks import BLOCK, block_mask_from_grid
from harness.backends.glue import EngineGlue
from harness.backends.graph_glue import GraphGlue, GraphLimits, GraphState, StaticInputs
from harness.backends.graphs import kernel as opaque_kernel
from harness.backends.library import import_library
from harness.core.batch import Batch
from harness.core.case import Case
from harness.core.graph_case import GraphCase
from harness.core.modes import Mode
from harness.core.pool import translate_slots
from harness.core.timing import phase
from harness.core.transfer import copy_into, to_device

FLEX_MODULE = "torch.nn.attention.flex_attention"
# A window bound that admits every key: what "no window" (-1) becomes inside the mask.
NO_WINDOW = 1 << 40
# Padded launch sizes of the compiled CPU kernel: 128 * 4**k rows. Coarse buckets mean few C++
# compiles; padding rows and keys belong to no request, so their blocks are skipped.
MIN_BUCKET, BUCKET_GROWTH = 128, 4
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
# The graph path's key layout: request r's keys start at r * stride, stride a multiple of this (the
# BlockMask's block size), so a request's blocks hold the same keys as in its own eager launch.
GRAPH_KEY_ALIGN = 128

# The shortest a captured index tensor is made (the tree table): dynamo specialises a dimension of
# size 1 (its 0/1 rule), so a length-1 table would be a compile of its own.
MIN_CAPTURED_LEN = 2

# The terms of the mask besides "same request"; see FlexBase.mask_mod.
MASK_TERMS = frozenset({"free", "causal", "window", "window_right", "tree"})
# The terms of the score function: a soft cap, a virtual sink key; see FlexBase.score_mod.
SCORE_TERMS = frozenset({"cap", "sink"})

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Launch:
    """One flex call: some requests' queries and keys laid end to end, with per-token metadata.

    Index tensors are int64 on the batch's device: q_* have one entry per (padded) query row,
    kv_* one per (padded) key. Padding rows and keys carry document ids that match nothing.
    Flags are int64 0/1 too (the most plainly supported dtype for a captured tensor in a kernel).
    """

    q: torch.Tensor  # [1, Hq, Lq, D]
    k: torch.Tensor  # [1, Hkv, Lk, D]
    v: torch.Tensor
    q_doc: torch.Tensor
    q_pos: torch.Tensor
    q_tree_row: torch.Tensor  # offset of the query's row in the flattened tree mask (verify)
    kv_doc: torch.Tensor
    kv_pos: torch.Tensor
    kv_draft: torch.Tensor  # draft index of a verify draft key, -1 otherwise
    kv_free: torch.Tensor  # 1: every query of the document sees it (encoder keys, sink key)
    kv_sink: torch.Tensor  # 1: the virtual sink key
    tree: torch.Tensor  # the flattened [B, E, E] tree mask as 0/1 (verify; else [1]), zero-padded
    causal: torch.Tensor  # int64 scalar: 1 if the causal term masks, 0 if it admits every key
    window: torch.Tensor  # int64 scalar: W, or NO_WINDOW
    window_right: torch.Tensor  # int64 scalar: R of a two-sided (encoder) window, or NO_WINDOW
    cap: torch.Tensor  # float32 scalar: soft cap, 0 for none
    sink_logit: torch.Tensor  # float32 [Hq]: per-head sink logit (zeros without sinks)
    num_queries: int  # real query rows (the rest is padding)
    num_keys: int  # keys up to the last real one (the rest is padding, seen by no query)
    terms: frozenset[str]  # the mask terms this launch needs, of MASK_TERMS
    score_terms: frozenset[str]  # what the score_mod has to do here, of SCORE_TERMS
    deterministic: bool = False  # the case's deterministic mode (flex_compiled pins its kernel for it)


def bucket(n: int) -> int:
    """The padded length of n rows: the smallest MIN_BUCKET * BUCKET_GROWTH**k >= n."""
    size = MIN_BUCKET
    while size < n:
        size *= BUCKET_GROWTH
    return size


def soft_capped(s: torch.Tensor, cap: torch.Tensor) -> torch.Tensor:
    """The soft cap's term: c * tanh(s / c) on the scaled score s, for a cap c > 0."""
    return cap * torch.tanh(s / cap)


def with_sink_key(
    s: torch.Tensor, h: torch.Tensor, k: torch.Tensor, kv_sink: torch.Tensor, sink_logit: torch.Tensor
) -> torch.Tensor:
    """The virtual sink key's term: the sink key scores its head's logit, every other key `s`."""
    return torch.where(kv_sink[k] != 0, sink_logit[h].to(s.dtype), s)


def score_terms(soft_cap: float, virtual_sink: bool) -> frozenset[str]:
    """The SCORE_TERMS a launch needs: "cap" with a soft cap, "sink" with a virtual sink key."""
    return frozenset({"cap"} if soft_cap > 0 else ()) | frozenset({"sink"} if virtual_sink else ())


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


class FlexBase(EngineGlue):
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

    def key_positions(self, batch: Batch, r: int, lo: int, hi: int) -> list[int]:
        """Absolute positions of keys lo..hi-1: their index; verify drafts sit at their query's position."""
        if batch.mode == Mode.TARGET_VERIFY:
            return list(range(lo, hi - batch.num_draft)) + self.query_positions(batch, r)
        return list(range(lo, hi))

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

    # --- the mask and score functions ---------------------------------------------------------

    def document_mask(self, q_doc: torch.Tensor, kv_doc: torch.Tensor) -> MaskMod:
        def same_request(b, h, q, k):  # noqa: ANN001, ANN202 - flex's mask_mod signature
            return q_doc[q] == kv_doc[k]

        return same_request

    def causal_mask(self, q_pos: torch.Tensor, kv_pos: torch.Tensor, causal: torch.Tensor) -> MaskMod:
        """Keys up to the query's position; every key where the launch's `causal` flag is 0 (an
        encoder-only batch), so one compiled function serves both."""

        def causal_or_not(b, h, q, k):  # noqa: ANN001, ANN202
            return (kv_pos[k] <= q_pos[q]) | (causal == 0)

        return causal_or_not

    def window_mask(self, q_pos: torch.Tensor, kv_pos: torch.Tensor, window: torch.Tensor) -> MaskMod:
        """Sliding window: a query at p keeps keys p - W .. p (W + 1 keys)."""

        def in_window(b, h, q, k):  # noqa: ANN001, ANN202
            return kv_pos[k] >= q_pos[q] - window

        return in_window

    def window_right_mask(
        self, q_pos: torch.Tensor, kv_pos: torch.Tensor, window_right: torch.Tensor
    ) -> MaskMod:
        """A two-sided (encoder) window's right edge: a query at p keeps keys up to p + R."""

        def in_right_window(b, h, q, k):  # noqa: ANN001, ANN202
            return kv_pos[k] <= q_pos[q] + window_right

        return in_right_window

    def tree_mask(self, q_tree_row: torch.Tensor, kv_draft: torch.Tensor, tree: torch.Tensor) -> MaskMod:
        """Verify: a draft key is visible to its descendants and itself (batch.tree_mask)."""

        def ancestor_or_self(b, h, q, k):  # noqa: ANN001, ANN202
            d = kv_draft[k]
            return (d < 0) | (tree[q_tree_row[q] + d.clamp(min=0)] != 0)

        return ancestor_or_self

    def free_keys(self, kv_free: torch.Tensor) -> MaskMod:
        def seen_by_all(b, h, q, k):  # noqa: ANN001, ANN202
            return kv_free[k] != 0

        return seen_by_all

    def mask_terms(self, launch: Launch) -> frozenset[str]:
        """Every term, always: one function for every batch, so a compiled kernel is reused (a term a
        batch does not use admits every key: NO_WINDOW, causal flag 0, no drafts, no free keys)."""
        return MASK_TERMS

    def mask_mod(self, launch: Launch) -> MaskMod:
        """Same request, and either a key every query sees (`free`) or one that is causal & in the
        window (both edges) & in the tree (the terms of `mask_terms`)."""
        terms = self.mask_terms(launch)
        same = self.document_mask(launch.q_doc, launch.kv_doc)
        free = self.free_keys(launch.kv_free) if "free" in terms else None
        ordered = []
        if "causal" in terms:
            ordered.append(self.causal_mask(launch.q_pos, launch.kv_pos, launch.causal))
        if "window" in terms:
            ordered.append(self.window_mask(launch.q_pos, launch.kv_pos, launch.window))
        if "window_right" in terms:
            ordered.append(self.window_right_mask(launch.q_pos, launch.kv_pos, launch.window_right))
        if "tree" in terms:
            ordered.append(self.tree_mask(launch.q_tree_row, launch.kv_draft, launch.tree))

        def visible(b, h, q, k):  # noqa: ANN001, ANN202
            vis = same(b, h, q, k)
            if not ordered:  # CROSS, or ENCODER_ONLY without a window: every key of the request
                return vis
            seen = ordered[0](b, h, q, k)
            for term in ordered[1:]:
                seen = seen & term(b, h, q, k)
            if free is not None:
                seen = seen | free(b, h, q, k)
            return vis & seen

        return visible

    def score_mod(self, launch: Launch) -> ScoreMod:
        """Soft cap c > 0: c * tanh(s / c) on the scaled score; the sink key scores its logit."""
        cap, kv_sink, sink_logit = launch.cap, launch.kv_sink, launch.sink_logit
        safe = torch.where(cap > 0, cap, torch.ones_like(cap))

        def capped_or_sink(s, b, h, q, k):  # noqa: ANN001, ANN202
            return with_sink_key(torch.where(cap > 0, soft_capped(s, safe), s), h, k, kv_sink, sink_logit)

        return capped_or_sink

    # --- laying a launch out ------------------------------------------------------------------

    def pack(self, batch: Batch, requests: list[int]) -> Launch:
        """Gather the requests' K/V from the pool and lay queries and keys end to end, padded."""
        case = batch.case
        dev = batch.device
        virtual_sink = batch.sinks is not None and not self.sinks_via_lse(batch)
        ranges = self.key_ranges(batch)
        qo = batch.cpu_list("qo_indptr")
        q_parts, k_parts, v_parts = [], [], []
        q_doc: list[int] = []
        q_pos: list[int] = []
        q_tree_row: list[int] = []
        kv_doc: list[int] = []
        kv_pos: list[int] = []
        kv_draft: list[int] = []
        kv_free: list[int] = []
        kv_sink: list[int] = []
        e = batch.num_draft
        for doc, r in enumerate(requests):
            q0, q1 = qo[r], qo[r + 1]
            q_parts.append(batch.q[q0:q1])
            q_doc += [doc] * (q1 - q0)
            q_pos += self.query_positions(batch, r)
            if batch.mode == Mode.TARGET_VERIFY:
                q_tree_row += [(r * e + j) * e for j in range(q1 - q0)]
            else:
                q_tree_row += [0] * (q1 - q0)
            lo, hi = ranges[r]
            k, v = batch.pool.read(self.layer_slots(batch, self.kv_slots(batch, r, lo, hi)))
            k, v = self.dequantize(batch, k, v)  # an FP8 cache into the case dtype (glue.py)
            k_parts.append(k)
            v_parts.append(v)
            n = hi - lo
            kv_doc += [doc] * n
            kv_pos += self.key_positions(batch, r, lo, hi)
            if batch.mode == Mode.TARGET_VERIFY:
                kv_draft += [-1] * (n - e) + list(range(e))
            else:
                kv_draft += [-1] * n
            kv_free += [int(batch.mode == Mode.CROSS)] * n
            kv_sink += [0] * n
            if virtual_sink:
                k_parts.append(torch.zeros_like(k[:1]))
                v_parts.append(torch.zeros_like(v[:1]))
                kv_doc.append(doc)
                kv_pos.append(0)
                kv_draft.append(-1)
                kv_free.append(1)
                kv_sink.append(1)
        nq, nk = len(q_doc), len(kv_doc)
        lq, lk = self.launch_lengths(nq, nk, dev.type)

        def rows(parts: list[torch.Tensor], length: int) -> torch.Tensor:
            x = torch.cat(parts)
            pad = x.new_zeros((length - x.shape[0], *x.shape[1:]))
            return torch.cat([x, pad]).transpose(0, 1).unsqueeze(0).contiguous()

        def ints(values: list[int], length: int, fill: int) -> torch.Tensor:
            """`values` padded with `fill`, built in numpy (torch.tensor converts a long Python list
            about three times slower: 181 vs 55 us for 3,000 ints, on the CPU), queued to the device."""
            host = np.full(length, fill, dtype=np.int64)
            host[: len(values)] = values
            return to_device(host, dev)

        def scalar(value: float, dtype: type[np.generic]) -> torch.Tensor:
            return to_device(np.array(value, dtype=dtype), dev)

        w, wr, causal = self.window_left(batch), self.window_right(batch), self.causal(batch)
        terms = {"free"} if batch.mode == Mode.CROSS else set()
        if causal:
            terms.add("causal")
        if w >= 0:
            terms.add("window")
        if wr >= 0:
            terms.add("window_right")
        if batch.mode == Mode.TARGET_VERIFY:
            terms.add("tree")
        if virtual_sink:
            terms.add("free")
        tree = [1] if batch.tree_mask is None else [int(x) for x in batch.tree_mask.reshape(-1).tolist()]
        return Launch(
            q=rows(q_parts, lq),
            k=rows(k_parts, lk),
            v=rows(v_parts, lk),
            q_doc=ints(q_doc, lq, -1),
            q_pos=ints(q_pos, lq, 0),
            q_tree_row=ints(q_tree_row, lq, 0),
            kv_doc=ints(kv_doc, lk, -2),
            kv_pos=ints(kv_pos, lk, 0),
            kv_draft=ints(kv_draft, lk, -1),
            kv_free=ints(kv_free, lk, 0),
            kv_sink=ints(kv_sink, lk, 0),
            tree=ints(tree, self.padded_len(max(len(tree), MIN_CAPTURED_LEN), dev.type), 0),
            causal=scalar(int(causal), np.int64),
            window=scalar(w if w >= 0 else NO_WINDOW, np.int64),
            window_right=scalar(wr if wr >= 0 else NO_WINDOW, np.int64),
            cap=scalar(case.soft_cap, np.float32),
            sink_logit=(
                batch.sinks.float()
                if virtual_sink
                else torch.zeros(case.num_q_heads, dtype=torch.float32, device=dev)
            ),
            num_queries=nq,
            num_keys=nk,
            terms=frozenset(terms),
            score_terms=score_terms(case.soft_cap, virtual_sink),
            deterministic=case.deterministic,
        )

    def visible_grid(self, launch: Launch) -> torch.Tensor:
        """`mask_mod` evaluated once over the launch's real rows and keys, [num_queries, num_keys] bool,
        by broadcasting its index tensors: a dozen tensor operations, where flex's own evaluation
        (create_block_mask, the eager kernel) goes through four nested vmaps with Python dispatch for
        each operation. Padding rows and keys (document ids -1 / -2) see nothing and are left out."""
        nq, nk = launch.num_queries, launch.num_keys
        dev = launch.q.device
        zero = torch.zeros((), dtype=torch.int64, device=dev)
        rows = torch.arange(nq, device=dev)[:, None]
        cols = torch.arange(nk, device=dev)[None, :]
        return self.mask_mod(launch)(zero, zero, rows, cols).expand(nq, nk)

    def block_mask(self, launch: Launch):  # noqa: ANN201 - a flex BlockMask
        """The launch's BlockMask, reduced from its visibility grid (flex_blocks.py: the blocks
        create_block_mask would find, without its vmaps), with `flex_mask_mod` for partial blocks."""
        visible = self.visible_grid(launch)
        lengths = (launch.q.shape[2], launch.k.shape[2])
        return block_mask_from_grid(visible, lengths, self.flex_mask_mod(launch, visible))

    def flex_mask_mod(self, launch: Launch, visible: torch.Tensor) -> MaskMod:
        """The mask_mod handed to flex (the BlockMask carries it into the kernel): `mask_mod` itself."""
        return self.mask_mod(launch)

    def apply_sinks(self, out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
        """out [1, Hq, L, D] * exp(lse) / (exp(lse) + exp(sink)), as sigmoid(lse - sink): stable, and
        0 where no key is visible (lse = -inf)."""
        factor = torch.sigmoid(lse.float() - sinks.float().view(1, -1, 1))
        return (out.float() * factor.unsqueeze(-1)).to(out.dtype)

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


class FlexEager(FlexBase):
    """flex_attention without torch.compile: flex's own unfused implementation (scores in fp32)."""

    name = "flex_eager"
    # The unfused path materialises [Hq, Lq, Lk] scores over the whole packed grid (every request's
    # queries against every request's keys): launches are split to bound that.
    max_scores = 1 << 27
    # Wasted scores (query head x query x another request's key, in the packed grid) that cost about
    # as much as one more launch's host time (pack, BlockMask, flex's vmaps). CPU: tuned on the
    # bench mix on the CPU runner (up to 2^14 wasted pairs x 8 heads: 29-33 ms per case against 84 ms
    # with the whole batch in one launch; docs/flex.md). CUDA: an estimate (about 2 ms of host time per launch
    # against ~10 fp32 passes per score at the H100's bandwidth), not a measurement, which keeps the
    # bench's batches in one launch there.
    waste_per_launch = {"cpu": 1 << 17, "cuda": 1 << 26}

    def mask_terms(self, launch: Launch) -> frozenset[str]:
        """Only the terms the batch needs: the unfused path evaluates each one through vmap on every
        call, and it compiles nothing that a changing mask would invalidate."""
        return launch.terms

    def launches(self, batch: Batch) -> list[list[int]]:
        """Consecutive requests share a launch while the packed grid stays under `max_scores` and its
        cross-request waste under `waste_per_launch` (one launch per request in deterministic mode)."""
        if batch.case.deterministic:
            return super().launches(batch)
        heads, waste = batch.case.num_q_heads, self.waste_per_launch.get(batch.device.type, 1 << 26)
        groups: list[list[int]] = []
        qo = batch.cpu_list("qo_indptr")
        kv = self.kv_extents(batch)
        nq = nk = own = 0
        for r in range(batch.batch_size):
            q, k = qo[r + 1] - qo[r], kv[r] + 1
            grid = (nq + q) * (nk + k)
            too_big, too_wasteful = grid * heads > self.max_scores, (grid - own - q * k) * heads > waste
            if groups and (too_big or too_wasteful):
                groups.append([])
                nq = nk = own = 0
            if not groups:
                groups.append([])
            groups[-1].append(r)
            nq, nk, own = nq + q, nk + k, own + q * k
        return groups

    def flex_mask_mod(self, launch: Launch, visible: torch.Tensor) -> MaskMod:
        """A lookup into the launch's visibility grid (`visible_grid`: the glue's `mask_mod` evaluated
        once by broadcasting). The eager kernel evaluates its mask_mod through four nested vmaps, where
        every tensor operation of the mask costs pytree and functorch dispatch in Python (most of the
        32 ms of host time a launch cost on the CPU runner; docs/flex.md); a lookup is one operation.
        The same terms decide the same visibility, so it is the same mask."""

        lq, lk = launch.q.shape[2], launch.k.shape[2]
        nq, nk = visible.shape
        grid = visible if (nq, nk) == (lq, lk) else torch.nn.functional.pad(visible, (0, lk - nk, 0, lq - nq))

        def looked_up(b, h, q, k):  # noqa: ANN001, ANN202 - flex's mask_mod signature
            # aten.index directly: `grid[q, k]` becomes flex's ModIndex autograd function under its
            # vmaps, twice the host time for the same lookup
            return torch.ops.aten.index.Tensor(grid, [q, k])

        return looked_up

    def score_mod(self, launch: Launch) -> ScoreMod | None:
        """Only the terms the launch needs, as `mask_terms`: the unfused path applies a score_mod
        through the same nested vmaps as the mask, where each tensor operation costs pytree and
        functorch dispatch in Python (the shared function's ten operations were 3.5 of the 7.2 s of
        a Gemma2 model check on the CPU runner). None (flex's identity) without a soft cap or a
        virtual sink key. Each gives the shared function's scores bit for bit (tests/test_flex.py)."""
        terms = launch.score_terms
        if terms == {"cap"}:  # cap > 0 here: c * tanh(s / c), as the shared function's selected branch
            cap = launch.cap

            def capped(s, b, h, q, k):  # noqa: ANN001, ANN202 - flex's score_mod signature
                return soft_capped(s, cap)

            return capped
        if terms == {"sink"}:
            kv_sink, sink_logit = launch.kv_sink, launch.sink_logit

            def sink_key(s, b, h, q, k):  # noqa: ANN001, ANN202
                return with_sink_key(s, h, k, kv_sink, sink_logit)

            return sink_key
        return super().score_mod(launch) if terms else None

    def kernel(self, device: str) -> Callable:
        return _flex_api()[0]

    @contextmanager
    def calling(self) -> Iterator[None]:
        """Without flex's warning "called without torch.compile()" (that is this variant's point), and
        without the dynamo wrapper eager flex puts around its unfused implementation
        (`torch.compile(backend="eager")`, `_eager_without_dynamo`)."""
        with warnings.catch_warnings(), _eager_without_dynamo():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            yield


# The flag flex reads on every eager call: True runs its unfused implementation directly, False
# (torch's default) through torch.compile(backend="eager"), which traces a graph anew for every new
# mask, score function and shape (about a second each on the CPU runner; docs/flex.md).
DISABLE_COMPILE_FLAG = "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG"


@contextmanager
def _eager_without_dynamo() -> Iterator[None]:
    """flex's unfused implementation called directly, as flex's own debug flag does: the same
    operations as under the eager-backend wrapper (tests/test_flex.py compares the outputs bit for
    bit), without dynamo tracing. A torch without the flag keeps its wrapper."""
    from torch.nn.attention import flex_attention as fa

    if not hasattr(fa, DISABLE_COMPILE_FLAG):
        yield
        return
    before = getattr(fa, DISABLE_COMPILE_FLAG)
    setattr(fa, DISABLE_COMPILE_FLAG, True)
    try:
        yield
    finally:
        setattr(fa, DISABLE_COMPILE_FLAG, before)


@cache
def _compiled_flex(dynamic: bool) -> Callable:
    flex, _ = _flex_api()
    return torch.compile(flex, dynamic=dynamic, fullgraph=True)


def _dynamo_settings() -> dict:
    """Dynamo settings for the compiled call:
    - a high recompile limit, and an error (never a silent eager fallback) if it is hit, so the
      compiled backend never reports eager results;
    - no automatic dynamic shapes. With `dynamic=True` every size is symbolic from the first compile;
      what automatic dynamic adds is a graph shaped by what the process met before (and, through its
      profile on disk, what earlier processes met), so a check's process traced graphs the warm-up
      had not compiled (90 new FX graphs on the H100: docs/flex.md). Without it a graph follows from
      its inputs alone, in any order."""
    cfg = torch._dynamo.config
    want = {
        "recompile_limit": 512,
        "accumulated_recompile_limit": 4096,
        "fail_on_recompile_limit_hit": True,
        "automatic_dynamic_shapes": False,
    }
    return {k: v for k, v in want.items() if hasattr(cfg, k)}


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a fresh contiguous tensor of `shape` (a size-1 dimension's stride included)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def canonical_layout(x: torch.Tensor) -> torch.Tensor:
    """`x` with contiguous_strides: the same elements. A contiguous tensor may carry any stride on a
    size-1 dimension (a one-row launch's [1, H, 1, D] view of a [1, 1, H, D] tensor), and dynamo
    guards on strides, so each such layout would be a compile of its own."""
    want = contiguous_strides(tuple(x.shape))
    if x.stride() == want:
        return x
    return x.as_strided(x.shape, want) if x.is_contiguous() else x.contiguous()


class FlexCompiled(FlexBase, GraphGlue):
    """torch.compile(flex_attention): Triton on CUDA, inductor's C++ template on the CPU.

    On the CPU every new padded shape costs a C++ compile (seconds), so the suite (cases/) skips
    the CPU device unless ATTN_HARNESS_FLEX_CPU_SUITE=1; CPU CI runs it on a dedicated subset
    (tests/test_flex.py). `cpu_in_suite` forces it on (the tests and the mutants use it).

    The CUDA-graph path (the section below, docs/flex.md "Under a CUDA graph") lays the padded batch
    out at fixed sizes from buffers written before each replay; the captured forward gathers K/V,
    builds the BlockMask and calls the compiled kernel from those buffers only.
    """

    name = "flex_compiled"
    cpu_in_suite = False
    capabilities = dataclasses.replace(
        FlexBase.capabilities,
        returns_lse=False,
        graph_modes=frozenset({Mode.DECODE, Mode.TARGET_VERIFY, Mode.DRAFT_EXTEND_V2}),
        why_not={
            "returns_lse": "the compiled CPU kernel has no LSE output (inductor raises "
            "NotImplementedError); on CUDA the LSE is returned and checked, and sinks use it",
        },
    )

    def available(self, device: str) -> str | None:
        why = super().available(device)
        if why or device != "cpu":
            return why
        if _cxx_compiler() is None:
            return "torch.compile on the CPU needs a C++ compiler (g++/clang++ or $CXX); none found"
        if not (self.cpu_in_suite or os.environ.get(CPU_SUITE_ENV) == "1"):
            return (
                "compiled flex on the CPU costs seconds of C++ compilation per new shape; CPU CI "
                f"runs it on a dedicated subset (tests/test_flex.py); set {CPU_SUITE_ENV}=1 to run it here"
            )
        return None

    def returns_lse_on(self, device: str) -> bool:
        return device != "cpu"

    def variant_key(self, case: Case | GraphCase) -> tuple:
        """What plausibly makes torch.compile(flex_attention) compile anew on CUDA (dynamic shapes, so
        not the lengths): dtype, head_dim and heads (static in flex), the softmax scale (a constant of
        the kernel), deterministic mode (its kernel options, one launch per request), and the launch's
        query rows: under 128 (inductor's decoding kernel; one row is no variant of its own, as
        `launch_lengths` pads it). A graph replay's captured launches are keyed apart, by its layer.
        The warm-up groups by it too."""
        if isinstance(case, GraphCase):
            return ("graph", *self.variant_key(case.layer))
        rows = [r.extend_len for r in case.requests]
        launch_rows = max(rows) if case.deterministic else sum(rows)
        return (
            case.dtype,
            case.head_dim,
            case.num_q_heads,
            case.num_kv_heads,
            case.scale,
            case.deterministic,
            launch_rows < 128,
        )

    def static_shapes(self, device: str) -> bool:
        """Static shapes (padded to buckets) on the CPU, where inductor's dynamic-shape flex template
        does not compile; dynamic shapes on CUDA unless ATTN_HARNESS_FLEX_SHAPES=static."""
        return device == "cpu" or os.environ.get(SHAPES_ENV, "").strip().lower() == "static"

    def padded_len(self, n: int, device: str) -> int:
        """With static shapes, padded to a few bucket sizes so that shapes repeat."""
        return bucket(n) if self.static_shapes(device) else n

    def launch_lengths(self, num_queries: int, num_keys: int, device: str) -> tuple[int, int]:
        """With dynamic shapes, lengths past the sizes dynamo specialises. Its 0/1 rule gives a size of
        1 a graph of its own beside the one for larger sizes, so a launch of one query row, of one
        key, of 128 rows (one query block of the BlockMask, at flex's main kernel) or of at most 128
        keys (one key block) was each a compile of its own (docs/flex.md, "Compile cost and shapes").
        Rows 1 and 128 get one padding row, keys at least two blocks: padding rows and keys belong to
        no request, so their blocks are empty and skipped. Every launch under 128 rows has one query
        block; that is flex's decoding kernel, a variant of its own (`variant_key`)."""
        if self.static_shapes(device):
            return super().launch_lengths(num_queries, num_keys, device)
        rows = num_queries + 1 if num_queries in (1, BLOCK) else num_queries
        return rows, max(num_keys, BLOCK + 1)

    def kernel(self, device: str) -> Callable:
        return _compiled_flex(dynamic=not self.static_shapes(device))

    def kernel_kwargs(self, device: str, launch: Launch) -> dict:
        """The CUDA kernel's tiles (CUDA_KERNEL_OPTIONS), and in deterministic mode flex's main kernel
        (DETERMINISTIC_KERNEL_OPTIONS: a replay's launch is then bitwise its eager one's)."""
        if device != "cuda":
            return {}
        options = DETERMINISTIC_KERNEL_OPTIONS if launch.deterministic else CUDA_KERNEL_OPTIONS
        return {"kernel_options": options}

    @contextmanager
    def calling(self) -> Iterator[None]:
        """Dynamo's settings (`_dynamo_settings`); no duck shapes (dynamo otherwise gives two sizes
        that happen to be equal, as many queries as keys, one symbol, and a batch where they differ
        is a compile of its own); gradients off (an engine's forward runs without them, and grad
        mode is a guard, so a call with them on compiled the same kernel again)."""
        from torch.fx.experimental import _config as shapes

        shape_settings = {"use_duck_shape": False} if hasattr(shapes, "use_duck_shape") else {}
        with (
            torch._dynamo.config.patch(**_dynamo_settings()),
            shapes.patch(**shape_settings),
            torch.no_grad(),
        ):
            yield

    def kernel_inputs(self, launch: Launch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v in `canonical_layout`: one compile per shape, not per layout."""
        return canonical_layout(launch.q), canonical_layout(launch.k), canonical_layout(launch.v)

    # --- the CUDA-graph path --------------------------------------------------------------------
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
        k, v = self.dequantize(state.layer, k, v)
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


BACKENDS = {"flex_eager": FlexEager, "flex_compiled": FlexCompiled}
