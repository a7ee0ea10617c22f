"""vLLM's FlashInfer backend with an fp8_e5m2 KV cache on Hopper: every prefill raises.

Standalone (torch + vLLM's CUDA build, which brings FlashInfer), on a Hopper GPU. On sm90 (and sm100)
vLLM prefills with FP8 queries of the cache's dtype: `FlashInferMetadataBuilder.get_q_data_type`
returns float8_e5m2 for an fp8_e5m2 cache, and the builder plans the prefill wrapper with it. The
forward then quantizes the queries with `FlashInferImpl.maybe_quant_query`, whose
`custom_ops.scaled_fp8_quant` always writes the platform's FP8 dtype, float8_e4m3fn. FlashInfer
refuses the run ("The dtype of q torch.float8_e4m3fn does not match the q_data_type
torch.float8_e5m2"), though the backend lists fp8_e5m2 among its supported_kv_cache_dtypes.

Calls vLLM's own two methods (the builder's with a stand-in holding only the fields it reads) and
then FlashInfer's paged prefill as the builder plans it, for an fp8_e5m2 cache and, as the control,
an fp8_e4m3 one. Exits 1 while e5m2 fails and e4m3 runs, 0 when e5m2 runs, 2 when the control fails
or the GPU is not a Hopper. See docs/known-issues.md.
"""

import sys
from importlib.metadata import version
from types import SimpleNamespace

import flashinfer
import torch
from vllm.v1.attention.backends.flashinfer import FlashInferImpl, FlashInferMetadataBuilder

HQ, HKV, D, E, PAGE = 8, 2, 64, 16, 16


def planned_q_dtype(cache_dtype: str) -> torch.dtype:
    """The builder's prefill query dtype, from its own method (a stand-in holds the fields it reads)."""
    builder = SimpleNamespace(
        vllm_config=SimpleNamespace(
            attention_config=SimpleNamespace(disable_flashinfer_q_quantization=False)
        ),
        model_config=SimpleNamespace(dtype=torch.float16),
        cache_dtype=cache_dtype,
    )
    return FlashInferMetadataBuilder.get_q_data_type(builder, is_prefill=True)


def prefill(cache_dtype: str) -> str:
    """One request of E new tokens through FlashInfer's paged prefill as vLLM plans and feeds it."""
    q_dtype = planned_q_dtype(cache_dtype)
    query = torch.randn(E, HQ, D, dtype=torch.float16, device="cuda")
    query = FlashInferImpl.maybe_quant_query(None, query, q_dtype, torch.ones(1, device="cuda"))
    cache = torch.randn(1, 2, PAGE, HKV, D, dtype=torch.float16, device="cuda").to(q_dtype)
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    wrapper.plan(
        qo_indptr=torch.tensor([0, E], dtype=torch.int32),
        paged_kv_indptr=torch.tensor([0, 1], dtype=torch.int32),
        paged_kv_indices=torch.tensor([0], dtype=torch.int32),
        paged_kv_last_page_len=torch.tensor([E], dtype=torch.int32),
        num_qo_heads=HQ,
        num_kv_heads=HKV,
        head_dim_qk=D,
        page_size=PAGE,
        causal=True,
        q_data_type=q_dtype,
        kv_data_type=q_dtype,
        o_data_type=torch.float16,
    )
    print(f"{cache_dtype}: planned query {q_dtype}, quantized query {query.dtype}")
    try:
        out = wrapper.run(query, cache, q_scale=1.0, k_scale=1.0, v_scale=1.0)
    except (ValueError, RuntimeError) as exc:
        return f"raised {type(exc).__name__}: {exc}"
    return "ran" if bool(out.isfinite().all()) else "ran, with non-finite outputs"


if __name__ == "__main__":
    print(f"vllm {version('vllm')}, flashinfer {flashinfer.__version__}, torch {torch.__version__}")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("CANNOT: vLLM quantizes FlashInfer's prefill queries on Hopper (sm90) and Blackwell only")
        sys.exit(2)
    e5m2, e4m3 = prefill("fp8_e5m2"), prefill("fp8_e4m3")
    print(f"fp8_e5m2 cache: {e5m2}\nfp8_e4m3 cache (control): {e4m3}")
    if e4m3 != "ran":
        print("CANNOT: the e4m3 control fails too, so e5m2's failure shows nothing")
        sys.exit(2)
    if e5m2 != "ran":
        print("BUG: vLLM plans e5m2 queries and feeds FlashInfer e4m3 ones: every e5m2 prefill fails")
        sys.exit(1)
    print("right: the e5m2 prefill runs")
    sys.exit(0)
