"""FlashInfer prefill with causal=False and window_left=W: some queries get a wrong output.

Standalone (torch + flashinfer only). A request of L tokens attends to itself bidirectionally with a
left window: key k is visible to query q iff k >= q - W (FlashInfer's own rule for window_left with
kv_len == qo_len). Prints, per L, the largest error against a float32 reference and the tokens
whose error passes 0.05 (bf16 noise here is ~0.01). See docs/known-issues.md.
"""

import sys

import flashinfer
import torch

H, D = 8, 128


def run(length: int, window: int, causal: bool) -> tuple[float, list[int]]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(length, H, D, generator=gen, device="cuda").bfloat16() for _ in range(3))
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend="fa2")
    indptr = torch.tensor([0, length], dtype=torch.int32, device="cuda")
    wrapper.plan(indptr, indptr, H, H, D, causal=causal, window_left=window, q_data_type=torch.bfloat16)
    out = wrapper.run(q, k, v).float()
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / D**0.5
    pos = torch.arange(length, device="cuda")
    visible = pos[None, :] >= pos[:, None] - window
    if causal:
        visible &= pos[None, :] <= pos[:, None]
    ref = torch.einsum("hqk,khd->qhd", scores.masked_fill(~visible, float("-inf")).softmax(-1), v.float())
    err = (out - ref).abs().amax(dim=(1, 2))
    return float(err.max()), [int(t) for t in (err > 0.05).nonzero().flatten()]


if __name__ == "__main__":
    print("flashinfer", flashinfer.__version__, "torch", torch.__version__, torch.cuda.get_device_name())
    bad = 0
    for length in (64, 65, 128, 129, 200, 256, 257, 513):
        for window in (1, 8):
            for causal in (False, True):
                worst, tokens = run(length, window, causal)
                bad += bool(tokens)
                print(f"L={length:4d} window_left={window} causal={causal!s:5}: max err {worst:.3g}; "
                      f"tokens over 0.05: {tokens[:10]}{' ...' if len(tokens) > 10 else ''}")
    sys.exit(1 if bad else 0)
