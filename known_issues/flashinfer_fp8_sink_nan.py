"""FlashInfer's AttentionSink wrapper over an FP8 (e4m3) paged cache reads page slots past kv_len.

Standalone (torch + flashinfer only). Three one-token requests, page size 16: each request's page
holds its one key in slot 0 and 15 slots it does not own. Those slots are filled with zeros, then
with NaN (an engine's free memory holds whatever was there before). A kernel that masks by kv_len
gives the same output both times; one that reads the unowned slots and multiplies them by a zero
probability gives NaN. The same run with a bf16 cache is shown for comparison. docs/known-issues.md.
"""

import sys

import flashinfer
import torch

B, HQ, HKV, D, PAGE = 3, 8, 8, 128, 16


def run(kv_dtype: torch.dtype, fill: float) -> torch.Tensor:
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
        window_left=-1,
    )
    i32 = dict(dtype=torch.int32, device="cuda")
    wrapper.plan(
        torch.arange(B + 1, **i32), torch.arange(B + 1, **i32), torch.arange(B, **i32),
        torch.ones(B, **i32), HQ, HKV, D, PAGE,
        causal=True, q_data_type=torch.bfloat16, kv_data_type=kv_dtype,
    )
    scales = {"k_scale": 1.0, "v_scale": 1.0} if kv_dtype != torch.bfloat16 else {}
    return wrapper.run(q, cache, sinks, **scales).float()


if __name__ == "__main__":
    print("flashinfer", flashinfer.__version__, "torch", torch.__version__, torch.cuda.get_device_name())
    bad = False
    for kv in (torch.bfloat16, torch.float8_e4m3fn):
        zero, nan = run(kv, 0.0), run(kv, float("nan"))
        moved = bool(nan.isnan().any()) or not torch.equal(zero, nan)
        bad |= moved
        print(f"kv {kv}: NaN outputs with NaN in unowned slots: {int(nan.isnan().sum())} of {nan.numel()}; "
              f"output {'CHANGES' if moved else 'unchanged'} when unowned slots change")
    sys.exit(1 if bad else 0)
