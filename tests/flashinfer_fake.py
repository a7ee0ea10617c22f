"""A recording fake of the flashinfer wrapper API (0.7.2.post1, or posing as 0.6.18.post1) that also
computes, for CPU tests.

Installed as `sys.modules["flashinfer"]`, it lets the adapters run end to end on the CPU. Each fake
keeps the real signature (keyword names from flashinfer/prefill.py, decode.py, cascade.py and
attention/_core.py of 0.7.2.post1), checks what the real code checks, records every call, and
computes with FlashInfer's semantics as its kernels implement them (written from the kernel
sources, independently of the adapters and of references/):

- a request's KV is `(pages - 1) * page_size + last_page_len` keys, 0 without pages; only those
  rows are loaded, and loaded rows that the mask hides still pass through P @ V (0 * NaN = NaN).
- causal is bottom-right: query j of E sees key k of L iff k <= L - E + j; `window_left` W keeps
  k >= L - E + j - W, anchored at the end of each wrapper's own KV, in every mask mode.
- a custom mask replaces causality; plan's mask offsets are q_len * ((pages - 1) * page_size +
  last_page_len), unclamped, as `_compute_page_mask_indptr` computes them.
- plan() fixes the compiled variant (window on/off, soft cap on/off); run() uses the wrapper's
  current `_window_left` / `_logits_soft_cap`, which is what the deprecated forward() sets.
- LSE is log2 of the softmax denominator (base 2); merge_state takes and returns base 2.
- plain wrappers accept `sinks=` and drop it; the AttentionSink variant adds the sink to the
  denominator, has no soft cap, and ignores custom masks.
- dtypes: plan's `q_data_type` and `kv_data_type` (None: the query's) must match what run() gets,
  or run() raises ValueError, as `_check_cached_qkv_data_type` does; the paged prefill's output is
  its `o_data_type` (None: the query's). An FP8 cache is read as its
  codes: run's `k_scale` multiplies the softmax scale, `v_scale` the output after the kernel
  (`out *= v_scale`, in the output's dtype).
- releases: `install(monkeypatch, version)` poses as another release. A keyword that release's
  wrappers lack (`KEYWORDS_SINCE`, read from the 0.6.18.post1 and 0.7.x wheels) is a TypeError, as
  an unexpected keyword is there; 0.6.18.post1 computes as 0.7.2.post1 does in every case the fake
  models (the AttentionSink NaN on fully masked KV chunks, fixed in 0.7.0, needs split-KV chunks,
  which the fake does not model).
"""

from __future__ import annotations

import dataclasses
import math
import sys

import torch
from packaging.version import Version

from harness.backends import graphs

__version__ = "0.7.2.post1"
# Keywords of __init__ / plan / run that a release before this one does not take (from the wheels:
# prefill.py __init__ variant_owns_mask and decode.py _plan_impl is_causal from 0.7.0, run's lse_base /
# lse_layout from 0.7.1, plan's uniform_q_len from 0.7.2.post1).
KEYWORDS_SINCE = {
    "variant_owns_mask": "0.7.0",
    "is_causal": "0.7.0",
    "lse_base": "0.7.1",
    "lse_layout": "0.7.1",
    "uniform_q_len": "0.7.2.post1",
}


# The dense attention both library fakes compute with (this one and tests/flash_attn_fakes.py):
# explicit visibility, soft cap, a sink, GQA. Each fake decides what it loads and which keys are
# visible, as its library does; this only does the arithmetic.
def attend(q, k, v, visible, scale, softcap, sink, out_dtype=None):
    """q [E, Hq, D], loaded k/v [n, Hkv, D], visible [E, n] -> out [E, Hq, D], lse [Hq, E] (fp32)."""
    e, hq, d = q.shape
    g = hq // k.shape[1]
    kf = k.float().repeat_interleave(g, dim=1).transpose(0, 1)  # [Hq, n, D]
    vf = v.float().repeat_interleave(g, dim=1).transpose(0, 1)
    s = torch.matmul(q.float().transpose(0, 1), kf.transpose(1, 2)) * scale  # [Hq, E, n]
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = torch.where(visible[None], s, torch.tensor(-math.inf))
    m = s.amax(-1, keepdim=True) if s.shape[-1] else torch.full((hq, e, 1), -math.inf)
    if sink is not None:
        m = torch.maximum(m, sink.float().view(hq, 1, 1))
    base = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.where(visible[None], torch.exp(s - base), torch.zeros_like(s))
    denom = p.sum(-1, keepdim=True)
    if sink is not None:
        denom = denom + torch.exp(sink.float().view(hq, 1, 1) - base)
    out = torch.matmul(p, vf) / torch.where(denom > 0, denom, torch.ones_like(denom))
    lse = torch.where(denom > 0, base + torch.log(denom), torch.tensor(-math.inf)).squeeze(-1)
    return out.transpose(0, 1).to(out_dtype or q.dtype), lse


CALLS: list[tuple[str, dict]] = []  # (what, arguments by name), in call order


def _takes(what: str, keywords) -> None:
    """Raise TypeError, as Python does, for a keyword the posed release's `what` does not take."""
    for k in keywords:
        if k in KEYWORDS_SINCE and Version(__version__) < Version(KEYWORDS_SINCE[k]):
            raise TypeError(f"{what}() got an unexpected keyword argument '{k}' (flashinfer {__version__})")


def calls(what: str) -> list[dict]:
    return [a for w, a in CALLS if w == what]


MODULES: dict[str, tuple] = {}  # JIT module name -> the parameters it was first built with


def reset() -> None:
    CALLS.clear()
    MODULES.clear()


def _attend(q, keys, vals, visible, scale, cap, sink, out_dtype=None):
    """q [E, Hq, D], keys/vals [L, Hkv, D], visible [E, L] -> out [E, Hq, D] (out_dtype, else q's),
    lse2 [E, Hq]: FlashInfer's LSE is base 2."""
    out, lse = attend(q, keys, vals, visible, scale, cap, sink, out_dtype)
    return out, (lse / math.log(2.0)).transpose(0, 1)


def _bottom_right(e, n, causal, window):
    """[E, L] visibility of FlashInfer's causal / window masks, anchored at the end of the KV."""
    diag = torch.arange(e)[:, None] + (n - e)
    key = torch.arange(n)[None, :]
    keep = key <= diag if causal else torch.ones(e, n, dtype=torch.bool)
    if window is not None:
        keep = keep & (key >= diag - window)
    return keep


def _gather_pages(cache, pages, n, layout):
    """The first n rows of the given pages of an NHD [P, ps, H, D] or HND [P, H, ps, D] cache."""
    if not pages:
        shape = (0, cache.shape[2 if layout == "NHD" else 1], cache.shape[-1])
        return cache.new_zeros(shape)
    blocks = cache[torch.tensor(pages)]
    if layout == "HND":
        blocks = blocks.transpose(1, 2)
    return blocks.reshape(-1, blocks.shape[2], blocks.shape[3])[:n]


def _kv_len(npages, last, page_size):
    return 0 if npages == 0 else (npages - 1) * page_size + last


def _dtype(dtype):
    """canonicalize_torch_dtype: a torch dtype or its name."""
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


class _Variant:
    """What plan() compiled and recorded, and the run-time state forward() would overwrite."""

    sink_variant = False

    def _plan_common(self, window_left, logits_soft_cap, sm_scale, head_dim, q_data_type, kv_data_type):
        self._window_left = window_left
        self._logits_soft_cap = logits_soft_cap or 0.0
        self._sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
        self._swa_module = window_left >= 0
        self._cap_module = (logits_soft_cap or 0.0) > 0
        self._q_dtype = _dtype(q_data_type)
        self._kv_dtype = self._q_dtype if kv_data_type is None else _dtype(kv_data_type)

    def _check_dtypes(self, q, k):
        """As the real run() checks q and the cache against what plan() was told."""
        if q.dtype != self._q_dtype:
            raise ValueError(f"The dtype of q {q.dtype} does not match the q_data_type {self._q_dtype}")
        if k.dtype != self._kv_dtype:
            raise ValueError(f"The dtype of k {k.dtype} does not match the kv_data_type {self._kv_dtype}")

    def _scaled(self, k_scale):
        """The softmax scale with k_scale folded in, as run() does before the kernel."""
        return self._sm_scale * (1.0 if k_scale is None else k_scale)

    @staticmethod
    def _v_scaled(out, v_scale):
        """`out *= v_scale` after the kernel, in the output's dtype (skipped for None or 1.0)."""
        if v_scale is None or (isinstance(v_scale, float) and v_scale == 1.0):
            return out
        return out.mul_(v_scale)

    def _start_paged_run(self, name, q, paged_kv_cache, args, rest, window_left, sinks, k_scale, v_scale):
        """What a paged run() does before its kernel: check its keywords, record the call, check q and
        the cache against plan(), resolve the window. Returns (k_cache, v_cache, window)."""
        _takes(name, rest)
        at_run = {"args": args, "window_left": window_left, "sinks": sinks, "k_scale": k_scale}
        CALLS.append((name, {**at_run, "v_scale": v_scale, **rest}))
        k_cache, v_cache = paged_kv_cache
        self._check_dtypes(q, k_cache)
        return k_cache, v_cache, self._run_window(window_left)

    def _run_window(self, window_left):
        window = self._window_left if window_left is None else window_left
        assert window == self._window_left  # as the real run() asserts
        return window if self._swa_module and window >= 0 else None

    def _run_cap(self):
        return self._logits_soft_cap if self._cap_module and not self.sink_variant else 0.0


def _packbits(bits: torch.Tensor) -> torch.Tensor:
    """Flat bool -> uint8, little bit order (flashinfer.quantization.packbits), padded to a byte."""
    bits = bits.flatten().to(torch.uint8).cpu()
    bits = torch.cat([bits, bits.new_zeros(-len(bits) % 8)]).view(-1, 8)
    return (bits << torch.arange(8, dtype=torch.uint8)).sum(1, dtype=torch.uint8)


def _unpackbits(packed: torch.Tensor, n: int) -> torch.Tensor:
    return ((packed.cpu()[:, None] >> torch.arange(8, dtype=torch.uint8)) & 1).flatten()[:n].bool()


@graphs.kernel
def paged_graph_kernel(q, k_cache, v_cache, qo_indptr, indptr, indices, last_page_len, mask, mask_indptr,
                       causal, page_size, window, scale, cap, layout):
    """The paged prefill kernel of a use_cuda_graph wrapper: reads qo_indptr, the page table and the
    packed custom mask (None: no mask, a launch-time choice) from (device) memory when it runs."""
    qo, ptr = [int(x) for x in qo_indptr.tolist()], [int(x) for x in indptr.tolist()]
    last = [int(x) for x in last_page_len.tolist()]
    outs, lses = [], []
    for b in range(len(last)):
        pages = [int(p) for p in indices[ptr[b] : ptr[b + 1]].tolist()]
        n = _kv_len(len(pages), last[b], page_size)
        qb = q[qo[b] : qo[b + 1]]
        kb = _gather_pages(k_cache, pages, n, layout)
        vb = _gather_pages(v_cache, pages, n, layout)
        if mask is None:
            vis = _bottom_right(len(qb), n, causal, window)
        else:
            m0, m1 = int(mask_indptr[b]), int(mask_indptr[b + 1])
            tree = _unpackbits(mask[m0:m1], len(qb) * n).view(len(qb), n)
            vis = tree & _bottom_right(len(qb), n, False, window)
        o, lse = _attend(qb, kb, vb, vis, scale, cap, None)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


class BatchPrefillWithPagedKVCacheWrapper(_Variant):
    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        qo_indptr_buf=None,
        paged_kv_indptr_buf=None,
        paged_kv_indices_buf=None,
        paged_kv_last_page_len_buf=None,
        custom_mask_buf=None,
        mask_indptr_buf=None,
        backend="auto",
        jit_args=None,
        **kw,
    ):
        assert kv_layout in ("NHD", "HND")
        _takes("BatchPrefillWithPagedKVCacheWrapper.__init__", kw)
        # As the library: a module is loaded once per name; a variant whose parameters differ from
        # the loaded one's under the same name runs that one's kernel (here: a wrong output).
        self._wrong_module = False
        if jit_args:
            self._wrong_module = MODULES.setdefault(jit_args[0], tuple(jit_args[1:7])) != tuple(jit_args[1:7])
        self._kv_layout = kv_layout
        graph = {"use_cuda_graph": True} if use_cuda_graph else {}
        CALLS.append(("paged.init", {"kv_layout": kv_layout, "backend": backend, **graph, **kw}))
        self._use_cuda_graph = use_cuda_graph
        if use_cuda_graph:  # as the real constructor checks
            for name, buf in (
                ("qo_indptr_buf", qo_indptr_buf),
                ("paged_kv_indptr_buf", paged_kv_indptr_buf),
                ("paged_kv_indices_buf", paged_kv_indices_buf),
                ("paged_kv_last_page_len_buf", paged_kv_last_page_len_buf),
            ):
                if not torch.is_tensor(buf):
                    raise ValueError(f"{name} should be a torch.Tensor in CUDA graph mode")
            self._fixed_batch_size = len(qo_indptr_buf) - 1
            if len(paged_kv_indptr_buf) != self._fixed_batch_size + 1:
                raise ValueError("The length of paged_kv_indptr_buf should be batch_size + 1.")
            if len(paged_kv_last_page_len_buf) != self._fixed_batch_size:
                raise ValueError("The length of paged_kv_last_page_len_buf should be batch_size.")
        self._bufs = (qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf, paged_kv_last_page_len_buf)
        self._mask_bufs = (custom_mask_buf, mask_indptr_buf)
        self._max_total_num_rows = None

    def _plan_graph_buffers(self, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, mask, lens):
        """What plan() does in CUDA graph mode: the real checks, then copies into the caller's buffers."""
        batch_size = len(qo_indptr) - 1
        rows = int(qo_indptr[-1])
        if self._max_total_num_rows is None:
            self._max_total_num_rows = rows
        elif rows > self._max_total_num_rows:
            raise ValueError(f"The total number of rows in qo_indptr {rows} in cuda graph mode cannot exceed "
                             f"the number of rows set during initialization {self._max_total_num_rows}.")
        if batch_size != self._fixed_batch_size:
            raise ValueError(
                "The batch size should be fixed during the lifecycle of the wrapper in cuda graph mode, the "
                f"runtime batch size {batch_size} mismatches the batch size {self._fixed_batch_size}  set "
                "during initialization."
            )
        qo_buf, indptr_buf, indices_buf, last_buf = self._bufs
        if len(kv_indices) > len(indices_buf):
            raise ValueError("The length of paged_kv_indices exceeds the allocated buffer size.")
        qo_buf.copy_(qo_indptr)
        indptr_buf.copy_(kv_indptr)
        last_buf.copy_(kv_last_page_len)
        indices_buf[: len(kv_indices)].copy_(kv_indices)
        if mask is not None:
            mask_buf, mask_indptr_buf = self._mask_bufs
            if not torch.is_tensor(mask_buf) or not torch.is_tensor(mask_indptr_buf):
                raise ValueError("custom_mask_buf must be initialized with a torch.Tensor in cuda graph mode "
                                 "if we use custom mask in attention computation.")
            qo = [int(x) for x in qo_indptr.tolist()]
            flat, at, packed, offsets = mask.flatten().bool(), 0, [], [0]
            for b, n in enumerate(lens):  # segment_packbits: each request's bits start on a byte
                seg = _packbits(flat[at : at + (qo[b + 1] - qo[b]) * n])
                at += (qo[b + 1] - qo[b]) * n
                packed.append(seg)
                offsets.append(offsets[-1] + len(seg))
            packed = torch.cat(packed)
            if len(packed) > len(mask_buf):
                raise ValueError("the packed custom mask exceeds custom_mask_buf")
            mask_buf[: len(packed)].copy_(packed)
            mask_indptr_buf.copy_(torch.tensor(offsets, dtype=torch.int32))

    def plan(
        self,
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        page_size,
        head_dim_vo=None,
        custom_mask=None,
        packed_custom_mask=None,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        sm_scale=None,
        window_left=-1,
        logits_soft_cap=None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
        kv_data_type=None,
        o_data_type=None,
        non_blocking=True,
        seq_lens=None,
        fixed_split_size=None,
        disable_split_kv=False,
        **rest,
    ) -> None:
        args = dict(locals())
        args.pop("self")
        args.update(args.pop("rest"))
        _takes("BatchPrefillWithPagedKVCacheWrapper.plan", rest)
        CALLS.append(("paged.plan", {**args, "cuda_graph": self._use_cuda_graph}))
        qo = [int(x) for x in qo_indptr.tolist()]
        indptr = [int(x) for x in paged_kv_indptr.tolist()]
        last = [int(x) for x in paged_kv_last_page_len.tolist()]
        assert len(qo) == len(indptr) == len(last) + 1
        self._qo, self._page_size = qo, page_size
        self._pages = [
            [int(p) for p in paged_kv_indices[indptr[b] : indptr[b + 1]].tolist()] for b in range(len(last))
        ]
        self._lens = [_kv_len(len(p), last[b], page_size) for b, p in enumerate(self._pages)]
        self._mask = None
        if custom_mask is not None:
            seg = [
                (qo[b + 1] - qo[b]) * ((len(p) - 1) * page_size + last[b]) for b, p in enumerate(self._pages)
            ]
            if any(s < 0 for s in seg) or sum(seg) != custom_mask.numel():
                raise ValueError(
                    f"custom mask segments {seg} do not fit a mask of {custom_mask.numel()} bits"
                )
            flat = custom_mask.flatten().bool().cpu()
            offs = [0]
            for s in seg:
                offs.append(offs[-1] + s)
            self._mask = [flat[offs[b] : offs[b + 1]].view(qo[b + 1] - qo[b], -1) for b in range(len(seg))]
        self._causal = causal
        self._plan_common(window_left, logits_soft_cap, sm_scale, head_dim_qk, q_data_type, kv_data_type)
        self._o_dtype = None if o_data_type is None else _dtype(o_data_type)
        if self._use_cuda_graph:
            self._plan_graph_buffers(
                qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, custom_mask, self._lens
            )

    def run(
        self,
        q,
        paged_kv_cache,
        *args,
        k_scale=None,
        v_scale=None,
        return_lse=False,
        window_left=None,
        sinks=None,
        **rest,
    ):
        k_cache, v_cache, window = self._start_paged_run(
            "paged.run", q, paged_kv_cache, args, rest, window_left, sinks, k_scale, v_scale
        )
        if self._use_cuda_graph:
            assert not self.sink_variant, "the adapters capture no sink wrapper"
            mask_buf, mask_indptr = self._mask_bufs if self._mask is not None else (None, None)
            out, lse = paged_graph_kernel(
                q, k_cache, v_cache, *self._bufs, mask_buf, mask_indptr, self._causal, self._page_size,
                window, self._scaled(k_scale), self._run_cap(), self._kv_layout,
            )
            out = self._v_scaled(out, v_scale)
            return (out, lse) if return_lse else out
        sink = args[0] if self.sink_variant else None  # plain fa2 wrappers drop `sinks`
        outs, lses = [], []
        for b, pages in enumerate(self._pages):
            qb = q[self._qo[b] : self._qo[b + 1]]
            n = self._lens[b]
            kb = _gather_pages(k_cache, pages, n, self._kv_layout)
            vb = _gather_pages(v_cache, pages, n, self._kv_layout)
            if self._mask is not None and not self.sink_variant:
                vis = self._mask[b] & _bottom_right(len(qb), n, False, window)
            else:
                causal = self._causal and self._mask is None
                vis = _bottom_right(len(qb), n, causal, window)
            o, lse = _attend(qb, kb, vb, vis, self._scaled(k_scale), self._run_cap(), sink, self._o_dtype)
            outs.append(o)
            lses.append(lse)
        out, lse = self._v_scaled(torch.cat(outs), v_scale), torch.cat(lses)
        if self._wrong_module:  # another variant's kernel: the cache read as the wrong dtype
            out = out * 1e4
        return (out, lse) if return_lse else out

    begin_forward = plan

    def forward_return_lse(
        self, q, paged_kv_cache, causal=False, k_scale=None, v_scale=None, window_left=-1,
        logits_soft_cap=None, sm_scale=None, **rest,
    ):
        """The deprecated entry (sglang's): sets the run-time state, then runs what plan() compiled."""
        _takes("BatchPrefillWithPagedKVCacheWrapper.forward_return_lse", rest)
        self._causal, self._window_left = causal, window_left
        self._logits_soft_cap = logits_soft_cap or 0.0
        self._sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale, return_lse=True)


class BatchAttentionWithAttentionSinkWrapper(BatchPrefillWithPagedKVCacheWrapper):
    sink_variant = True

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, backend="auto", **kw):
        dtypes = (kw.get("q_data_type", torch.bfloat16), kw.get("kv_data_type", torch.bfloat16))
        dims = (kw.get("head_dim_qk", 128), kw.get("head_dim_vo", 128))
        swa = kw.get("window_left", -1) >= 0
        # the real name: the q dtype and the window only (known issue flashinfer-sink-module-name)
        uri = f"batch_prefill_attention_sink_{str(dtypes[0]).removeprefix('torch.')}_swa_{swa}_{backend}"
        jit_args = [uri, dtypes[0], dtypes[1], dtypes[0], torch.int32, *dims]
        super().__init__(
            float_workspace_buffer, kv_layout, use_cuda_graph, backend=backend, jit_args=jit_args, **kw
        )
        self._ctor_swa = kw.get("window_left", -1) >= 0
        self._ctor_dtypes = (kw.get("q_data_type", torch.bfloat16), kw.get("kv_data_type", torch.bfloat16))

    def _plan_common(self, window_left, logits_soft_cap, sm_scale, head_dim, q_data_type, kv_data_type):
        super()._plan_common(window_left, logits_soft_cap, sm_scale, head_dim, q_data_type, kv_data_type)
        self._swa_module = self._ctor_swa  # the JIT module was chosen in the constructor
        if (self._q_dtype, self._kv_dtype) != self._ctor_dtypes:
            planned = (self._q_dtype, self._kv_dtype)
            raise ValueError(f"plan's dtypes {planned} are not the JIT module's {self._ctor_dtypes}")


class BatchPrefillWithRaggedKVCacheWrapper(_Variant):
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, backend="auto", **kw):
        _takes("BatchPrefillWithRaggedKVCacheWrapper.__init__", kw)
        CALLS.append(("ragged.init", {"kv_layout": kv_layout, "backend": backend, **kw}))
        self._backend = backend

    def plan(
        self,
        qo_indptr,
        kv_indptr,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        head_dim_vo=None,
        custom_mask=None,
        packed_custom_mask=None,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        window_left=-1,
        logits_soft_cap=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
        kv_data_type=None,
        o_data_type=None,
        non_blocking=True,
        fixed_split_size=None,
        disable_split_kv=False,
        **rest,
    ) -> None:
        args = dict(locals())
        args.pop("self")
        args.update(args.pop("rest"))
        _takes("BatchPrefillWithRaggedKVCacheWrapper.plan", rest)
        CALLS.append(("ragged.plan", args))
        assert custom_mask is None and packed_custom_mask is None, "the adapters pass no ragged mask"
        self._qo = [int(x) for x in qo_indptr.tolist()]
        self._kv = [int(x) for x in kv_indptr.tolist()]
        self._causal = causal
        self._plan_common(window_left, logits_soft_cap, sm_scale, head_dim_qk, q_data_type, kv_data_type)

    def run(self, q, k, v, *args, return_lse=False, **rest):
        _takes("BatchPrefillWithRaggedKVCacheWrapper.run", rest)
        CALLS.append(("ragged.run", {"args": args, **rest}))
        assert not {"k_scale", "v_scale"} & set(rest), "the adapters pass no scales to the ragged pass"
        self._check_dtypes(q, k)
        window = self._run_window(None)
        outs, lses = [], []
        for b in range(len(self._qo) - 1):
            qb = q[self._qo[b] : self._qo[b + 1]]
            kb, vb = k[self._kv[b] : self._kv[b + 1]], v[self._kv[b] : self._kv[b + 1]]
            vis = _bottom_right(len(qb), len(kb), self._causal, window)
            o, lse = _attend(qb, kb, vb, vis, self._sm_scale, self._run_cap(), None)
            outs.append(o)
            lses.append(lse)
        out, lse = torch.cat(outs), torch.cat(lses)
        return (out, lse) if return_lse else out

    begin_forward = plan

    def forward(self, q, k, v, causal=False, window_left=-1, logits_soft_cap=None, sm_scale=None, **rest):
        """The deprecated entry (sglang's): sets the run-time state, then runs what plan() compiled."""
        return self._forward(q, k, v, causal, window_left, logits_soft_cap, sm_scale, rest, return_lse=False)

    def forward_return_lse(
        self, q, k, v, causal=False, window_left=-1, logits_soft_cap=None, sm_scale=None, **rest
    ):
        """forward(), returning the base-2 LSE too."""
        return self._forward(q, k, v, causal, window_left, logits_soft_cap, sm_scale, rest, return_lse=True)

    def _forward(self, q, k, v, causal, window_left, logits_soft_cap, sm_scale, rest, return_lse):
        _takes("BatchPrefillWithRaggedKVCacheWrapper.forward", rest)
        CALLS.append(("ragged.forward", {"causal": causal, "window_left": window_left, **rest}))
        self._causal, self._window_left = causal, window_left
        self._logits_soft_cap = logits_soft_cap or 0.0
        self._sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
        return self.run(q, k, v, return_lse=return_lse)


def _split_attend(q, keys, vals, visible, scale, cap, chunk):
    """_attend over the keys in chunks of `chunk` (0: one pass), each chunk's output rounded to the
    output dtype and merged by its LSE: split-KV, whose rounding follows the split size."""
    n = keys.shape[0]
    if chunk <= 0 or n <= chunk:
        return _attend(q, keys, vals, visible, scale, cap, None)
    spans = [(lo, lo + chunk) for lo in range(0, n, chunk)]
    parts = [attend(q, keys[a:b], vals[a:b], visible[:, a:b], scale, cap, None) for a, b in spans]
    lses = torch.stack([lse for _, lse in parts])  # [splits, Hq, E], natural log
    top = lses.amax(0)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    w = torch.exp(lses - top)  # [splits, Hq, E]
    outs = torch.stack([o.float() for o, _ in parts])  # [splits, E, Hq, D]
    wt = w.transpose(1, 2)[..., None]  # [splits, E, Hq, 1]
    total = wt.sum(0)
    out = (outs * wt).sum(0) / torch.where(total > 0, total, torch.ones_like(total))
    lse = torch.where(w.sum(0) > 0, top + torch.log(w.sum(0)), torch.tensor(-math.inf))
    return out.to(q.dtype), (lse / math.log(2.0)).transpose(0, 1)


@graphs.kernel
def decode_kernel(q, k_cache, v_cache, indptr, indices, last_page_len, plan_info, page_size, q_len, window,
                  scale, cap, layout):
    """The decode kernel: reads the page table and plan()'s split decision from (device) memory, when it
    runs; every other argument was fixed when it was launched (captured)."""
    ptr, last = [int(x) for x in indptr.tolist()], [int(x) for x in last_page_len.tolist()]
    chunk = int(plan_info[0]) * page_size
    outs, lses = [], []
    for b in range(len(last)):
        pages = [int(p) for p in indices[ptr[b] : ptr[b + 1]].tolist()]
        n = _kv_len(len(pages), last[b], page_size)
        qb = q[b * q_len : (b + 1) * q_len]
        kb = _gather_pages(k_cache, pages, n, layout)
        vb = _gather_pages(v_cache, pages, n, layout)
        vis = _bottom_right(q_len, n, q_len > 1, window)
        o, lse = _split_attend(qb, kb, vb, vis, scale, cap, chunk)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


class BatchDecodeWithPagedKVCacheWrapper(_Variant):
    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        use_tensor_cores=False,
        paged_kv_indptr_buffer=None,
        paged_kv_indices_buffer=None,
        paged_kv_last_page_len_buffer=None,
        backend="auto",
        **kw,
    ) -> None:
        self._kv_layout = kv_layout
        self._tc = use_tensor_cores
        CALLS.append(
            (
                "decode.init",
                {
                    "kv_layout": kv_layout,
                    "use_tensor_cores": use_tensor_cores,
                    "backend": backend,
                    "use_cuda_graph": use_cuda_graph,
                },
            )
        )
        if use_cuda_graph:  # as the real constructor checks
            for name, buf in (
                ("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer),
            ):
                if not torch.is_tensor(buf):
                    raise ValueError(f"{name} should be a torch.Tensor in cudagraph mode")
            self._fixed_batch_size = len(paged_kv_last_page_len_buffer)
            if len(paged_kv_indptr_buffer) != self._fixed_batch_size + 1:
                raise ValueError("The size of paged_kv_indptr_buffer should be batch_size + 1")
        else:
            self._fixed_batch_size = 0
        self._use_cuda_graph = use_cuda_graph
        self._indptr_buf = paged_kv_indptr_buffer
        self._indices_buf = paged_kv_indices_buffer
        self._last_buf = paged_kv_last_page_len_buffer
        # plan()'s work partition lives in the wrapper's int workspace (device memory): the kernel
        # reads it when it runs, so a replay sees what the last plan() wrote.
        self._plan_info = torch.zeros(1, dtype=torch.int64, device=float_workspace_buffer.device)

    def plan(
        self,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        *,
        pos_encoding_mode="NONE",
        window_left=-1,
        window_right=0,
        logits_soft_cap=None,
        q_data_type="float16",
        kv_data_type=None,
        o_data_type=None,
        data_type=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        non_blocking=True,
        block_tables=None,
        seq_lens=None,
        fixed_split_size=None,
        disable_split_kv=False,
        q_len_per_req=1,
        **rest,
    ) -> None:
        args = dict(locals())
        args.pop("self")
        args.update(args.pop("rest"))
        _takes("BatchDecodeWithPagedKVCacheWrapper.plan", rest)
        if set(rest) - {"is_causal"}:
            raise TypeError(f"plan() got unexpected keyword arguments {sorted(set(rest) - {'is_causal'})}")
        CALLS.append(("decode.plan", {**args, "tensor_cores": self._tc, "cuda_graph": self._use_cuda_graph}))
        if q_len_per_req > 1 and not self._tc:
            raise ValueError("q_len_per_req > 1 requires tensor-core decode")
        if fixed_split_size is not None and not self._tc:
            raise ValueError("fixed_split_size is only supported by tensor core decode for now.")
        ptr = [int(x) for x in indptr.tolist()]
        last = [int(x) for x in last_page_len.tolist()]
        lens = [_kv_len(ptr[b + 1] - ptr[b], last[b], page_size) for b in range(len(last))]
        if q_len_per_req > 1 and min(lens) < q_len_per_req:
            raise ValueError("q_len_per_req requires kv_len >= q_len_per_req for every request")
        if self._use_cuda_graph:
            if len(last) != self._fixed_batch_size:
                raise ValueError(
                    f"The batch size should be fixed in cudagraph mode, the runtime batch size {len(last)} "
                    f" mismatches the batch size set during initialization {self._fixed_batch_size}"
                )
            if len(indices) > len(self._indices_buf):
                raise ValueError("The size of indices should be less than or equal to the allocated buffer")
            self._indptr_buf.copy_(indptr)
            self._last_buf.copy_(last_page_len)
            self._indices_buf[: len(indices)].copy_(indices)
        else:
            self._indptr_buf = indptr.clone()
            self._indices_buf = indices.clone()
            self._last_buf = last_page_len.clone()
        self._plan_info.fill_(fixed_split_size or 0)
        self._page_size = page_size
        self._q_len = q_len_per_req
        q_data_type = q_data_type if data_type is None else data_type  # the deprecated spelling
        self._plan_common(window_left, logits_soft_cap, sm_scale, head_dim, q_data_type, kv_data_type)

    def run(
        self,
        q,
        paged_kv_cache,
        *args,
        k_scale=None,
        v_scale=None,
        return_lse=False,
        window_left=None,
        sinks=None,
        **rest,
    ):
        k_cache, v_cache, window = self._start_paged_run(
            "decode.run", q, paged_kv_cache, args, rest, window_left, sinks, k_scale, v_scale
        )
        assert q.shape[0] == len(self._last_buf) * self._q_len, "q rows must be batch * q_len_per_req"
        out, lse = decode_kernel(
            q,
            k_cache,
            v_cache,
            self._indptr_buf,
            self._indices_buf,
            self._last_buf,
            self._plan_info,
            self._page_size,
            self._q_len,
            window,
            self._scaled(k_scale),
            self._run_cap(),
            self._kv_layout,
        )
        out = self._v_scaled(out, v_scale)
        return (out, lse) if return_lse else out


def merge_state(v_a, s_a, v_b, s_b):
    """Base-2 LSE in and out, as flashinfer.cascade.merge_state."""
    CALLS.append(("merge_state", {}))
    s_a, s_b = s_a.float(), s_b.float()
    top = torch.maximum(s_a, s_b)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    w_a, w_b = torch.exp2(s_a - top), torch.exp2(s_b - top)
    v = (v_a.float() * w_a[..., None] + v_b.float() * w_b[..., None]) / (w_a + w_b)[..., None]
    return v.to(v_a.dtype), top + torch.log2(w_a + w_b)


def install(monkeypatch, version: str = __version__) -> None:
    """Put this fake at sys.modules['flashinfer'] for one test, posing as `version`, with a small
    workspace, log cleared. Cases run in this process (an isolation worker would import the real
    flashinfer, or none)."""
    from harness.backends import flashinfer_glue

    monkeypatch.setenv("ATTN_HARNESS_ISOLATE", "0")
    monkeypatch.setattr(sys.modules[__name__], "__version__", version)
    monkeypatch.setitem(sys.modules, "flashinfer", sys.modules[__name__])
    monkeypatch.setattr(flashinfer_glue, "WORKSPACE_BYTES", 1024)
    monkeypatch.setattr(flashinfer_glue, "_WORKSPACES", {})
    reset()


def on_cpu(backend):
    """The adapter, allowed to run on the CPU (where only this fake can serve it)."""
    backend.capabilities = dataclasses.replace(backend.capabilities, devices=frozenset({"cpu", "cuda"}))
    return backend
