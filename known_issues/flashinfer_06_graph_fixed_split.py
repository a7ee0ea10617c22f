"""FlashInfer 0.6: a tensor-core decode wrapper under a CUDA graph with fixed_split_size replays wrong.

Standalone (torch + flashinfer only). An engine in deterministic mode pins the split-KV chunk
(fixed_split_size, disable_split_kv=False) and runs decode / verify under CUDA graphs: a
BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True, use_cuda_graph=True) over fixed
indptr / indices / last-page buffers is planned on a dummy batch at the largest context, captured,
then planned on each real batch (padded to the captured size with one-key requests) and replayed.
For each replay this prints the largest error of the replayed output and of an eager wrapper
planned identically, against a float32 reference (bf16 noise here is ~0.01). See docs/known-issues.md.
"""

import sys

import flashinfer
import torch

HQ, HKV, D, PAGE = 8, 8, 128, 16
MAX_KV = 2049  # the dummy capture batch's keys per request (the buffers' largest context)
SPLIT = 256  # fixed_split_size in pages (4096 keys, as the harness pins it)
MAX_PAGES = -(-MAX_KV // PAGE)


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


def plan(wrapper, tab: tuple, q_len: int) -> None:  # noqa: ANN001 - a flashinfer wrapper
    indptr, indices, last, lens = tab
    wrapper.plan(indptr, indices, last, HQ, HKV, D, PAGE, seq_lens=lens, q_len_per_req=q_len,
                 sm_scale=D**-0.5, window_left=-1, logits_soft_cap=0.0, q_data_type=torch.bfloat16,
                 kv_data_type=torch.bfloat16, fixed_split_size=SPLIT, disable_split_kv=False)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int], first: list[int],
              q_len: int) -> torch.Tensor:
    """Each request's q_len queries over its keys, bottom-right causal, in float32."""
    out = []
    for i, (n, f) in enumerate(zip(lens, first)):
        pages = -(-n // PAGE)
        kk = k[f:f + pages].reshape(-1, HKV, D)[:n].float().repeat_interleave(HQ // HKV, 1)
        vv = v[f:f + pages].reshape(-1, HKV, D)[:n].float().repeat_interleave(HQ // HKV, 1)
        qq = q[i * q_len:(i + 1) * q_len].float()
        s = torch.einsum("qhd,khd->hqk", qq, kk) * D**-0.5
        key = torch.arange(n, device="cuda")[None, :]
        row = torch.arange(q_len, device="cuda")[:, None]
        s = s.masked_fill(key > n - q_len + row, float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), vv))
    return torch.cat(out)


def run(bs: int, q_len: int, real_lens: list[int]) -> tuple[float, float]:
    """Capture at bs dummy requests of MAX_KV keys, replay `real_lens` (padded); (graph, eager) err."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    num_pages = 1 + sum(-(-n // PAGE) for n in real_lens)
    k, v = (torch.randn(num_pages, PAGE, HKV, D, generator=gen, device="cuda").bfloat16() for _ in range(2))
    k[0], v[0] = 0, 0  # page 0 is the reserved page the dummy and padding requests read
    indptr_buf = torch.zeros(bs + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.zeros(bs * MAX_PAGES, dtype=torch.int32, device="cuda")
    last_buf = torch.zeros(bs, dtype=torch.int32, device="cuda")

    def workspace() -> torch.Tensor:
        return torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")

    graph_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace(), "NHD", use_cuda_graph=True, use_tensor_cores=True, paged_kv_indptr_buffer=indptr_buf,
        paged_kv_indices_buffer=indices_buf, paged_kv_last_page_len_buffer=last_buf)
    q_static = torch.zeros(bs * q_len, HQ, D, dtype=torch.bfloat16, device="cuda")
    plan(graph_wrapper, table([MAX_KV] * bs, [0] * bs), q_len)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graph_wrapper.run(q_static, (k, v))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_static = graph_wrapper.run(q_static, (k, v))

    first, page = [], 1
    for n in real_lens:
        first.append(page)
        page += -(-n // PAGE)
    pad = bs - len(real_lens)
    tab = table(real_lens + [1] * pad, first + [0] * pad)
    q = torch.randn(bs * q_len, HQ, D, generator=gen, device="cuda").bfloat16()
    plan(graph_wrapper, tab, q_len)
    q_static.copy_(q)
    graph.replay()
    rows = len(real_lens) * q_len
    ref = reference(q, k, v, real_lens, first, q_len)
    eager = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", use_tensor_cores=True)
    plan(eager, tab, q_len)
    eager_out = eager.run(q, (k, v))
    graph_err = (out_static[:rows].float() - ref).abs().nan_to_num(float("inf")).max()
    eager_err = (eager_out[:rows].float() - ref).abs().nan_to_num(float("inf")).max()
    return float(graph_err), float(eager_err)


if __name__ == "__main__":
    print("flashinfer", flashinfer.__version__, "torch", torch.__version__, torch.cuda.get_device_name())
    bad = 0
    for bs, q_len, lens in ((2, 1, [1, 1]), (2, 1, [1]), (2, 1, [300, 17]), (2, 1, [2049, 5]),
                            (4, 3, [3, 3, 3]), (4, 3, [40, 300, 7]), (4, 1, [275, 744, 192])):
        try:
            graph_err, eager_err = run(bs, q_len, lens)
            bad += graph_err > 0.05
            print(f"captured {bs} x q_len {q_len}, replayed {lens}: graph err {graph_err:.3g}, "
                  f"eager err {eager_err:.3g}")
        except Exception as e:  # noqa: BLE001 - a crash is a result too
            bad += 1
            print(f"captured {bs} x q_len {q_len}, replayed {lens}: raised {type(e).__name__}: "
                  f"{str(e).splitlines()[0]}")
            torch.cuda.synchronize()
    sys.exit(1 if bad else 0)
