"""FlashInfer's AttentionSink JIT module is named without the KV cache dtype: variants collide.

Standalone (torch + flashinfer). BatchAttentionWithAttentionSinkWrapper names its module
`batch_prefill_attention_sink_{q dtype}_swa_{window on}_{backend}` (attention/_core.py), without the
KV dtype and head dims it is compiled for. Three one-key requests (page 16) against float32, each
run in a fresh process with an empty JIT directory: alone (one KV dtype), and after another (bf16
then FP8, and the reverse). If only the name collides, each "alone" run is right and a run after
another KV dtype is wrong. Alone, NaN in slots no request owns must leave the output unchanged.
Exits 1 while a run is wrong.
"""

import os
import subprocess
import sys
import tempfile

import torch

B, HQ, HKV, D, PAGE = 3, 8, 8, 128, 16
DTYPES = {"bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
# (label, KV dtypes run in turn in one process; the last is reported)
PLANS = (("alone", ("bf16",)), ("alone", ("e4m3",)), ("alone", ("e5m2",)),
         ("after bf16", ("bf16", "e4m3")), ("after e4m3", ("e4m3", "bf16")))


def run(kv_dtype: torch.dtype, fill: float) -> tuple[torch.Tensor, ...]:
    import flashinfer

    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, HQ, D, generator=gen, device="cuda").bfloat16()
    cache = torch.full((B, 2, PAGE, HKV, D), fill, device="cuda")  # [page, K/V, slot, head, dim]
    cache[:, :, 0] = torch.randn(B, 2, HKV, D, generator=gen, device="cuda")
    cache = cache.to(kv_dtype)
    sinks = torch.randn(HQ, generator=gen, device="cuda")
    wrapper = flashinfer.BatchAttentionWithAttentionSinkWrapper(
        torch.zeros(128 << 20, dtype=torch.uint8, device="cuda"), "NHD", backend="fa2",
        q_data_type=torch.bfloat16, kv_data_type=kv_dtype, head_dim_qk=D, head_dim_vo=D)
    i32 = dict(dtype=torch.int32, device="cuda")
    indptr = torch.arange(B + 1, **i32)
    wrapper.plan(indptr, indptr, torch.arange(B, **i32), torch.ones(B, **i32), HQ, HKV, D, PAGE,
                 causal=True, q_data_type=torch.bfloat16, kv_data_type=kv_dtype)
    scales = {"k_scale": 1.0, "v_scale": 1.0} if kv_dtype != torch.bfloat16 else {}
    out = wrapper.run(q, cache, sinks, **scales).float()
    k, v = cache[:, 0, 0].float(), cache[:, 1, 0].float()  # each request's key: [B, H, D]
    logit = (q.float() * k).sum(-1) / D**0.5
    p = torch.exp(logit - torch.logaddexp(logit, sinks[None]))
    return out, p[..., None] * v


def child(names: list[str]) -> int:
    """Run each KV dtype in turn; print the last one's error (alone: and whether NaN moves it)."""
    for name in names:
        out, ref = run(DTYPES[name], 0.0)
    err = float((out - ref).abs().nan_to_num(float("inf")).max())
    line, bad = f"max err {err:.3g}", err > 0.05
    if len(names) == 1:
        nan_out, _ = run(DTYPES[names[0]], float("nan"))
        moved = bool(nan_out.isnan().any()) or not torch.equal(out, nan_out)
        line += f"; NaN in unowned slots {'CHANGES' if moved else 'leaves'} it"
        bad |= moved
    print(line, flush=True)
    return int(bad)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(child(sys.argv[1:]))
    import flashinfer

    print("flashinfer", flashinfer.__version__, "torch", torch.__version__, torch.cuda.get_device_name())
    jobs = max(1, (os.cpu_count() or 4) // len(PLANS))
    procs = []
    for label, names in PLANS:
        jit = tempfile.mkdtemp(prefix="fi-sink-")  # nothing prebuilt is shared
        env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": jit, "MAX_JOBS": str(jobs)}
        proc = subprocess.Popen([sys.executable, __file__, *names], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        procs.append((label, names, proc))
    bad = 0
    for label, names, proc in procs:
        out = proc.communicate()[0].strip().splitlines()
        bad |= proc.returncode != 0
        print(f"{names[-1]:>5} {label:<11}: {out[-1] if out else f'no output (exit {proc.returncode})'}")
    sys.exit(bad)
