"""Whether an engine itself, called directly on a case, shows its known issue (vLLM's CPU ops and its
FA3 scheduler, sglang).

Each function calls the engine as the entry's script in known_issues/ does, on what the harness
draws for the case, never through the adapter's forward: True when the engine is wrong there, False
when it is right or cannot be imported (then a failure the entry reaches is the adapter's own).
sglang's FA3 plan is built through the adapter's stand-ins (FlashAttentionBackend needs a serving
process's parts); what is judged is sglang's own init_forward_metadata over its pools.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType, SimpleNamespace

import torch

from harness.backends.engines.sglang.engine import declare_torchvision_schemas
from harness.backends.engines.sglang.fa3 import SglangFA3
from harness.backends.engines.vllm.driver import model_len
from harness.backends.graph_glue import capture_sizes, padded_size
from harness.checks import library, library_verdict
from harness.checks.flashinfer_confirm import indptr
from harness.core import pool
from harness.core.batch import Inputs, build_batch, make_inputs
from harness.core.case import Case, Request
from harness.core.graph_case import GraphCase, kv_extents
from harness.core.modes import Mode
from harness.core.vocab import TORCH_DTYPES, TORCH_KV_DTYPES

BLOCK, HEADS, DIM = 32, 1, 32  # the vLLM scripts' one-key requests
VLLM_KV_DTYPES = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}
E4M3_SMALLEST_NORMAL = 2.0**-6


def vllm_isa(dtype: torch.dtype) -> str:
    """The kernel vLLM's CPU attention picks: "amx" for bf16 where the CPU has AMX tiles, else "vec"."""
    return "amx" if dtype == torch.bfloat16 and torch.cpu._is_amx_tile_supported() else "vec"


def vllm_read_back(dtype: torch.dtype, values: torch.Tensor, kv_dtype: str, scale: float) -> torch.Tensor:
    """values [n] -> what vLLM's CPU attention over one cached key, whose V row is all that value
    (written with `scale` by cpu_attn_reshape_and_cache), returns: the value as the cache holds it.
    As known_issues/vllm_cpu_fp8_write_truncates.py reads values back."""
    ops = library("vllm._custom_ops")
    isa = vllm_isa(dtype)
    if isa == "amx":
        torch._C._cpu._init_amx()  # as the scripts (and a serving process's linear layers) do
    n = values.numel()
    cache = torch.zeros(n + 1, HEADS, BLOCK, 2 * DIM, dtype=torch.uint8)  # block 0 unused
    key_cache, value_cache = cache.view(n + 1, HEADS, 2 * BLOCK, DIM).chunk(2, dim=2)
    v = values.view(n, 1, 1).expand(n, HEADS, DIM).to(dtype).contiguous()
    k = torch.zeros_like(v)
    slots = (torch.arange(n) + 1) * BLOCK  # request r's key: first slot of block r + 1
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, isa, scale, scale, kv_dtype)
    q = torch.ones(n, HEADS, DIM, dtype=dtype)
    qo = torch.arange(n + 1, dtype=torch.int32)
    seq = torch.ones(n, dtype=torch.int32)
    meta = ops.cpu_attn_get_scheduler_metadata(
        n, HEADS, HEADS, DIM, seq, dtype, qo, True, -1, isa, False, kv_cache_dtype=kv_dtype
    )
    out = torch.empty_like(q)
    table = (torch.arange(n, dtype=torch.int32) + 1).view(n, 1)
    ops.cpu_attention_with_kv_cache(
        q,
        key_cache,
        value_cache,
        out,
        qo,
        seq,
        DIM**-0.5,
        True,
        None,
        -1,
        table,
        0.0,
        meta,
        None,
        k_scale=scale,
        v_scale=scale,
        kv_cache_dtype=kv_dtype,
    )
    return out[:, 0, 0].float()


def vllm_fp8_write_truncates(case: Case, device: str) -> bool:
    """Known issue vllm-cpu-fp8-write-truncates: the case's K and V (every value the adapter has vLLM
    write: the cached ones and this forward's, in CROSS the encoder's), written and read back through
    vLLM with the case's scales, where some value comes back a code nearer zero than torch's rounding
    to nearest gives."""
    if library("vllm._custom_ops") is None or case.kv_dtype is None:
        return False
    kv_all = make_inputs(case, device).kv_all  # every K/V the adapter writes through vLLM's cache write
    fp8, dtype = getattr(torch, case.kv_dtype), TORCH_DTYPES[case.dtype]
    for new, scale in ((kv_all[0], case.k_scale), (kv_all[1], case.v_scale)):
        values = new.to(dtype).flatten().unique()
        got = vllm_read_back(dtype, values, VLLM_KV_DTYPES[case.kv_dtype], scale)
        nearest = ((values.float() / scale).to(fp8).float() * scale).to(dtype).float()
        if bool((got.abs() < nearest.abs()).any()):
            return True
    return False


def vllm_fp8_e4m3_subnormals(case: Case, device: str) -> bool:
    """Known issue vllm-cpu-fp8-e4m3-bf16-subnormals: the subnormal e4m3 codes the case's cache holds
    (its K/V over their scales), written and read back through vLLM in the case dtype with scale 1,
    where one comes back changed."""
    if library("vllm._custom_ops") is None or case.kv_dtype != "float8_e4m3fn":
        return False
    inputs = make_inputs(case, device)
    codes = torch.cat([inputs.kv_all[0].flatten() / case.k_scale, inputs.kv_all[1].flatten() / case.v_scale])
    codes = codes.to(torch.float8_e4m3fn).float().unique()
    subnormal = codes[(codes != 0) & (codes.abs() < E4M3_SMALLEST_NORMAL)]
    if not subnormal.numel():
        return False
    got = vllm_read_back(TORCH_DTYPES[case.dtype], subnormal, "fp8_e4m3", 1.0)
    return bool((got != subnormal).any())


def sglang_window_zero(case: Case | GraphCase, device: str) -> bool:
    """Known issue sglang-window-zero: sglang's RadixAttention built with the case's window, as
    known_issues/sglang_window_zero.py builds it, reports no window (-1) for the case's window of 0.
    A GraphCase asks of its layer: the graph path's forward reads the same RadixAttention's window."""
    radix = library("sglang.srt.layers.radix_attention")
    if isinstance(case, GraphCase):
        case = case.layer
    if radix is None or case.window_left != 0:
        return False
    layer = radix.RadixAttention(
        case.num_q_heads, case.head_dim, case.scale, case.num_kv_heads, layer_id=0, sliding_window_size=0
    )
    return layer.sliding_window_size != 0


def vllm_fa3_graph_window_metadata(g: GraphCase, device: str) -> bool:
    """Known issue vllm-fa3-graph-window-metadata: FA3's scheduler metadata for some replay of the graph,
    planned as vLLM's FlashAttention builder plans a replay (at the batch's longest sequence), differs in
    size, so in layout, from the metadata its graph was captured with (planned at max_model_len over
    the capture's requests of `queries` keys), as known_issues/vllm_fa3_graph_window_metadata.py plans
    them before its replay goes wrong. False where vLLM's FlashAttention is not FA3 (no plan ahead of the
    kernel) or cannot be imported (vLLM's CPU build, no CUDA extensions)."""
    fa = library("vllm.vllm_flash_attn")
    fa_utils = library("vllm.v1.attention.backends.fa_utils")
    config = library("vllm.config")
    layer = g.layer
    if fa is None or fa_utils is None or config is None or layer.window_left < 0:
        return False
    versions = fa_utils.get_flash_attn_version(), fa_utils.get_flash_attn_version(head_size=layer.head_dim)
    if versions != (3, 3):  # the builder plans ahead on FA3 only; the layer's kernel reads the plan on FA3
        return False
    splits = config.AttentionConfig().flash_attn_max_num_splits_for_cuda_graph
    q = g.queries

    def planned(bs: int, seq_lens: list[int], max_seq_len: int) -> int:
        """The size of FA3's plan of bs requests (the first len(seq_lens) real, the rest padding of
        no query and no key), as the builder's `schedule` asks for it."""
        real = len(seq_lens)
        cu = [min(i, real) * q for i in range(bs + 1)]
        return fa.get_scheduler_metadata(
            batch_size=bs,
            max_seqlen_q=q,
            max_seqlen_k=max_seq_len,
            num_heads_q=layer.num_q_heads,
            num_heads_kv=layer.num_kv_heads,
            headdim=layer.head_dim,
            cache_seqlens=torch.tensor(seq_lens + [0] * (bs - real), dtype=torch.int32, device=device),
            qkv_dtype=TORCH_DTYPES[layer.dtype],
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
            page_size=layer.page_size,
            causal=True,
            window_size=(layer.window_left, 0),
            num_splits=splits,
        ).numel()

    sizes, longest = capture_sizes(g.max_batch), model_len(g.max_kv)
    for c in g.batches:
        seq, bs = kv_extents(c), padded_size(sizes, c.batch_size)
        if planned(bs, seq, max(seq)) != planned(bs, [q] * bs, longest):
            return True
    return False


def vllm_flashinfer_e5m2_query(case: Case, device: str) -> bool:
    """Known issue vllm-flashinfer-e5m2-query: the prefill query dtype vLLM's builder plans for the
    case's cache and dtype here (its get_q_data_type, on a stand-in of the fields it reads) is not the
    one the layer's maybe_quant_query gives, which FlashInfer refuses (as
    known_issues/vllm_flashinfer_e5m2_query.py calls them). False without vLLM's FlashInfer backend."""
    fib = library("vllm.v1.attention.backends.flashinfer")
    if fib is None or case.kv_dtype is None:
        return False
    dt = TORCH_DTYPES[case.dtype]
    builder = SimpleNamespace(
        vllm_config=SimpleNamespace(
            attention_config=SimpleNamespace(disable_flashinfer_q_quantization=False)
        ),
        model_config=SimpleNamespace(dtype=dt),
        cache_dtype=VLLM_KV_DTYPES[case.kv_dtype],
    )
    planned = fib.FlashInferMetadataBuilder.get_q_data_type(builder, is_prefill=True)
    query = torch.zeros(1, case.num_q_heads, case.head_dim, dtype=dt, device=device)
    given = fib.FlashInferImpl.maybe_quant_query(None, query, planned, torch.ones(1, device=device))
    return given.dtype != planned


def sglang_fa3_cross_page_table(case: Case, device: str) -> bool:
    """Known issue sglang-fa3-cross-page-table: sglang's FlashAttentionBackend, built over the case as
    sglang_fa3 builds it and planned by its own init_forward_metadata, gives FA3 an encoder page table
    that does not address the case's encoder keys: for some request r and encoder token j, the slot
    FA3 reads, page_table[r, j // page_size] * page_size + j % page_size, is not r's slot of j. As
    known_issues/sglang_fa3_cross_page_table.py checks its plan; the kernel is not run."""
    if case.mode != Mode.CROSS:
        return False
    declare_torchvision_schemas()  # what sglang's import needs on a CPU torch, as the adapter declares
    if library("sglang.srt.layers.attention.flashattention_backend") is None:
        return False
    batch = build_batch(case, make_inputs(case, device), device)
    adapter = SglangFA3()
    with adapter.serving_context(batch):
        backend, _, _ = adapter.planned(batch)
    table = backend.forward_metadata.encoder_page_table.cpu().long()
    slots, ps = batch.req_to_token.cpu().long(), case.page_size
    for r, req in enumerate(case.requests):
        j = torch.arange(req.encoder_len)
        if not torch.equal(table[r, j // ps] * ps + j % ps, slots[r, : req.encoder_len]):
            return True
    return False


def sglang_fa3_cross_text_table(case: Case, device: str) -> bool:
    """Known issue sglang-fa3-cross-text-table: sglang's FlashAttentionBackend, built over the case as
    sglang_fa3 builds it, raises an IndexError in its own init_forward_metadata, gathering the text
    page table past the ReqToTokenPool's row. Planned on the CPU whatever `device` is: the plan is
    metadata only, and on CUDA the gather is a device-side assert that would leave the asking worker's
    CUDA context unusable. As known_issues/sglang_fa3_cross_text_table.py plans it."""
    if case.mode != Mode.CROSS:
        return False
    declare_torchvision_schemas()  # what sglang's import needs on a CPU torch, as the adapter declares
    fab = library("sglang.srt.layers.attention.flashattention_backend")
    if fab is None:
        return False
    batch = build_batch(case, make_inputs(case, "cpu"), "cpu")
    adapter = SglangFA3()
    try:
        with adapter.serving_context(batch):
            adapter.planned(batch)
    except IndexError as e:
        return raised_in(e, fab.__file__, "init_forward_metadata")
    return False


def raised_in(e: BaseException, file: str, function: str) -> bool:
    """Whether the innermost frame of `file` that `e` passed through is `function`'s: the error came
    from that function's own code (a torch operation it called), not from the caller's."""
    tb, last = e.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == file:
            last = tb.tb_frame.f_code.co_name
        tb = tb.tb_next
    return last == function


def vllm_one_key(
    ops: object,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    isa: str,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query [1, heads, dim] over one key and value of that shape, cached in block 1 through vLLM's
    CPU cache write and attended by its CPU kernel (scale 1, causal), as the vllm_cpu scripts call them."""
    dt, (_, heads, dim) = q.dtype, q.shape
    cache = torch.zeros(2, heads, BLOCK, 2 * dim, dtype=dt)
    key_cache, value_cache = cache.view(2, heads, 2 * BLOCK, dim).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, torch.tensor([BLOCK]), isa)
    qo, seq = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    meta = ops.cpu_attn_get_scheduler_metadata(1, heads, heads, dim, seq, dt, qo, True, -1, isa, False)
    table, out = torch.tensor([[1]], dtype=torch.int32), torch.empty_like(q)
    ops.cpu_attention_with_kv_cache(
        q, key_cache, value_cache, out, qo, seq, 1.0, True, None, -1, table, softcap, meta, sinks
    )
    return out


def vllm_sinks_bf16_only(case: Case, device: str) -> bool:
    """Known issue vllm-cpu-sinks-bf16-only: vLLM's CPU kernel, given a one-key attention in the case's
    dtype with sinks in that dtype (as a model holds them), raises where it reads sinks as bf16 only,
    as known_issues/vllm_cpu_sinks_bf16_only.py calls it."""
    ops = library("vllm._custom_ops")
    if ops is None or not case.sinks:
        return False
    dt, heads = TORCH_DTYPES[case.dtype], 4
    kv = torch.randn(1, heads, DIM, generator=torch.Generator().manual_seed(case.seed)).to(dt)
    try:
        vllm_one_key(ops, kv, kv, kv, "vec", sinks=torch.zeros(heads, dtype=dt))
    except RuntimeError as e:
        return "BFloat16" in str(e)
    return False


def vllm_softcap_nan(case: Case, device: str) -> bool:
    """Known issue vllm-cpu-softcap-nan: vLLM's CPU kernel, one query over one cached key whose logit is
    the case's logit offset, under the case's soft cap, returns NaN (as
    known_issues/vllm_cpu_softcap_nan.py calls it)."""
    ops = library("vllm._custom_ops")
    if ops is None or not case.soft_cap or case.logits == "plain":
        return False
    dt, heads = TORCH_DTYPES[case.dtype], 4
    isa = vllm_isa(dt)
    if isa == "amx":
        torch._C._cpu._init_amx()
    k, v, q = (
        torch.zeros(1, heads, DIM, dtype=dt),
        torch.ones(1, heads, DIM, dtype=dt),
        torch.zeros(1, heads, DIM, dtype=dt),
    )
    k[..., 0], q[..., 0] = 1.0, case.logit_offset
    return bool(vllm_one_key(ops, q, k, v, isa, softcap=case.soft_cap).isnan().any())


# The kernel backend of sglang's FlashInfer wrappers (0.5.17 .. 0.5.23, off sm100): "auto" for the
# ragged prefill (FA3's module on Hopper), "fa2" for decode and the paged (verify) wrappers.
SGLANG_KERNEL_BACKEND = {Mode.DECODE: "fa2", Mode.TARGET_VERIFY: "fa2"}
SGLANG_RAGGED_BACKEND = "auto"
SGLANG_WORKSPACE_BYTES = 128 << 20


def sglang_ragged_forward(
    fi: ModuleType,
    case: Case,
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    lens: tuple[list[int], list[int]],
    plan_window: int,
    forward_window: int | None,
    causal: bool,
) -> torch.Tensor:
    """FlashInfer's ragged prefill as sglang's FlashInferAttnBackend drives its wrappers: planned with no
    soft cap (FlashInferIndicesUpdaterPrefill.call_begin_forward: begin_forward(qo_indptr, kv_indptr,
    heads, head_dim, q_data_type)) and `plan_window`, then run through the deprecated forward() with
    the layer's soft cap and scale and `forward_window` (None: forward() given no window_left, as
    forward_extend's no-prefix call is); on the kernel backend sglang's wrapper for the case's mode
    has (SGLANG_KERNEL_BACKEND)."""
    dt = TORCH_DTYPES[case.dtype]
    wrapper = fi.BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(SGLANG_WORKSPACE_BYTES, dtype=torch.uint8, device=qkv[0].device),
        "NHD",
        backend=SGLANG_KERNEL_BACKEND.get(case.mode, SGLANG_RAGGED_BACKEND),
    )
    wrapper.begin_forward(
        indptr(lens[0]),
        indptr(lens[1]),
        case.num_q_heads,
        case.num_kv_heads,
        case.head_dim,
        window_left=plan_window,
        q_data_type=dt,
    )
    window = {} if forward_window is None else {"window_left": forward_window}
    return wrapper.forward(
        *(t.to(dt) for t in qkv), causal=causal, sm_scale=case.scale, logits_soft_cap=case.soft_cap, **window
    )


def model_dtype_twin(case: Case, inputs: Inputs) -> tuple[Case, Inputs]:
    """The case without its FP8 cache, over the same values in the case dtype: where the confirmations
    below judge, the bugs being the masks' and the cap's, not the cache's (sglang's ragged pass attends
    over the new K/V in the model's dtype)."""
    if case.kv_dtype is None:
        return case, inputs
    dt = TORCH_DTYPES[case.dtype]
    twin = case.replace(kv_dtype=None, k_scale=1.0, v_scale=1.0)
    return twin, dataclasses.replace(inputs, kv_all=inputs.kv_all.to(dt))


def sglang_flashinfer_soft_cap(case: Case, device: str) -> bool:
    """Known issue sglang-flashinfer-soft-cap: FlashInfer called as sglang's FlashInferAttnBackend calls
    it for a soft-capped layer (the cap given to forward() only, never to plan(), which alone picks the
    kernel that applies it), over each request's queries and every key (causal, non-causal for an
    encoder layer) with the case's window planned in, so that only the cap is sglang's: wrong on
    the case, judged as the numeric check judges."""
    fi = library("flashinfer")
    if fi is None or not case.soft_cap:
        return False
    case, inputs = model_dtype_twin(case, make_inputs(case, device))
    qkv = (inputs.q_all, inputs.kv_all[0], inputs.kv_all[1])
    lens = (list(inputs.q_lens), list(inputs.kv_lens))
    causal = case.mode != Mode.ENCODER_ONLY
    out = sglang_ragged_forward(fi, case, qkv, lens, case.window_left, case.window_left, causal)
    return not library_verdict(case, inputs, out, device).passed


def sglang_flashinfer_soft_cap_replay(g: GraphCase, device: str) -> bool:
    """Known issue sglang-flashinfer-soft-cap under a CUDA graph (its captured wrappers are planned
    without the cap too, fast_decode_plan included): the eager confirmation on any replayed batch."""
    return any(sglang_flashinfer_soft_cap(c, device) for c in g.batches)


def new_tokens_case(case: Case, inputs: Inputs) -> tuple[Case, Inputs]:
    """The case cut to its new tokens, an extend of each request's extend_len queries over its own last
    extend_len keys (no prefix), with the case's own drawn values: what sglang's ragged pass attends
    over."""
    ext = [r.extend_len for r in case.requests]
    sub = case.replace(mode=Mode.EXTEND, requests=tuple(Request(0, e) for e in ext))
    q = list(inputs.q)
    k = [kr[kr.shape[0] - e :] for kr, e in zip(inputs.k, ext)]
    v = [vr[vr.shape[0] - e :] for vr, e in zip(inputs.v, ext)]
    return sub, Inputs.from_requests(q, k, v, None)


def sglang_flashinfer_ragged_window(case: Case, device: str) -> bool:
    """Known issue sglang-flashinfer-ragged-window: the ragged pass of sglang's windowed extend over the
    case's new tokens, as FlashInferAttnBackend drives it (planned with no window_left; run with the
    layer's window when the batch has a cached prefix, with none when it has not), judged against the
    new tokens' own windowed attention: wrong there. The cached prefix, which sglang attends through
    its paged wrapper with a window mask of its own, is left out. A soft cap is dropped here as sglang
    drops it; where it matters, sglang-flashinfer-soft-cap, listed first, is the entry that excuses."""
    fi = library("flashinfer")
    if fi is None or case.window_left < 0:
        return False
    sub, inputs = new_tokens_case(*model_dtype_twin(case, make_inputs(case, device)))
    qkv = (inputs.q_all, inputs.kv_all[0], inputs.kv_all[1])
    lens = (list(inputs.q_lens), list(inputs.kv_lens))
    with_prefix = any(r.prefix_len for r in case.requests)
    out = sglang_ragged_forward(fi, sub, qkv, lens, -1, case.window_left if with_prefix else None, True)
    return not library_verdict(sub, inputs, out, device).passed


def sglang_extend_over_fp8_prefix(fi: ModuleType, case: Case, inputs: Inputs, scaled: bool) -> torch.Tensor:
    """An extend as sglang's FlashInferAttnBackend runs one off the deterministic path, with a cached
    FP8 prefix: the ragged pass over each request's new K/V (in the model dtype, before the cache
    write) merged by LSE with a paged pass over its cached prefix (pages of one token, the codes
    sglang's set_kv_buffer writes: value / scale), the paged pass given the cache's k_scale and
    v_scale when `scaled` and none when not. The window and soft cap are planned into both passes, so
    that only the scales are sglang's."""
    dt, fp8 = TORCH_DTYPES[case.dtype], TORCH_KV_DTYPES[case.kv_dtype]
    device = inputs.q_all.device
    new = new_tokens_case(case, inputs)[1]
    prefix = [r.prefix_len for r in case.requests]
    plan = {"window_left": case.window_left, "logits_soft_cap": float(case.soft_cap), "q_data_type": dt}
    run = {"window_left": case.window_left, "logits_soft_cap": float(case.soft_cap), "sm_scale": case.scale}
    workspace = torch.empty(SGLANG_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    ragged = fi.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=SGLANG_RAGGED_BACKEND)
    q_lens = list(new.q_lens)
    ragged.begin_forward(
        indptr(q_lens), indptr(q_lens), case.num_q_heads, case.num_kv_heads, case.head_dim, **plan
    )
    o1, s1 = ragged.forward_return_lse(
        new.q_all, new.kv_all[0].to(dt), new.kv_all[1].to(dt), causal=True, **run
    )
    codes = [
        torch.cat([pool.quantize(kr[:p], fp8, s) for kr, p in zip(side, prefix)])
        for side, s in ((inputs.k, case.k_scale), (inputs.v, case.v_scale))
    ]
    cache = tuple(c.unsqueeze(1) for c in codes)  # [prefix tokens, page of 1, Hkv, D]
    paged = fi.BatchPrefillWithPagedKVCacheWrapper(
        workspace, "NHD", backend=SGLANG_KERNEL_BACKEND[Mode.DECODE]
    )
    pages = torch.arange(sum(prefix), dtype=torch.int32, device=device)
    last = torch.ones(case.batch_size, dtype=torch.int32, device=device)
    paged.begin_forward(
        indptr(q_lens),
        indptr(prefix),
        pages,
        last,
        case.num_q_heads,
        case.num_kv_heads,
        case.head_dim,
        1,
        kv_data_type=fp8,
        **plan,
    )
    scales = {"k_scale": case.k_scale, "v_scale": case.v_scale} if scaled else {}
    o2, s2 = paged.forward_return_lse(new.q_all, cache, causal=False, **run, **scales)
    return fi.merge_state(o1, s1, o2, s2)[0]


def sglang_flashinfer_fp8_prefix_scales(case: Case, device: str) -> bool:
    """Known issue sglang-flashinfer-fp8-prefix-scales: an extend over a cached FP8 prefix as sglang's
    FlashInferAttnBackend runs it, its paged pass over the prefix given no k_scale / v_scale: wrong on
    the case, where the same passes given the scales are right (so that the scales alone decide)."""
    fi = library("flashinfer")
    if fi is None or case.kv_dtype is None or not any(r.prefix_len for r in case.requests):
        return False
    inputs = make_inputs(case, device)
    unscaled = sglang_extend_over_fp8_prefix(fi, case, inputs, scaled=False)
    scaled = sglang_extend_over_fp8_prefix(fi, case, inputs, scaled=True)
    return (
        not library_verdict(case, inputs, unscaled, device).passed
        and library_verdict(case, inputs, scaled, device).passed
    )
