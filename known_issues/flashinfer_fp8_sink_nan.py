"""FlashInfer's AttentionSink wrapper over an FP8 paged cache: unowned page slots read, wrong outputs.

Standalone (torch + flashinfer only). Three one-token requests, page size 16: each request's page
holds its one key in slot 0 and 15 slots it does not own. Those slots are filled with zeros, then
with NaN (an engine's free memory holds whatever was there before). A kernel that masks by kv_len
gives the same output both times; one that reads the unowned slots and multiplies them by a zero
probability gives NaN. The same run with a bf16 cache is shown for comparison. Then, with zeros in
the unowned slots, each output is compared with a float32 reference over the cache's values (sink
logits in the softmax denominator), with no window and with window_left=0. docs/known-issues.md.
"""

import sys

import flashinfer
import torch

B, HQ, HKV, D, PAGE = 3, 8, 8, 128, 16


def run(kv_dtype: torch.dtype, fill: float, window: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, HQ, D, generator=gen, device="cuda").bfloat16()
    cache = torch.full((B, 2, PAGE, HKV, D), fill, device="cuda")  # [pages, K/V, slot, head, dim]
    cache[:, :, 0] = torch.randn(B, 2, HKV, D, generator=gen, device="cuda")
    cache = cache.to(kv_dtype)
    sinks = torch.randn(HQ, generator=gen, device="cuda")
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchAttentionWithAttentionSinkWrapper(
        ws, "NHD", backend="fa2", q_data_type=torch.bfloat16, kv_data_type=kv_dtype, head_dim_qk=D,
        head_dim_vo=D,
        window_left=window,
    )
    i32 = dict(dtype=torch.int32, device="cuda")
    wrapper.plan(
        torch.arange(B + 1, **i32), torch.arange(B + 1, **i32), torch.arange(B, **i32),
        torch.ones(B, **i32), HQ, HKV, D, PAGE,
        causal=True, q_data_type=torch.bfloat16, kv_data_type=kv_dtype,
    )
    scales = {"k_scale": 1.0, "v_scale": 1.0} if kv_dtype != torch.bfloat16 else {}
    out = wrapper.run(q, cache, sinks, **scales).float()
    k, v = cache[:, 0, 0].float(), cache[:, 1, 0].float()  # each request's one key: [B, H, D]
    logit = (q.float() * k).sum(-1) / D**0.5  # [B, H]: one key, visible whatever the window
    p = torch.exp(logit - torch.logaddexp(logit, sinks[None]))
    return out, p[..., None] * v


if __name__ == "__main__":
    print("flashinfer", flashinfer.__version__, "torch", torch.__version__, torch.cuda.get_device_name())
    bad = False
    for kv in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        (zero, _), (nan, _) = run(kv, 0.0), run(kv, float("nan"))
        moved = bool(nan.isnan().any()) or not torch.equal(zero, nan)
        bad |= moved
        print(f"kv {kv}: NaN outputs with NaN in unowned slots: {int(nan.isnan().sum())} of {nan.numel()}; "
              f"output {'CHANGES' if moved else 'unchanged'} when unowned slots change")
        for window in (-1, 0):
            out, ref = run(kv, 0.0, window)
            err = float((out - ref).abs().max())
            bad |= err > 0.05
            print(f"kv {kv}, window_left={window}, zeros in unowned slots: max err vs reference {err:.3g}")
    sys.exit(1 if bad else 0)
