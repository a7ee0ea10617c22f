"""FlashInfer fa2 prefill on rows whose every logit lies far below zero: a wrong output.

Standalone (torch + flashinfer). One causal bf16 request of P cached and E new tokens. Component 0
of every query holds A and of every key C, so every logit gains scale * A * C = L (the offset); key 0
gains G more and carries every row that sees it (the others sit e^-20 or further below), so a row's
right output is key 0's value whatever L is. Prints, per offset and head dimension, the ragged and
paged (page 16) prefill's largest error against float32 attention; exits 1 if any is over 0.05
(bf16 noise: about 0.01). `--backend fa3` runs the Hopper kernel (vLLM's "auto" prefill there),
which has the bug too on 0.6.18.post1.
"""

import argparse
import math
import sys

import flashinfer
import torch

HQ, HKV, P, E, PAGE = 8, 2, 10, 6, 16
OFFSETS = (0.0, -120.0, -1000.0, -10000.0, -20000.0, -30000.0, -60000.0)
BACKEND = "fa2"  # both wrappers' kernel backend: --backend
T = torch.Tensor


def inputs(offset: float, dim: int) -> tuple[T, T, T, float]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(E, HQ, dim, generator=gen, device="cuda")
    k, v = (torch.randn(P + E, HKV, dim, generator=gen, device="cuda") for _ in range(2))
    scale = dim**-0.5
    gap = 20.0 + 6.0 * scale * math.sqrt(dim) + abs(offset) / 16.0
    a = 2.0 ** round(math.log2(max(math.sqrt((abs(offset) + gap) / scale), 1.0)))
    q[:, :, 0] = a
    k[:, :, 0] = offset / (scale * a)
    k[0, :, 0] += gap / (scale * a)
    return q.bfloat16(), k.bfloat16(), v.bfloat16(), scale


def reference(q: T, k: T, v: T, scale: float) -> T:
    kf, vf = (x.float().repeat_interleave(HQ // HKV, 1) for x in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * scale
    visible = torch.arange(P + E, device="cuda")[None, :] <= torch.arange(E, device="cuda")[:, None] + P
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(~visible, float("-inf")).softmax(-1), vf)


def ragged(q: T, k: T, v: T, scale: float) -> T:
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=BACKEND)
    qo, kv = torch.tensor([0, E], dtype=torch.int32), torch.tensor([0, P + E], dtype=torch.int32)
    wrapper.plan(qo, kv, HQ, HKV, q.shape[-1], causal=True, sm_scale=scale, q_data_type=torch.bfloat16)
    return wrapper.run(q, k, v)


def paged(q: T, k: T, v: T, scale: float) -> T:
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=BACKEND)
    cache = torch.zeros(2, 2, PAGE, HKV, q.shape[-1], dtype=torch.bfloat16, device="cuda")
    cache[1, 0, : P + E], cache[1, 1, : P + E] = k, v  # on page 1 of [page, K/V, ...]
    qo, pages, page, last = (torch.tensor(x, dtype=torch.int32) for x in ([0, E], [0, 1], [1], [P + E]))
    wrapper.plan(qo, pages, page, last, HQ, HKV, q.shape[-1], PAGE, causal=True, sm_scale=scale,
                 q_data_type=torch.bfloat16)
    return wrapper.run(q, cache)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("fa2", "fa3"), default="fa2", help="the kernel backend")
    BACKEND = parser.parse_args().backend
    print("flashinfer", flashinfer.__version__, "torch", torch.__version__, torch.cuda.get_device_name())
    print("kernel backend", BACKEND)
    bad = 0
    for dim in (64, 128):
        for offset in OFFSETS:
            q, k, v, scale = inputs(offset, dim)
            ref = reference(q, k, v, scale)
            errs = {
                name: float((run(q, k, v, scale).float() - ref).abs().max())
                for name, run in (("ragged", ragged), ("paged", paged))
            }
            bad += any(e > 0.05 for e in errs.values())
            shown = ", ".join(f"{n} err {e:.3g}" for n, e in errs.items())
            print(f"head_dim={dim:3d} offset={offset:8.0f}: {shown}")
    sys.exit(1 if bad else 0)
