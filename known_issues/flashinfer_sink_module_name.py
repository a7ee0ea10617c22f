"""FlashInfer's AttentionSink JIT module is named without the KV cache dtype: variants collide.

Standalone (torch + flashinfer only). BatchAttentionWithAttentionSinkWrapper names its JIT module
`batch_prefill_attention_sink_{q dtype}_swa_{window on}_{backend}` (attention/_core.py): the KV cache
dtype and the head dims are not in the name, though they are compile-time parameters of the module.
Three one-token requests over a paged cache (one key each, page size 16), compared
with a float32 reference, each run in a fresh process with its own empty JIT directory:

- alone: one KV dtype per process;
- after another: a process that first runs a bf16 cache, then an FP8 one (and the reverse).

If the kernels are right and only the name collides, every "alone" run is right and a run that
follows another KV dtype in its process is wrong. Also checked alone: NaN in the page slots a
request does not own leaves the output unchanged. Exits 1 while a run is wrong.
"""

import os
import subprocess
import sys
import tempfile

import torch

B, HQ, HKV, D, PAGE = 3, 8, 8, 128, 16
DTYPES = {"bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
# (label, KV dtypes run in order in one process); the last one's error is what the line reports
PLANS = (
    ("alone", ("bf16",)),
    ("alone", ("e4m3",)),
    ("alone", ("e5m2",)),
    ("after bf16", ("bf16", "e4m3")),
    ("after e4m3", ("e4m3", "bf16")),
)


def run(kv_dtype: torch.dtype, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    import flashinfer

    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, HQ, D, generator=gen, device="cuda").bfloat16()
    cache = torch.full((B, 2, PAGE, HKV, D), fill, device="cuda")  # [pages, K/V, slot, head, dim]
    cache[:, :, 0] = torch.randn(B, 2, HKV, D, generator=gen, device="cuda")
    cache = cache.to(kv_dtype)
    sinks = torch.randn(HQ, generator=gen, device="cuda")
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchAttentionWithAttentionSinkWrapper(
        ws, "NHD", backend="fa2", q_data_type=torch.bfloat16, kv_data_type=kv_dtype, head_dim_qk=D,
        head_dim_vo=D)
    i32 = dict(dtype=torch.int32, device="cuda")
    wrapper.plan(torch.arange(B + 1, **i32), torch.arange(B + 1, **i32), torch.arange(B, **i32),
                 torch.ones(B, **i32), HQ, HKV, D, PAGE, causal=True, q_data_type=torch.bfloat16,
                 kv_data_type=kv_dtype)
    scales = {"k_scale": 1.0, "v_scale": 1.0} if kv_dtype != torch.bfloat16 else {}
    out = wrapper.run(q, cache, sinks, **scales).float()
    k, v = cache[:, 0, 0].float(), cache[:, 1, 0].float()  # each request's one key: [B, H, D]
    logit = (q.float() * k).sum(-1) / D**0.5
    p = torch.exp(logit - torch.logaddexp(logit, sinks[None]))
    return out, p[..., None] * v


def child(names: list[str]) -> int:
    """Run each KV dtype in turn in this process; print the last one's error (and, alone, whether
    NaN in unowned slots moves the output). 1 if wrong."""
    for name in names:
        out, ref = run(DTYPES[name], 0.0)
    err = float((out - ref).abs().nan_to_num(float("inf")).max())
    line, bad = f"max err {err:.3g}", err > 0.05
    if len(names) == 1:
        nan_out, _ = run(DTYPES[names[0]], float("nan"))
        moved = bool(nan_out.isnan().any()) or not torch.equal(out, nan_out)
        line += f"; NaN in unowned slots {'CHANGES' if moved else 'leaves'} the output"
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
        jit = tempfile.mkdtemp(prefix="fi-sink-")  # an empty JIT directory: nothing prebuilt shared
        env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": jit, "MAX_JOBS": str(jobs)}
        procs.append((label, names, subprocess.Popen([sys.executable, __file__, *names], env=env,
                                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                     text=True)))
    bad = 0
    for label, names, proc in procs:
        out = proc.communicate()[0].strip().splitlines()
        bad |= proc.returncode != 0
        print(f"{names[-1]:>5} {label:<11}: {out[-1] if out else f'no output (exit {proc.returncode})'}")
    sys.exit(bad)
