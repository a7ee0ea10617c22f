"""sglang: FlashInferAttnBackend reads a cached FP8 prefix without its scales in an extend.

An extend after a cached prefix runs the ragged path (unless deterministic inference or
SGLANG_FLASHINFER_USE_PAGED): the new tokens through the ragged wrapper, the prefix through a paged
wrapper over the KV cache, merged by LSE. sglang writes an FP8 cache as value / scale
(set_kv_buffer with layer.k_scale / layer.v_scale), and its paged-only extend and its decode give
FlashInfer k_scale / v_scale back. Its ragged path's `prefill_wrapper_paged.forward_return_lse(...)`
gives neither (0.5.17), so the prefix's keys and values are read as their codes: the logits scaled
by 1 / k_scale, the prefix's share of the output by 1 / v_scale. Any model with a calibrated FP8 KV
cache (scales other than 1) gets every extend after a cache hit or a chunk wrong.

This script (1) reads sglang's installed flashinfer_backend.py: whether its paged
forward_return_lse call passes k_scale and v_scale; (2) runs one request, 24 cached FP8 tokens
(k_scale 1, v_scale 0.02) and 4 new ones, through FlashInfer as sglang's ragged path drives it,
the paged pass with and without the scales, and compares each with float32 attention over the
values the cache stands for. Prints the versions; exits 1 while sglang leaves the scales out and
the unscaled output is wrong, 0 once either is gone.
Needs a CUDA GPU, sglang (its flashinfer_backend.py) and flashinfer-python; torch only besides.
"""

import ast
import inspect
import sys
from importlib.metadata import version

import flashinfer
import sglang.srt.layers.attention.flashinfer_backend as sglang_flashinfer
import torch

print(f"sglang {version('sglang')}, flashinfer-python {flashinfer.__version__}, torch {torch.__version__}")


# (1) sglang's paged pass over the prefix: does it pass the cache's scales?
def paged_lse_calls(module_source: str) -> list[tuple[int, bool]]:
    """(line, whether it passes both k_scale and v_scale) of each prefill_wrapper_paged.forward_return_lse."""
    found = []
    for node in ast.walk(ast.parse(module_source)):
        call = ast.unparse(node.func) if isinstance(node, ast.Call) else ""
        if call.endswith("prefill_wrapper_paged.forward_return_lse"):
            found.append((node.lineno, {"k_scale", "v_scale"} <= {kw.arg for kw in node.keywords}))
    return sorted(found)


calls = paged_lse_calls(inspect.getsource(sglang_flashinfer))
for line, scaled in calls:
    print(f"flashinfer_backend.py:{line}: prefill_wrapper_paged.forward_return_lse(...) "
          f"{'with' if scaled else 'WITHOUT'} k_scale / v_scale")
unscaled_call = any(not scaled for _, scaled in calls)

# (2) one request: 24 cached FP8 tokens and 4 new ones, as sglang's ragged path runs it
P, E, HQ, HKV, D = 24, 4, 8, 2, 64
K_SCALE, V_SCALE = 1.0, 0.02
SCALE = D**-0.5
dev, dt, fp8 = "cuda", torch.bfloat16, torch.float8_e4m3fn
torch.manual_seed(0)
q = torch.randn(E, HQ, D, device=dev).to(dt)
k_new = torch.randn(E, HKV, D, device=dev).to(dt)
v_new = torch.randn(E, HKV, D, device=dev).to(dt)
k_codes = (torch.randn(P, HKV, D, device=dev) / K_SCALE).to(fp8)  # what set_kv_buffer writes
v_codes = (torch.randn(P, HKV, D, device=dev) / V_SCALE).to(fp8)
cache = (k_codes.unsqueeze(1), v_codes.unsqueeze(1))  # pages of one token, as sglang's wrappers
workspace = torch.empty(128 << 20, dtype=torch.uint8, device=dev)

ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend="auto")
qo = torch.tensor([0, E], dtype=torch.int32)
ragged.begin_forward(qo, qo, HQ, HKV, D, q_data_type=dt)
o1, s1 = ragged.forward_return_lse(q, k_new, v_new, causal=True, sm_scale=SCALE)

paged = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
paged.begin_forward(
    qo, torch.tensor([0, P], dtype=torch.int32), torch.arange(P, dtype=torch.int32, device=dev),
    torch.ones(1, dtype=torch.int32, device=dev), HQ, HKV, D, 1, q_data_type=dt, kv_data_type=fp8,
)
outs = {}
scaled_kw = {"k_scale": K_SCALE, "v_scale": V_SCALE}
for name, scales in (("as sglang calls it", {}), ("with the scales", scaled_kw)):
    o2, s2 = paged.forward_return_lse(q, cache, causal=False, sm_scale=SCALE, **scales)
    outs[name] = flashinfer.merge_state(o1, s1, o2, s2)[0]

keys = torch.cat([k_codes.float() * K_SCALE, k_new.float()]).repeat_interleave(HQ // HKV, 1)
vals = torch.cat([v_codes.float() * V_SCALE, v_new.float()]).repeat_interleave(HQ // HKV, 1)
visible = torch.arange(P + E, device=dev)[None, :] <= (P + torch.arange(E, device=dev))[:, None]
s = torch.einsum("qhd,khd->hqk", q.float(), keys) * SCALE
ref = torch.einsum("hqk,khd->qhd", s.masked_fill(~visible, float("-inf")).softmax(-1), vals)
errs = {name: (o.float() - ref).abs().max().item() for name, o in outs.items()}
for name, err in errs.items():
    print(f"extend over the FP8 prefix, paged pass {name}: max |diff| from the attention {err:.4f}")
if unscaled_call and errs["as sglang calls it"] > 0.05:
    print("BUG: sglang's ragged-path extend reads the FP8 prefix without k_scale / v_scale")
    sys.exit(1)
print("fixed: the prefix is read with its scales")
