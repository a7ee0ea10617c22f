"""vLLM (FA3, FULL CUDA graphs): a sliding-window decode replayed on scheduler metadata laid out for another
kernel, where every request fits the window.

Standalone (torch + vLLM's CUDA build only), on a Hopper GPU (vLLM runs FA3 there). It plans and runs
FlashAttention as vLLM 0.26's FlashAttentionMetadataBuilder and FlashAttentionImpl do under
`CUDAGraphMode.FULL_DECODE_ONLY` (vllm/v1/attention/backends/flash_attn.py; the runner:
vllm/v1/worker/gpu_model_runner.py):

- the builder keeps one persistent `scheduler_metadata` buffer (1 + round_up(max_num_seqs, 4) * 4
  int32) and, at every build, copies FA3's ahead-of-time plan (`get_scheduler_metadata`, with the
  layer's window (W, 0), causal, num_splits = flash_attn_max_num_splits_for_cuda_graph) into its
  head and zeros the rest;
- the runner captures with `max_seq_len = max_model_len` ("a max_seq_len that is larger to the
  sliding window size when capturing to make sure the correct kernel is selected"), and the captured
  forward keeps that max_seqlen_k; before a replay it builds again at the batch's longest sequence.

FA3 (hopper/flash_api.cpp) drops a window that covers max_seqlen_k (`window_size_left >= max_seqlen_k
- 1` becomes -1) in both the plan and the kernel launch, and for one query per request and a head
size of 64 or less (or over 128) then drops causal too. The capture (at max_model_len) keeps the
window: a local kernel whose metadata holds a head-swizzle vector. A replay whose requests all fit
the window is planned without it: a shorter layout, the semaphore where the captured kernel reads its
heads per L2 section, zeros past it. The harness's failing graph: W = 0, 4 heads of 32, page 16,
one request of one key (its output is its own V): err 2.84 on 98.4% of the elements, on an H200.

Cases (one request of --keys keys, window --window, --heads heads of --head-dim):
  A  vLLM's replay: plan at the batch's longest sequence, replay the graph captured at max_model_len
  B  control: the replay planned at max_model_len (the capture's plan): the graph itself is right
  C  control: eager, planned and run at the batch's longest sequence (vLLM's eager path)
Prints both plans' sizes and each case's largest error against an exact float32 reference over the
request's keys. Exits 1 while A is wrong and the controls are right, 0 when A is right, 2 when a
control is wrong or the GPU is not a Hopper (then this script shows nothing about the bug).

Run: python known_issues/vllm_fa3_graph_window_metadata.py [--window 0] [--keys 1] [--head-dim 32]
"""

import argparse
import sys
from importlib.metadata import version

import torch
from vllm.vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata

PAGE = 16
MAX_MODEL_LEN = 4096  # the harness's model length for this graph: its capture's max_seqlen_k
MAX_NUM_SEQS = 256  # SchedulerConfig's default: the builder's scheduler_metadata buffer is sized by it
SPLITS = 32  # AttentionConfig.flash_attn_max_num_splits_for_cuda_graph's default
TOL = 0.02  # bf16 over a handful of keys: ~0.01

args = argparse.ArgumentParser()
args.add_argument("--window", type=int, default=0, help="W: a query sees its own key and W before it")
args.add_argument("--keys", type=int, default=1, help="keys of the one request (its query is the last)")
args.add_argument("--heads", type=int, default=4)
args.add_argument("--head-dim", type=int, default=32)
opt = args.parse_args()

print(f"vllm {version('vllm')}, torch {torch.__version__}")
if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
    print("CANNOT: vLLM runs FA3 on a Hopper GPU only")
    sys.exit(2)
print(torch.cuda.get_device_name(), f"W {opt.window}, {opt.keys} key(s), {opt.heads} heads of {opt.head_dim}")

dev, dt, H, D, W = "cuda", torch.bfloat16, opt.heads, opt.head_dim, opt.window
torch.manual_seed(0)
pages = -(-opt.keys // PAGE)
k_cache = torch.randn(pages + 1, PAGE, H, D, device=dev).to(dt)  # page 0: vLLM's null block
v_cache = torch.randn(pages + 1, PAGE, H, D, device=dev).to(dt)
q_real = torch.randn(1, H, D, device=dev).to(dt)

# The exact output: the query (position keys - 1) over its last W + 1 keys, in float32.
keys = torch.arange(opt.keys, device=dev)
seen = keys[keys >= opt.keys - 1 - W]
k_seen = k_cache[1 + seen // PAGE, seen % PAGE].float()  # [n, H, D]
v_seen = v_cache[1 + seen // PAGE, seen % PAGE].float()
p = torch.softmax(torch.einsum("hd,nhd->hn", q_real[0].float(), k_seen) * D**-0.5, dim=-1)
expected = torch.einsum("hn,nhd->hd", p, v_seen)

# The runner's persistent inputs and the builder's persistent plan.
q = torch.zeros(1, H, D, device=dev, dtype=dt)
out = torch.zeros(1, H, D, device=dev, dtype=dt)
cu = torch.tensor([0, 1], dtype=torch.int32, device=dev)
seq_lens = torch.ones(1, dtype=torch.int32, device=dev)
block_table = torch.zeros(1, MAX_MODEL_LEN // PAGE, dtype=torch.int32, device=dev)
plan_buffer = torch.zeros(1 + -(-MAX_NUM_SEQS // 4) * 4 * 4, dtype=torch.int32, device=dev)


def schedule(max_seq_len: int) -> torch.Tensor:
    """FA3's ahead-of-time plan, asked for as the builder's `schedule` asks (get_scheduler_metadata)."""
    return get_scheduler_metadata(
        batch_size=1,
        max_seqlen_q=1,
        max_seqlen_k=max_seq_len,
        num_heads_q=H,
        num_heads_kv=H,
        headdim=D,
        cache_seqlens=seq_lens,
        qkv_dtype=dt,
        cu_seqlens_q=cu,
        page_size=PAGE,
        causal=True,
        window_size=(W, 0),
        num_splits=SPLITS,
    )


def plan(max_seq_len: int) -> torch.Tensor:
    """The builder's build() under FULL graphs: the plan into the persistent buffer's head, zeros past it."""
    meta = schedule(max_seq_len)
    n = meta.numel()
    plan_buffer[:n] = meta
    plan_buffer[n:] = 0
    return plan_buffer[:n]


def forward(meta: torch.Tensor, max_seq_len: int) -> None:
    """FlashAttentionImpl.forward's call (no cascade, one query per request)."""
    flash_attn_varlen_func(
        q=q,
        k=k_cache,
        v=v_cache,
        out=out,
        cu_seqlens_q=cu,
        max_seqlen_q=1,
        seqused_k=seq_lens,
        max_seqlen_k=max_seq_len,
        softmax_scale=D**-0.5,
        causal=True,
        window_size=[W, 0],
        block_table=block_table,
        scheduler_metadata=meta,
        fa_version=3,
        num_splits=SPLITS,
    )


def load_batch() -> None:
    """_prepare_inputs: the real request's query, length and pages into the persistent inputs."""
    q.copy_(q_real)
    seq_lens.fill_(opt.keys)
    block_table[0, :pages] = torch.arange(1, pages + 1, dtype=torch.int32, device=dev)
    out.zero_()


def err() -> float:
    torch.cuda.synchronize()
    return (out[0].float() - expected).abs().max().item()


# The capture: _dummy_run's batch (one request of one query, the null block), planned at max_model_len.
captured_plan = plan(MAX_MODEL_LEN)
print(f"plan at max_seqlen_k {MAX_MODEL_LEN} (the capture's): {captured_plan.numel()} int32")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    forward(captured_plan, MAX_MODEL_LEN)
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    forward(captured_plan, MAX_MODEL_LEN)

load_batch()
print(f"plan at max_seqlen_k {opt.keys} (the replay's): {plan(opt.keys).numel()} int32")
graph.replay()
err_a = err()
print(f"A  replay planned at the batch's longest sequence (vLLM): max err {err_a:.4f}")

load_batch()
plan(MAX_MODEL_LEN)
graph.replay()
err_b = err()
print(f"B  replay planned at max_model_len (control): max err {err_b:.4f}")

load_batch()
forward(schedule(opt.keys), opt.keys)
err_c = err()
print(f"C  eager at the batch's longest sequence (control): max err {err_c:.4f}")

if err_b > TOL or err_c > TOL:
    print("CANNOT: a control is wrong, so this shape shows something else")
    sys.exit(2)
if err_a > TOL:
    print(
        "BUG: the replay reads scheduler metadata planned for another kernel (the window dropped at the "
        "replay's max_seqlen_k, kept at the capture's)"
    )
    sys.exit(1)
print("fixed: the replay is right")
