"""Whether FlashInfer's CUDA-graph decode wrapper itself is wrong on a GraphCase (known issue
flashinfer-graph-unsplit-plan), called directly as known_issues/flashinfer_graph_unsplit_plan.py does.

The sequence is flashinfer_dec_tc's, without its glue: one float workspace; page-table buffers for
the largest captured size; per captured size (largest first) a BatchDecodeWithPagedKVCacheWrapper
(use_cuda_graph=True, tensor cores, fa2) over views of them, planned on dummy requests of the
capture extent (max_kv in deterministic mode, with fixed_split_size at 2048 keys) on the reserved
page (its int workspaces first filled with 0x5A bytes, as the script does), run once on a side
stream and captured; then per batch a plan of its requests (on pages of
their own, a windowed request's keys from the first its window sees, padded with fill-value
requests on the reserved page), its queries copied in, a replay,
and the real rows judged as the numeric check judges an output. A CUDA fault poisons the process's
context, so it runs in a child process with CUDA_LAUNCH_BLOCKING=1, which prints one line per step
and exits 1 when the library is wrong or faults, 0 when every replay is right, 2 when it cannot run.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch

from harness.backends.graph_glue import capture_sizes, padded_size
from harness.checks import library, library_verdict
from harness.core.batch import Inputs, make_inputs
from harness.core.case import Case
from harness.core.graph_case import GraphCase, kv_extents, padding_extent
from harness.core.vocab import TORCH_DTYPES

SPLIT_TOKENS = 2048  # flashinfer_dec_tc's deterministic split-KV chunk
WORKSPACE_BYTES = 512 << 20
REPRODUCED, RIGHT, CANNOT = 1, 0, 2
CHILD_SECONDS = 600
POISON = 0x5A


def graph_unsplit_plan(g: GraphCase, device: str) -> bool:
    """True when the child process (this module run on the GraphCase) finds the library wrong or
    faulting on it. On a device that is not CUDA, or without FlashInfer, nothing is confirmed. What
    the child said goes to stderr (the failing test's log), so a failure that is not excused shows
    whether the library was right there or the child could not run it, and at which step."""
    if not device.startswith("cuda") or library("flashinfer") is None:
        return False
    proc = subprocess.run(
        [sys.executable, "-m", __name__, g.to_json(), device],
        env={**os.environ, "CUDA_LAUNCH_BLOCKING": "1"},
        capture_output=True,
        text=True,
        timeout=CHILD_SECONDS,
        check=False,
    )
    said = (proc.stdout.strip().splitlines() or ["(nothing)"])[-1]
    print(f"graph confirmation: exit {proc.returncode}: {said}", file=sys.stderr)
    return proc.returncode == REPRODUCED


class Step:
    """The step in progress, synchronized first, so a fault of the one before surfaces under its name."""

    def __init__(self) -> None:
        self.name = "start"

    def __call__(self, name: str) -> None:
        torch.cuda.synchronize()
        self.name = name
        print(name, flush=True)


def table(lens: list[int], firsts: list[int], page: int, device: str) -> tuple[torch.Tensor, ...]:
    """indptr, indices, last_page_len, seq_lens of requests of `lens` keys: request r on consecutive
    pages from firsts[r], or every page the reserved page 0 where firsts[r] is 0 (as the glue pads)."""
    pages = [-(-n // page) for n in lens]
    indices = [f + i if f else 0 for f, n in zip(firsts, pages) for i in range(n)]
    indptr = [0]
    for n in pages:
        indptr.append(indptr[-1] + n)
    last = [n - (p - 1) * page for n, p in zip(lens, pages)]
    as_int = lambda xs, dev: torch.tensor(xs, dtype=torch.int32, device=dev)  # noqa: E731
    return as_int(indptr, "cpu"), as_int(indices, device), as_int(last, "cpu"), as_int(lens, "cpu")


def first_read(batch: Case, r: int) -> int:
    """The first key request r's replay reads: on a windowed layer, the earliest key its first query
    (at position prefix_len) sees, down to a page, as engines trim a sliding-window layer's KV and
    flashinfer_dec_tc's replays do; the kernel's window_left then counts from the trimmed keys' end."""
    if batch.window_left < 0:
        return 0
    return max(0, batch.requests[r].prefix_len - batch.window_left) // batch.page_size * batch.page_size


def plan(wrapper: object, layer: Case, tab: tuple, q_len: int, kv_dtype: torch.dtype) -> None:
    """plan() as flashinfer_dec_tc's graph path calls it (the layer's options; the pinned split)."""
    indptr, indices, last, lens = tab
    split = {"fixed_split_size": max(1, SPLIT_TOKENS // layer.page_size), "disable_split_kv": False}
    wrapper.plan(
        indptr, indices, last, layer.num_q_heads, layer.num_kv_heads, layer.head_dim, layer.page_size,
        seq_lens=lens, q_len_per_req=q_len, sm_scale=layer.scale, window_left=layer.window_left,
        logits_soft_cap=float(layer.soft_cap), q_data_type=TORCH_DTYPES[layer.dtype], kv_data_type=kv_dtype,
        **(split if layer.deterministic else {}),
    )


def poison(wrapper: object) -> None:
    """Fill the wrapper's int workspaces with POISON bytes, as the entry's script does: memory the
    caching allocators hand back holds old data, so bookkeeping a plan leaves unwritten is garbage,
    whatever ran before in this process."""
    for name in ("_int_workspace_buffer", "_pin_memory_int_workspace_buffer"):
        buf = getattr(wrapper, name, None)
        if isinstance(buf, torch.Tensor):
            buf.fill_(POISON)


class Pool:
    """K/V pages (page 0 reserved, zero), the layer's layout and cache dtype, and the run's scales."""

    def __init__(self, g: GraphCase, device: str) -> None:
        layer = g.layer
        self.layer = layer
        pages = 1 + max(sum(-(-n // layer.page_size) for n in kv_extents(b)) for b in g.batches)
        self.dtype = getattr(torch, layer.kv_dtype) if layer.kv_dtype else TORCH_DTYPES[layer.dtype]
        shape = (pages, layer.page_size, layer.num_kv_heads, layer.head_dim)
        if layer.kv_layout == "HND":
            shape = (pages, layer.num_kv_heads, layer.page_size, layer.head_dim)
        self.k, self.v = (torch.zeros(shape, dtype=torch.float32, device=device).to(self.dtype) for _ in "kv")
        self.scales = {"k_scale": layer.k_scale, "v_scale": layer.v_scale} if layer.kv_dtype else {}

    def lay(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> list[int]:
        """Store each request's K/V (its logical values; FP8: as codes) on consecutive pages from 1."""
        ps, firsts, page = self.layer.page_size, [], 1
        for k, v in zip(keys, values):
            n = -(-k.shape[0] // ps)
            for pool, x, scale in ((self.k, k, self.layer.k_scale), (self.v, v, self.layer.v_scale)):
                x = x / scale if self.layer.kv_dtype else x
                pad = torch.zeros(n * ps - x.shape[0], *x.shape[1:], dtype=x.dtype, device=x.device)
                block = torch.cat([x, pad]).view(n, ps, *x.shape[1:])
                block = block.transpose(1, 2) if self.layer.kv_layout == "HND" else block
                pool[page : page + n] = block.to(self.dtype)
            firsts.append(page)
            page += n
        return firsts

    def cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k, self.v


def warm_up(forward: Callable[[], torch.Tensor]) -> None:
    """Run the forward once on a side stream, as the harness does before a capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        forward()
    torch.cuda.current_stream().wait_stream(side)


def capture(forward: Callable[[], torch.Tensor], mempool: object) -> tuple[Any, torch.Tensor]:
    """The forward captured into a CUDA graph in the shared memory pool; (the graph, its output)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=mempool):
        out = forward()
    return graph, out


class Graphs:
    """FlashInfer's graph decode wrappers and their captured graphs, one per captured size, over
    page-table buffers for the largest (module doc)."""

    def __init__(self, g: GraphCase, pool: Pool, device: str) -> None:
        layer = g.layer
        self.g, self.pool, self.device = g, pool, device
        self.sizes = capture_sizes(g.max_batch)
        n, max_pages = self.sizes[-1], -(-g.max_kv // layer.page_size)
        self.indptr = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.indices = torch.zeros(n * max_pages, dtype=torch.int32, device=device)
        self.last = torch.zeros(n, dtype=torch.int32, device=device)
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        shape = (n * g.queries, layer.num_q_heads, layer.head_dim)
        self.q = torch.zeros(shape, dtype=TORCH_DTYPES[layer.dtype], device=device)
        self.wrappers: dict[int, object] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outs: dict[int, torch.Tensor] = {}

    def plan(self, bs: int, lens: list[int], firsts: list[int]) -> None:
        layer = self.g.layer
        tab = table(lens, firsts, layer.page_size, self.device)
        plan(self.wrappers[bs], layer, tab, self.g.queries, self.pool.dtype)

    def forward(self, bs: int) -> torch.Tensor:
        return self.wrappers[bs].run(self.q[: bs * self.g.queries], self.pool.cache(), **self.pool.scales)

    def capture(self, fi: object, step: Step) -> None:
        """Every size, largest first: a wrapper, the dummy batch's plan, a warm-up run, the capture."""
        layer, mempool = self.g.layer, torch.cuda.graph_pool_handle()
        capture_kv = self.g.max_kv if layer.deterministic else padding_extent(layer.mode, self.g.queries)
        for bs in sorted(self.sizes, reverse=True):
            step(f"plan the dummy batch of {bs} x {capture_kv} keys")
            self.wrappers[bs] = fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, layer.kv_layout, use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.indptr[: bs + 1], paged_kv_indices_buffer=self.indices,
                paged_kv_last_page_len_buffer=self.last[:bs], backend="fa2",
            )
            poison(self.wrappers[bs])
            self.plan(bs, [capture_kv] * bs, [0] * bs)
            step(f"run the dummy batch of {bs} (before capture)")
            warm_up(functools.partial(self.forward, bs))
            step(f"capture size {bs}")
            self.graphs[bs], self.outs[bs] = capture(functools.partial(self.forward, bs), mempool)

    def replay(self, i: int, batch: Case, inputs: Inputs, step: Step) -> str | None:
        """Batch i planned (padded with fill-value requests on the reserved page), replayed, judged:
        the verdict line where the library got it wrong, else None."""
        bs = padded_size(self.sizes, batch.batch_size)
        starts = [first_read(batch, r) for r in range(batch.batch_size)]
        keys = [k[s:] for k, s in zip(inputs.k, starts)]
        firsts = self.pool.lay(keys, [v[s:] for v, s in zip(inputs.v, starts)])
        lens = [n - s for n, s in zip(kv_extents(batch), starts)]
        pad = bs - len(lens)
        step(f"plan batch {i}: {len(lens)} requests of {lens} keys, padded to {bs}")
        self.plan(bs, lens + [padding_extent(batch.mode, self.g.queries)] * pad, firsts + [0] * pad)
        rows = inputs.q_all.shape[0]
        self.q[:rows].copy_(inputs.q_all)
        step(f"replay batch {i} at size {bs}")
        self.graphs[bs].replay()
        step(f"compare batch {i}")
        verdict = library_verdict(batch, inputs, self.outs[bs][:rows].clone(), self.device)
        print(f"batch {i}: {verdict.reason}", flush=True)
        return None if verdict.passed else f"REPRODUCED: batch {i} replayed at size {bs}: {verdict.reason}"


def drive(g: GraphCase, device: str, step: Step) -> str:
    """Capture and replay `g` through FlashInfer alone; the verdict line (the first word says which)."""
    step("draw the inputs")
    inputs = [make_inputs(b, device) for b in g.batches]
    graphs = Graphs(g, Pool(g, device), device)
    graphs.capture(library("flashinfer"), step)
    for i, (batch, inp) in enumerate(zip(g.batches, inputs)):
        wrong = graphs.replay(i, batch, inp, step)
        if wrong:
            return wrong
    return "RIGHT: every replay is right"


def main(argv: list[str]) -> int:
    """Run one GraphCase (JSON) on a device; the exit status says what the library did (module doc)."""
    g, device = GraphCase.from_json(argv[0]), argv[1]
    if library("flashinfer") is None or not torch.cuda.is_available():
        print("CANNOT: FlashInfer or CUDA is not available")
        return CANNOT
    if torch.device(device).index is not None:
        torch.cuda.set_device(torch.device(device))
    step = Step()
    try:
        line = drive(g, device, step)
    except Exception as e:  # noqa: BLE001 - the library's fault is the result; the harness's own is not
        first = str(e).splitlines()[0] if str(e) else ""
        faulted = step.name != "draw the inputs" and ("CUDA error" in str(e) or "illegal memory" in str(e))
        print(f"{'REPRODUCED' if faulted else 'CANNOT'}: {step.name} raised {type(e).__name__}: {first}")
        return REPRODUCED if faulted else CANNOT
    print(line)
    return REPRODUCED if line.startswith("REPRODUCED") else RIGHT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
