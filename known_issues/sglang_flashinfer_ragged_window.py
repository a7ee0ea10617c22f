"""sglang: FlashInferAttnBackend's windowed extend lets new tokens attend to each other past the window.

An extend's new tokens go through the ragged prefill wrapper (unless deterministic inference or
SGLANG_FLASHINFER_USE_PAGED). FlashInfer (0.2 on) compiles a window's mask into the kernel plan()
picks (`use_sliding_window = window_left >= 0`); sglang plans that wrapper without window_left
(FlashInferIndicesUpdaterPrefill.call_begin_forward), then runs it through the deprecated
forward_return_lse() with `window_left=layer.sliding_window_size` after a cached prefix (the kernel
then only skips whole key tiles before the window) and through forward() with no window without one.
The prefix's paged pass is windowed, and right.

It (1) reads sglang's installed flashinfer_backend.py: whether the ragged wrapper's plan and no-prefix
forward() pass window_left; (2) runs one request of 64 new tokens with a window of 7 (a query sees
itself and the 7 keys before it) as sglang drives the ragged wrapper, both ways, and compares each
with the windowed float32 attention. Prints the versions; exits 1 while the plan lacks the window and
the output is wrong, 0 once either is gone. Needs a CUDA GPU, sglang and flashinfer-python.
"""

import ast
import inspect
import sys
from importlib.metadata import version

import flashinfer
import sglang.srt.layers.attention.flashinfer_backend as sglang_flashinfer
import torch

print(f"sglang {version('sglang')}, flashinfer-python {flashinfer.__version__}, torch {torch.__version__}")


# (1) sglang's ragged wrapper calls
def ragged_calls(module_source: str) -> list[tuple[int, str, bool]]:
    """(line, call, whether it passes window_left) of the ragged wrapper's plan and no-prefix forward."""
    found = []
    for node in ast.walk(ast.parse(module_source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        call = ast.unparse(node.func)
        planned = call.endswith(("wrapper_ragged.begin_forward", "wrapper_ragged.plan"))
        if planned or call.endswith("prefill_wrapper_ragged.forward"):
            found.append((node.lineno, call, "window_left" in {kw.arg for kw in node.keywords}))
    return sorted(found)


calls = ragged_calls(inspect.getsource(sglang_flashinfer))
for line, call, windowed in calls:
    print(f"flashinfer_backend.py:{line}: {call}(...) {'with' if windowed else 'WITHOUT'} window_left")
unwindowed = any(not windowed for _, _, windowed in calls)

# (2) the ragged wrapper as sglang drives it
N, HQ, HKV, D, W = 64, 8, 2, 64, 7
SCALE = D**-0.5
dev, dt = "cuda", torch.bfloat16
torch.manual_seed(0)
q = torch.randn(N, HQ, D, device=dev).to(dt)
k = torch.randn(N, HKV, D, device=dev).to(dt)
v = torch.randn(N, HKV, D, device=dev).to(dt)
qo_indptr = torch.tensor([0, N], dtype=torch.int32, device=dev)

wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
    torch.empty(128 << 20, dtype=torch.uint8, device=dev), "NHD", backend="auto"
)
wrapper.begin_forward(qo_indptr, qo_indptr, HQ, HKV, D, q_data_type=dt)
after_prefix, _ = wrapper.forward_return_lse(
    q, k, v, causal=True, sm_scale=SCALE, window_left=W, logits_soft_cap=0.0
)
no_prefix = wrapper.forward(q, k, v, causal=True, sm_scale=SCALE, logits_soft_cap=0.0)

pos = torch.arange(N, device=dev)
visible = (pos[None, :] <= pos[:, None]) & (pos[None, :] >= pos[:, None] - W)
s = torch.einsum("qhd,khd->hqk", q.float(), k.float().repeat_interleave(HQ // HKV, 1)) * SCALE
ref = torch.einsum(
    "hqk,khd->qhd",
    s.masked_fill(~visible, float("-inf")).softmax(-1),
    v.float().repeat_interleave(HQ // HKV, 1),
)
errs = {
    name: (o.float() - ref).abs().max().item()
    for name, o in (("after a prefix", after_prefix), ("no prefix", no_prefix))
}
for name, err in errs.items():
    print(f"ragged pass {name}: max |diff| from the windowed attention {err:.4f}")
if unwindowed and max(errs.values()) > 0.05:
    print("BUG: sglang plans its ragged wrapper without window_left, and new tokens attend past the window")
    sys.exit(1)
print("fixed: the ragged pass keeps the window")
