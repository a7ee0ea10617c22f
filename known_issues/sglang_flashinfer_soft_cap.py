"""sglang: FlashInferAttnBackend runs a soft-capped layer (gemma-2, grok) uncapped.

FlashInfer picks the soft-capping kernel when a wrapper is planned (`plan()` / `begin_forward()`);
the deprecated `forward()` only stores the value, which the uncapped kernel never reads. sglang's
indices updaters plan every wrapper without `logits_soft_cap`, and forward_decode / forward_extend
pass `layer.logit_cap` to forward() only.

The script (1) lists each plan / begin_forward call in sglang's installed flashinfer_backend.py and
whether it passes `logits_soft_cap`; (2) runs one decode as sglang does (fa2 decode wrapper, tensor
cores as should_use_tensor_core picks for 8 over 2 heads, begin_forward with pages of 1 and no cap,
forward with the cap) against the capped and uncapped float32 attention. Exits 1 while sglang
plans without the cap and the decode is uncapped, 0 once either is gone. Needs a GPU.
"""

import ast
import inspect
import sys
from importlib.metadata import version

import flashinfer
import sglang.srt.layers.attention.flashinfer_backend as sglang_flashinfer
import torch

print(f"sglang {version('sglang')}, flashinfer-python {flashinfer.__version__}, torch {torch.__version__}")


# (1) sglang's plan call sites
def wrapper_plans(module_source: str) -> list[tuple[int, bool]]:
    """(line, passes logits_soft_cap) of each wrapper plan() / begin_forward() call (not the compiled
    module's); a call given **kwargs passes it if its function sets a "logits_soft_cap" key."""
    found = []
    for fn in ast.walk(ast.parse(module_source)):
        if not isinstance(fn, ast.FunctionDef):
            continue
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            module_call = ast.unparse(node.func.value).endswith("_cached_module")
            if node.func.attr not in ("plan", "begin_forward") or module_call:
                continue
            names = {kw.arg for kw in node.keywords}
            spread = None in names and '"logits_soft_cap"' in ast.unparse(fn)
            found.append((node.lineno, "logits_soft_cap" in names or spread))
    return sorted(set(found))


plans = wrapper_plans(inspect.getsource(sglang_flashinfer))
for line, capped in plans:
    print(f"flashinfer_backend.py:{line}: planned {'with' if capped else 'WITHOUT'} logits_soft_cap")
planned_without_cap = any(not capped for _, capped in plans)

# (2) one decode as sglang runs it: 3 requests of 63 keys, fp16, cap 30, queries of amplitude 30
B, L, HQ, HKV, D, CAP = 3, 63, 8, 2, 64, 30.0
SCALE = D**-0.5
dev, dt = "cuda", torch.float16
torch.manual_seed(0)
q = (torch.randn(B, HQ, D, device=dev) * 30).to(dt)
k, v = (torch.randn(B * L, 1, HKV, D, device=dev).to(dt) for _ in "kv")  # pages of 1, as sglang plans
indptr = torch.arange(0, (B + 1) * L, L, dtype=torch.int32, device=dev)
indices = torch.arange(B * L, dtype=torch.int32, device=dev)
last = torch.ones(B, dtype=torch.int32, device=dev)

wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
    torch.empty(128 << 20, dtype=torch.uint8, device=dev), "NHD", backend="fa2", use_tensor_cores=True
)
wrapper.begin_forward(indptr, indices, last, HQ, HKV, D, 1, data_type=dt, q_data_type=dt, non_blocking=True)
out = wrapper.forward(q, (k, v), sm_scale=SCALE, logits_soft_cap=CAP).float()


def attention(cap: float) -> torch.Tensor:
    kf, vf = (x.float().view(B, L, HKV, D).repeat_interleave(HQ // HKV, 2) for x in (k, v))
    s = torch.einsum("bhd,blhd->bhl", q.float(), kf) * SCALE
    if cap:
        s = cap * torch.tanh(s / cap)
    return torch.einsum("bhl,blhd->bhd", s.softmax(-1), vf)


err_capped, err_uncapped = ((out - attention(cap)).abs().max().item() for cap in (CAP, 0.0))
print(f"decode vs capped: max |diff| {err_capped:.4f}; vs uncapped: {err_uncapped:.4f}")
if planned_without_cap and err_capped > 0.05 and err_uncapped < err_capped:
    print("BUG: sglang plans FlashInfer without logits_soft_cap and the cap given to forward() is dropped")
    sys.exit(1)
print("fixed: the cap reaches the kernel")
