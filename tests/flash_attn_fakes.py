"""Recording fakes of the flash-attn APIs (FA4, FA3, FA2) that also compute, for CPU tests.

Each fake has the real function's signature (copied from flash-attn-4 4.0.0b36
`flash_attn/cute/interface.py`, FA3 `hopper/flash_attn_interface.py`, flash-attn 2.8
`flash_attn/flash_attn_interface.py`), so a misspelt keyword is a TypeError as it would be there,
checks the argument rules the real code asserts, records every call, and computes attention with
flash-attn's documented semantics, written here from the docs and kernel source, independently of
the adapters and of references/:

- causal is bottom-right aligned: query i of a request with E queries and L keys sits on key
  diagonal d = i + L - E; a window (left, right) keeps keys d - left .. d + right.
- FA4 resolves (causal, window_size) as its `_resolve_causal_local_window` does: None is
  unbounded, and (-1, 0) is a local window whose left edge is d + 1, i.e. empty. A local window
  has only its own edges: causal=True with (W, None) resolves to (W, 0); causal=False with (W, None)
  (an encoder's left window) leaves the right side unbounded, as FA4's mask does.
- rows the kernel loads but masks still go through P @ V, so a NaN there spreads (0 * NaN).
  FA4 loads whole 128-key tiles from the window's first tile on, and with pages of 128 keys (TMA)
  also the tail rows of a request's last page; a mask_mod turns block skipping off.
- FA4's mask_mod is the verify-tree mask of harness/backends/flash_attn_fa4.py: the fake reads
  the same two tables (first visible prefix key; per (query, draft) visibility). The CuTe DSL
  function itself only runs on a GPU.
- Each library entry is a kernel (harness/backends/graphs.py `kernel`): under the CPU graph emulator a
  call is one opaque node, replayed on its recorded arguments, so it reads cache_seqlens, page_table
  and the tree tables as they are at the replay, and every Python argument as it was at capture.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch

from harness.backends import graphs
from tests.flashinfer_fake import attend

TILE_N = 128  # FA4's key tile at head_dim 128 on sm90 (interface._tile_size_fwd_sm90)


@dataclass
class Recorder:
    """Every call of a fake, as a dict of its arguments by name."""

    calls: list[dict] = field(default_factory=list)

    @property
    def last(self) -> dict:
        return self.calls[-1]


def _band(e, num_keys, lo, hi, causal, left, right):
    """[E, hi - lo] bool for keys lo..hi-1 of a request with `num_keys` keys (bottom-right aligned)."""
    diag = torch.arange(e)[:, None] + (num_keys - e)
    key = torch.arange(lo, hi)[None, :]
    keep = key < num_keys
    if causal:
        keep = keep & (key <= diag)
    if left is not None:
        keep = keep & (key >= diag - left)
    if right is not None:
        keep = keep & (key <= diag + right)
    return keep


def _paged_rows(k_pages, page_table_row, lo, hi):
    """Rows lo..hi-1 of one request through its page table (an index past the table raises)."""
    ps = k_pages.shape[1]
    t = torch.arange(lo, hi)
    return k_pages[page_table_row.long()[t // ps], t % ps]


def _tree_visible(tables, row0, e, num_prefix, lo, hi):
    """The verify-tree mask_mod's answer for queries row0.. of one request, keys lo..hi-1."""
    first, see = (t.cpu() for t in tables)
    key = torch.arange(lo, hi)[None, :]
    rows = torch.arange(row0, row0 + e)[:, None]
    in_prefix = (key < num_prefix) & (key >= first[rows])
    draft = (key - num_prefix).clamp(0, e - 1)
    in_tree = (key >= num_prefix) & (see[rows * e + draft] != 0)
    return in_prefix | in_tree


def resolve_fa4_window(causal, left, right, mask_mod):
    """(causal, local, left, right) as FA4 resolves them."""
    if mask_mod is not None:
        return False, False, left, right
    if left is not None and right is not None and left < 0 and right < 0:
        left = right = None
    if causal:
        right = 0
    if left is not None or right is not None:
        if left is None and right == 0:
            return True, False, None, None
        return False, True, left, right
    return causal, False, None, None


def fa4_module(rec: Recorder) -> types.SimpleNamespace:
    """A stand-in for `flash_attn.cute` whose flash_attn_varlen_func records and computes."""

    @graphs.kernel
    def flash_attn_varlen_func(
        q,
        k,
        v,
        qv=None,
        cu_seqlens_q=None,
        cu_seqlens_k=None,
        max_seqlen_q=None,
        max_seqlen_k=None,
        min_seqlen_k=None,
        seqused_q=None,
        seqused_k=None,
        gather_kv_indices=None,
        page_table=None,
        softmax_scale=None,
        causal=False,
        window_size=(None, None),
        learnable_sink=None,
        softcap=0.0,
        num_splits=1,
        pack_gqa=None,
        deterministic=False,
        score_mod=None,
        score_mod_bwd=None,
        mask_mod=None,
        block_sparse_tensors=None,
        aux_tensors=None,
        aux_scalars=None,
        return_lse=False,
        scheduler_metadata=None,
        seqlen_k_per_split=None,
        disable_scheduler_metadata=False,
        gather_bwd_recompute_p=False,
        gather_bwd_token_chunk=None,
    ):
        args = dict(locals())
        args.pop("rec", None)
        rec.calls.append(args)
        bsz = cu_seqlens_q.shape[0] - 1
        assert cu_seqlens_k is None, "page_table is not supported with cu_seqlens_k"
        assert page_table.dtype == torch.int32 and page_table.stride(-1) == 1
        assert page_table.shape[0] == bsz
        assert k.shape == v.shape and k.dim() == 4, "paged k/v are (num_pages, page_size, heads, dim)"
        assert seqused_k.dtype == torch.int32 and seqused_k.shape == (bsz,)
        assert cu_seqlens_q.dtype == torch.int32
        assert q.shape[1] % k.shape[2] == 0
        assert learnable_sink is None or learnable_sink.shape == (q.shape[1],)
        assert num_splits == 1, "SplitKV not supported on SM 9.0"
        assert isinstance(max_seqlen_q, int) and isinstance(max_seqlen_k, int)
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        is_causal, local, left, right = resolve_fa4_window(causal, *window_size, mask_mod)
        ps = k.shape[1]
        outs, lses = [], []
        for b in range(bsz):
            q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
            e, n = q1 - q0, int(seqused_k[b])
            lo = 0
            if local and left is not None:
                lo = max(0, n - e - left) // TILE_N * TILE_N
            hi = -(-n // ps) * ps if ps == TILE_N else n
            kr = _paged_rows(k, page_table[b], lo, hi)
            vr = _paged_rows(v, page_table[b], lo, hi)
            if mask_mod is not None:
                visible = _tree_visible(aux_tensors, q0, e, n - e, lo, hi) & (torch.arange(lo, hi) < n)
            else:
                visible = _band(e, n, lo, hi, is_causal, left, right)  # local: its own edges only
            o, lse = attend(q[q0:q1].cpu(), kr.cpu(), vr.cpu(), visible, scale, softcap, learnable_sink)
            outs.append(o)
            lses.append(lse)
        out = torch.cat(outs).to(q.device)
        lse = torch.cat(lses, dim=1).to(q.device) if return_lse else None
        return out, lse

    return types.SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func)


def _resolve_minus_one(causal, window_size):
    """FA2/FA3: a negative bound is unbounded; causal fixes the right bound at 0."""
    left, right = window_size
    left = None if left < 0 else left
    right = 0 if causal else (None if right < 0 else right)
    return left, right


def fa3_module(rec: Recorder) -> types.SimpleNamespace:
    """A stand-in for FA3's `flash_attn_interface` (flash_attn_with_kvcache)."""

    @graphs.kernel
    def flash_attn_with_kvcache(
        q,
        k_cache,
        v_cache,
        k=None,
        v=None,
        qv=None,
        rotary_cos=None,
        rotary_sin=None,
        cache_seqlens=None,
        cache_batch_idx=None,
        cache_leftpad=None,
        page_table=None,
        cu_seqlens_q=None,
        cu_seqlens_k_new=None,
        max_seqlen_q=None,
        rotary_seqlens=None,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        attention_chunk=0,
        softcap=0.0,
        rotary_interleaved=True,
        scheduler_metadata=None,
        num_splits=0,
        pack_gqa=None,
        sm_margin=0,
        return_softmax_lse=False,
    ):
        args = dict(locals())
        args.pop("rec", None)
        rec.calls.append(args)
        bsz = cu_seqlens_q.shape[0] - 1
        assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
        assert page_table.dtype == torch.int32 and page_table.shape[0] == bsz
        assert cache_seqlens.dtype == torch.int32 and cache_seqlens.shape == (bsz,)
        assert max_seqlen_q is not None, "max_seqlen_q must be provided if cu_seqlens_q is provided"
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        left, right = _resolve_minus_one(causal, window_size)
        outs, lses = [], []
        for b in range(bsz):
            q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
            n = int(cache_seqlens[b])
            kr = _paged_rows(k_cache, page_table[b], 0, n)
            vr = _paged_rows(v_cache, page_table[b], 0, n)
            visible = _band(q1 - q0, n, 0, n, causal, left, right)
            o, lse = attend(q[q0:q1].cpu(), kr.cpu(), vr.cpu(), visible, scale, softcap, None)
            outs.append(o)
            lses.append(lse)
        out = torch.cat(outs).to(q.device)
        lse = torch.cat(lses, dim=1).to(q.device)
        return (out, lse, None, None) if return_softmax_lse else out

    return types.SimpleNamespace(flash_attn_with_kvcache=flash_attn_with_kvcache)


def fa2_module(rec: Recorder) -> types.SimpleNamespace:
    """A stand-in for FA2's `flash_attn` package (flash_attn_varlen_func over ragged K/V)."""

    @graphs.kernel
    def flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        return_attn_probs=False,
        block_table=None,
    ):
        args = dict(locals())
        args.pop("rec", None)
        rec.calls.append(args)
        assert block_table is None or k.shape[1] % 256 == 0, "paged KV needs page_block_size % 256 == 0"
        assert cu_seqlens_q.dtype == torch.int32 and cu_seqlens_k.dtype == torch.int32
        assert cu_seqlens_q.shape == cu_seqlens_k.shape
        lens_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).tolist()
        assert max(lens_k) <= max_seqlen_k, "max_seqlen_k below a sequence's length"
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        left, right = _resolve_minus_one(causal, window_size)
        outs, lses = [], []
        for b in range(cu_seqlens_q.shape[0] - 1):
            q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
            k0, k1 = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
            visible = _band(q1 - q0, k1 - k0, 0, k1 - k0, causal, left, right)
            o, lse = attend(q[q0:q1].cpu(), k[k0:k1].cpu(), v[k0:k1].cpu(), visible, scale, softcap, None)
            outs.append(o)
            lses.append(lse)
        out = torch.cat(outs).to(q.device)
        lse = torch.cat(lses, dim=1).to(q.device)
        return (out, lse, None) if return_attn_probs else out

    return types.SimpleNamespace(flash_attn_varlen_func=flash_attn_varlen_func)
