"""FlashInfer: a graph decode wrapper with fixed_split_size is wrong, or faults, on an unsplit plan.

Standalone (torch + flashinfer only). An engine in deterministic mode pins the split-KV chunk
(fixed_split_size, as sglang's 2048-key decode tile) and runs decode / verify under CUDA graphs: a
BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True, use_cuda_graph=True) over fixed indptr /
indices / last-page buffers is planned on a dummy batch, captured, then planned on each real batch
(padded to the captured size with one-page requests) and replayed. With fixed_split_size the plan
splits only a request longer than one chunk, so a plan can be unsplit: a replay of short requests
after a capture at long ones (cases A, B), or a window shorter than the chunk (case C).

The plan writes the split bookkeeping (merge_indptr; in 0.6.18.post1 also block_valid_mask, which
stops the padding CTAs of a graph launch) only when that plan splits (scheduler.cuh PrefillPlan),
and the allocations after it move, while the captured launch keeps the capture's pointers. Measured
on an H100: 0.6.18.post1 gives wrong outputs in A and B (err 3.42, 4.69) and faults in C;
0.7.2.post1 faults (illegal memory access) in A, B and C. The int workspaces are filled with 0x5A
bytes first, as memory the caching allocators hand back holds old data. Case D (a replay that
splits too) is right on both (err 0.000467). Each case runs in its own process with CUDA_LAUNCH_BLOCKING=1
(a CUDA fault poisons its context) and prints the replay's largest error against a float32
reference (bf16 noise here is ~0.01), or the step that raised. See docs/known-issues.md.
"""

import os
import subprocess
import sys

import flashinfer
import torch

HQ, D, PAGE = 8, 128, 16
SPLIT = 2048 // PAGE  # fixed_split_size in pages: 2048 keys, sglang's deterministic decode tile
POISON = 0x5A


def table(lens: list[int], first_page: list[int]) -> tuple[torch.Tensor, ...]:
    """indptr, indices, last_page_len, seq_lens of requests of `lens` keys on consecutive pages."""
    pages = [-(-n // PAGE) for n in lens]
    indices = [p for f, n in zip(first_page, pages) for p in range(f, f + n)]
    indptr = [0]
    for n in pages:
        indptr.append(indptr[-1] + n)
    last = [n - (p - 1) * PAGE for n, p in zip(lens, pages)]
    as_int = lambda xs: torch.tensor(xs, dtype=torch.int32, device="cuda")  # noqa: E731
    return as_int(indptr), as_int(indices), as_int(last), as_int(lens)


def plan(wrapper, tab: tuple, hkv: int, q_len: int, window: int) -> None:  # noqa: ANN001 - a wrapper
    indptr, indices, last, lens = tab
    wrapper.plan(indptr, indices, last, HQ, hkv, D, PAGE, seq_lens=lens, q_len_per_req=q_len,
                 sm_scale=D**-0.5, window_left=window, logits_soft_cap=0.0, q_data_type=torch.bfloat16,
                 kv_data_type=torch.bfloat16, fixed_split_size=SPLIT, disable_split_kv=False)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int], first: list[int],
              q_len: int, window: int) -> torch.Tensor:
    """Each request's q_len queries over its keys, bottom-right causal with a left window, in float32."""
    out = []
    for i, (n, f) in enumerate(zip(lens, first)):
        pages = -(-n // PAGE)
        kk, vv = (x[f:f + pages].reshape(-1, x.shape[2], D)[:n].float().repeat_interleave(HQ // x.shape[2], 1)
                  for x in (k, v))
        qq = q[i * q_len:(i + 1) * q_len].float()
        s = torch.einsum("qhd,khd->hqk", qq, kk) * D**-0.5
        key = torch.arange(n, device="cuda")[None, :]
        last = n - q_len + torch.arange(q_len, device="cuda")[:, None]
        hidden = (key > last) | ((key < last - window) if window >= 0 else False)
        out.append(torch.einsum("hqk,khd->qhd", s.masked_fill(hidden, float("-inf")).softmax(-1), vv))
    return torch.cat(out)


STAGE = ["start"]


def stage(name: str) -> None:
    torch.cuda.synchronize()  # a fault of the step before surfaces here, under its own name
    STAGE[0] = name


def run(bs: int, hkv: int, q_len: int, window: int, capture_kv: int, real_lens: list[int]) -> float:
    """Capture bs dummy requests of capture_kv keys, replay `real_lens` padded to bs; the replay's err."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    max_pages = -(-max([capture_kv, *real_lens]) // PAGE)
    num_pages = 1 + sum(-(-n // PAGE) for n in real_lens)
    k, v = (torch.randn(num_pages, PAGE, hkv, D, generator=gen, device="cuda").bfloat16() for _ in range(2))
    k[0], v[0] = 0, 0  # page 0 is the reserved page the dummy and padding requests read
    workspace = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
        paged_kv_indptr_buffer=torch.zeros(bs + 1, dtype=torch.int32, device="cuda"),
        paged_kv_indices_buffer=torch.zeros(bs * max_pages, dtype=torch.int32, device="cuda"),
        paged_kv_last_page_len_buffer=torch.zeros(bs, dtype=torch.int32, device="cuda"))
    wrapper._int_workspace_buffer.fill_(POISON)
    wrapper._pin_memory_int_workspace_buffer.fill_(POISON)
    q_static = torch.zeros(bs * q_len, HQ, D, dtype=torch.bfloat16, device="cuda")
    stage("plan the dummy batch")
    plan(wrapper, table([capture_kv] * bs, [0] * bs), hkv, q_len, window)
    stage("run the dummy batch (before capture)")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        wrapper.run(q_static, (k, v))
    torch.cuda.current_stream().wait_stream(side)
    stage("capture")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_static = wrapper.run(q_static, (k, v))

    first, page = [], 1
    for n in real_lens:
        first.append(page)
        page += -(-n // PAGE)
    pad = bs - len(real_lens)
    q = torch.randn(bs * q_len, HQ, D, generator=gen, device="cuda").bfloat16()
    stage("plan the real batch")
    plan(wrapper, table(real_lens + [q_len] * pad, first + [0] * pad), hkv, q_len, window)
    q_static.copy_(q)
    stage("replay")
    graph.replay()
    stage("compare")
    ref = reference(q, k, v, real_lens, first, q_len, window)
    rows = len(real_lens) * q_len
    return float((out_static[:rows].float() - ref).abs().nan_to_num(float("inf")).max())


# (what it shows, bs, kv heads, q_len, window, capture keys, replayed requests' keys)
CASES = (
    ("A decode: capture split (2049 keys), replay unsplit", 2, 8, 1, -1, 2049, [1, 1]),
    ("B verify, 3 rows: capture split, replay unsplit", 4, 8, 3, -1, 2049, [3, 3, 3]),
    ("C window 745 < chunk: capture unsplit", 4, 2, 1, 745, 3200, [276, 745, 193]),
    ("D control: capture split, replay split", 2, 8, 1, -1, 2049, [2049, 2049]),
)


def one(index: int) -> int:
    what, *shape = CASES[index]
    try:
        err = run(*shape)
    except Exception as e:  # noqa: BLE001 - a fault is a result too
        print(f"{what}: {STAGE[0]} raised {type(e).__name__}: {str(e).splitlines()[0]}")
        return 1
    print(f"{what}: replay err {err:.3g}")
    return int(err > 0.05)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(one(int(sys.argv[1])))
    print("flashinfer", flashinfer.__version__, "torch", torch.__version__, torch.cuda.get_device_name())
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    bad = [subprocess.run([sys.executable, __file__, str(i)], env=env).returncode for i in range(len(CASES))]
    sys.exit(1 if any(bad) else 0)
