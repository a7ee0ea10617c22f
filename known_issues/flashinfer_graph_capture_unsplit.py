"""FlashInfer: a graph decode wrapper with fixed_split_size captured on a plan that does not split.

Standalone (torch + flashinfer only), in the style of flashinfer_graph_unsplit_plan.py. It drives
BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True, use_cuda_graph=True, backend="fa2") the
way the harness's flashinfer_dec_tc graph path does: one float workspace; page-table buffers for the
largest captured size (indptr [n + 1], indices [n * max_pages], last_page_len [n]); per captured size
(1, 2, 4, 8: largest first) a wrapper over views of them (indptr[:bs + 1], the whole indices buffer,
last_page_len[:bs]), planned on bs dummy requests of max_kv keys whose pages are all the reserved
page 0 (deterministic mode captures at max_kv), with fixed_split_size = 2048 keys in pages and
disable_split_kv=False, run once on a side stream, then captured into one shared graph pool; then
each real batch planned (its requests on pages of their own, padded to the captured size with
one-fill requests on page 0: seq_lens 1, KV extent 1 + num_draft in TARGET_VERIFY), its queries
copied in, replayed and compared with a float32 reference (bottom-right causal over each request's
keys; bf16 noise here is ~0.01).

The suite's failing graph: deterministic TARGET_VERIFY, no window, max_kv 1857 (under the 2048-key
chunk: no plan splits, neither the capture's nor a replay's), replays of 5 and 7 requests at size 8,
an illegal memory access at capture on 0.6.18.post1 from an empty cache on an H200. The entry's
predicate (has_unsplit_plan) covers a window under the chunk, or a split capture replayed unsplit;
not a capture unsplit for want of keys. The cases below separate the candidates:

  E  the suite's graph: TARGET_VERIFY, capture at 1857 keys (unsplit), sizes 8, 4, 2, 1
  F  the same, only size 8 captured (whether the other sizes' wrappers matter)
  G  E at DECODE (one query per request: whether the verify shape matters)
  H  E captured at 2049 keys (the capture splits; replays unsplit: the entry's case A/B shape)
  I  control: E planned as sglang plans graphs in deterministic mode (disable_split_kv=True, no
     fixed_split_size)
  J  control: E eagerly (use_cuda_graph=False, no capture): the kernel on the same plans

Each case runs in its own process with CUDA_LAUNCH_BLOCKING=1 (a CUDA fault poisons its context);
every step prints one line before it runs, and each case ends with the replays' largest error or
the step that raised. The int workspaces are filled with 0x5A bytes first (--clean: zeros), as
memory the caching allocators hand back holds old data. Exits 1 when any case other than the
controls I and J faults or is wrong (and when a control does: then the shape itself is at fault).

Run: python known_issues/flashinfer_graph_capture_unsplit.py [--page 16] [--draft 4] [--kv-heads 8]
     [--max-kv 1857] [--lens 1857,911,64,1500,7] [--lens2 ...] [--clean]
"""

import argparse
import os
import subprocess
import sys

import flashinfer
import torch

HQ, D = 8, 128
CHUNK = 2048  # flashinfer_dec_tc's deterministic split-KV chunk, in keys
POISON = 0x5A


def table(lens: list[int], firsts: list[int], page: int) -> tuple[torch.Tensor, ...]:
    """indptr, indices, last_page_len, seq_lens: request r on consecutive pages from firsts[r], or on
    the reserved page 0 only (every page id 0) where firsts[r] is 0, as the harness pads."""
    pages = [-(-n // page) for n in lens]
    indices = [f + i if f else 0 for f, n in zip(firsts, pages) for i in range(n)]
    indptr = [0]
    for n in pages:
        indptr.append(indptr[-1] + n)
    last = [n - (p - 1) * page for n, p in zip(lens, pages)]
    host = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    return host(indptr), host(indices).cuda(), host(last), host(lens)


def plan(wrapper, tab: tuple, args: argparse.Namespace, q_len: int, split: dict) -> None:  # noqa: ANN001
    indptr, indices, last, lens = tab
    wrapper.plan(indptr, indices, last, HQ, args.kv_heads, D, args.page, seq_lens=lens, q_len_per_req=q_len,
                 sm_scale=D**-0.5, window_left=-1, logits_soft_cap=0.0, q_data_type=torch.bfloat16,
                 kv_data_type=torch.bfloat16, **split)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int], firsts: list[int],
              q_len: int) -> torch.Tensor:
    """Each request's q_len queries over its keys, bottom-right causal, no window, in float32."""
    out = []
    for i, (n, f) in enumerate(zip(lens, firsts)):
        pages = -(-n // k.shape[1])
        kk, vv = (x[f:f + pages].reshape(-1, x.shape[2], D)[:n].float().repeat_interleave(HQ // x.shape[2], 1)
                  for x in (k, v))
        qq = q[i * q_len:(i + 1) * q_len].float()
        s = torch.einsum("qhd,khd->hqk", qq, kk) * D**-0.5
        key = torch.arange(n, device="cuda")[None, :]
        last = n - q_len + torch.arange(q_len, device="cuda")[:, None]
        out.append(torch.einsum("hqk,khd->qhd", s.masked_fill(key > last, float("-inf")).softmax(-1), vv))
    return torch.cat(out)


STEP = ["start"]


def step(name: str) -> None:
    torch.cuda.synchronize()  # a fault of the step before surfaces here, under its own name
    STEP[0] = name
    print(f"  {name}", flush=True)


def run(args: argparse.Namespace, q_len: int, capture_kv: int, sizes: list[int], split: dict,
        graph: bool) -> float:
    """Capture `sizes` (largest first) on dummies of capture_kv keys, replay each batch of args.batches
    padded to the smallest captured size that holds it; the largest error over the replays."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    batches = args.batches
    max_kv = max(capture_kv, *(n for b in batches for n in b))
    n, max_pages = max(sizes), -(-max_kv // args.page)
    num_pages = 1 + max(sum(-(-x // args.page) for x in b) for b in batches)
    k, v = (torch.randn(num_pages, args.page, args.kv_heads, D, generator=gen, device="cuda").bfloat16()
            for _ in range(2))
    k[0], v[0] = 0, 0  # the reserved page the dummy and padding requests read
    workspace = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda")
    indptr_buf = torch.zeros(n + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.zeros(n * max_pages, dtype=torch.int32, device="cuda")
    last_buf = torch.zeros(n, dtype=torch.int32, device="cuda")
    q_static = torch.zeros(n * q_len, HQ, D, dtype=torch.bfloat16, device="cuda")
    wrappers, graphs, outs = {}, {}, {}
    pool = torch.cuda.graph_pool_handle()
    for bs in sorted(sizes, reverse=True):
        step(f"make the size-{bs} wrapper (use_cuda_graph={graph})")
        views = dict(paged_kv_indptr_buffer=indptr_buf[:bs + 1], paged_kv_indices_buffer=indices_buf,
                     paged_kv_last_page_len_buffer=last_buf[:bs]) if graph else {}
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_cuda_graph=graph,
                                                         use_tensor_cores=True, backend="fa2", **views)
        w._int_workspace_buffer.fill_(0 if args.clean else POISON)
        w._pin_memory_int_workspace_buffer.fill_(0 if args.clean else POISON)
        wrappers[bs] = w
        if not graph:
            continue
        step(f"plan the dummy batch: {bs} x {capture_kv} keys on page 0")
        plan(w, table([capture_kv] * bs, [0] * bs, args.page), args, q_len, split)
        step(f"run the dummy batch of {bs} (side stream, before capture)")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            w.run(q_static[:bs * q_len], (k, v))
        torch.cuda.current_stream().wait_stream(side)
        step(f"capture size {bs}")
        graphs[bs] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[bs], pool=pool):
            outs[bs] = w.run(q_static[:bs * q_len], (k, v))
    worst = 0.0
    fill = 1 + (q_len if q_len > 1 else 0)  # a padding request's KV extent: seq_lens 1 (+ drafts in verify)
    for i, lens in enumerate(batches):
        bs = min(s for s in sizes if s >= len(lens))
        firsts, page = [], 1
        for x in lens:
            firsts.append(page)
            page += -(-x // args.page)
        pad = bs - len(lens)
        step(f"plan batch {i}: {len(lens)} requests of {lens} keys, padded to {bs}")
        plan(wrappers[bs], table(lens + [fill] * pad, firsts + [0] * pad, args.page), args, q_len, split)
        q = torch.randn(bs * q_len, HQ, D, generator=gen, device="cuda").bfloat16()
        q_static[:bs * q_len].copy_(q)
        if graph:
            step(f"replay batch {i} at size {bs}")
            graphs[bs].replay()
            out = outs[bs]
        else:
            step(f"run batch {i} eagerly at size {bs}")
            out = wrappers[bs].run(q_static[:bs * q_len], (k, v))
        step(f"compare batch {i}")
        rows = len(lens) * q_len
        diff = out[:rows].float() - reference(q, k, v, lens, firsts, q_len)
        err = float(diff.abs().nan_to_num(float("inf")).max())
        print(f"  batch {i}: err {err:.3g}", flush=True)
        worst = max(worst, err)
    return worst


def cases(args: argparse.Namespace) -> list[tuple]:
    """(label, q_len, capture keys, captured sizes, split options, graph?)."""
    fixed = {"fixed_split_size": max(1, CHUNK // args.page), "disable_split_kv": False}
    sglang = {"disable_split_kv": True}
    sizes = [1, 2, 4, 8]
    return [
        ("E verify, capture unsplit at max_kv, sizes 8 4 2 1", args.draft, args.max_kv, sizes, fixed, True),
        ("F verify, capture unsplit at max_kv, size 8 only", args.draft, args.max_kv, [8], fixed, True),
        ("G decode, capture unsplit at max_kv, sizes 8 4 2 1", 1, args.max_kv, sizes, fixed, True),
        ("H verify, capture split (2049 keys), replays unsplit", args.draft, CHUNK + 1, sizes, fixed, True),
        ("I control: verify graphs planned as sglang does (disable_split_kv)", args.draft, args.max_kv,
         sizes, sglang, True),
        ("J control: verify eagerly on the same plans", args.draft, args.max_kv, sizes, fixed, False),
    ]


def one(args: argparse.Namespace, index: int) -> int:
    label, *shape = cases(args)[index]
    print(f"{label}:", flush=True)
    try:
        err = run(args, *shape)
    except Exception as e:  # noqa: BLE001 - a fault is a result too
        print(f"{label}: {STEP[0]} raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return 1
    print(f"{label}: largest replay err {err:.3g}")
    return int(err > 0.05)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--page", type=int, default=16, help="page size (tokens)")
    p.add_argument("--draft", type=int, default=4, help="TARGET_VERIFY drafts per request (q_len_per_req)")
    p.add_argument("--kv-heads", type=int, default=8, help=f"KV heads ({HQ} query heads, head_dim {D})")
    p.add_argument("--max-kv", type=int, default=1857, help="the graph's max_kv (capture keys per dummy)")
    p.add_argument("--lens", default="1857,911,64,1500,7", help="keys of the first replay's requests")
    p.add_argument("--lens2", default="300,1857,5,1024,77,1800,640", help="keys of the second replay's")
    p.add_argument("--clean", action="store_true", help="zero the int workspaces instead of 0x5A bytes")
    p.add_argument("--case", type=int, help=argparse.SUPPRESS)  # the child process's one case
    args = p.parse_args(argv)
    args.batches = [[int(x) for x in s.split(",")] for s in (args.lens, args.lens2)]
    return args


if __name__ == "__main__":
    args = parse(sys.argv[1:])
    if args.case is not None:
        sys.exit(one(args, args.case))
    print("flashinfer", flashinfer.__version__, "torch", torch.__version__, torch.cuda.get_device_name())
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    bad = []
    for i in range(len(cases(args))):
        rc = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--case", str(i)], env=env).returncode
        bad.append(rc != 0)
    sys.exit(1 if any(bad) else 0)
