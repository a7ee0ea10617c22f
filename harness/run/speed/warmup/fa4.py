"""Compile fa4's kernel variants ahead of time, without a GPU, into flash-attn-4's disk cache.

Walks every variant the `gpu` profile can draw (and the pins and the model check's soft cap), runs
the fa4 adapter on a CPU batch of each and hands its exact arguments, as fake CUDA tensors, to
flash_attn.cute, which compiles each kernel into the cache; a GPU run with the same cache (same
flash-attn-4, CuTe DSL and Python minor version) loads instead of compiling. docs/flash_attn.md.
Needs Python 3.12, torch and flash-attn-4 importable; the disk cache defaults to the cache directory's
fa4/ (harness/run/cache_dir.py; ATTN_HARNESS_CACHE=DIR moves it):
  FLASH_ATTENTION_ARCH=sm_90 CUTE_DSL_ARCH=sm_90a FLASH_ATTENTION_NUM_SMS=132 \
  python -m harness.run.speed.warmup.fa4 [--part I/N]
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from harness.backends.flash_attn_fa4 import FA4
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case, Request
from harness.search.profiles import SIZES, Sizes

SOFT_CAPS = (0.0, 30.0, 5.0)  # strategies' soft cap values: each value is its own kernel
TREE = (-1, 0, 0, 1, 2)
# cases/test_model.py's Gemma2-like model: soft cap 4, 8 q / 2 kv heads, no sinks (checks/model/check.py).
MODEL_SOFT_CAPS = {4.0: (8, 2)}


def variant_cases(sizes: Sizes = SIZES["gpu"]) -> list[Case]:
    """One Case per FA4 compile variant reachable under a profile's sizes (heads, head dims, dtypes;
    the gpu profile's by default), then the pinned cases."""
    out = []
    paths = {
        "causal": lambda e: dict(mode="EXTEND", requests=(Request(7, e),)),
        "local": lambda e: dict(mode="EXTEND", requests=(Request(7, e),), window_left=5),
        "cross": lambda e: dict(mode="CROSS", requests=(Request(0, e, 9),)),
        "tree": lambda e: dict(mode="TARGET_VERIFY", requests=(Request(7, 5, tree=TREE),)),
        "encoder": lambda e: dict(mode="ENCODER_ONLY", requests=(Request(0, e),)),
        "encoder_local": lambda e: dict(mode="ENCODER_ONLY", requests=(Request(0, e),), window_left=5),
        "encoder_two_sided": lambda e: dict(
            mode="ENCODER_ONLY", requests=(Request(0, e),), window_left=5, window_right=3
        ),
    }

    def variant(
        path: str, rows: int, heads: tuple[int, int], cap: float, page: int, sinks: bool, dim_dtype: tuple
    ) -> Case:
        """The Case of one compile variant: a path's shape with the given heads, cap, sinks, page,
        head_dim and dtype."""
        return Case(
            **paths[path](rows),
            num_q_heads=heads[0],
            num_kv_heads=heads[1],
            head_dim=dim_dtype[0],
            dtype=dim_dtype[1],
            soft_cap=cap,
            sinks=sinks,
            page_size=page,
        )

    fa4 = FA4()
    caps = fa4.capabilities
    dims = [(d, t) for d in sizes.head_dims for t in sizes.dtypes if d in caps.head_dims and t in caps.dtypes]
    for path, heads, cap, sinks, page, rows, dim in itertools.product(
        paths, sizes.heads, SOFT_CAPS, (False, True), (16, 128), (1, 200), dims
    ):
        if path == "tree" and rows > 1:
            continue  # drafts never fill a query tile
        out.append(variant(path, rows, heads, cap, page, sinks, dim))
    from harness.search.pinned import PINNED

    pinned = [Case.from_dict(d) for family in PINNED.values() for d in family]
    for (cap, heads), path, page, rows in itertools.product(
        MODEL_SOFT_CAPS.items(), ("causal", "local", "tree"), (16, 128), (1, 200)
    ):
        if path != "tree" or rows == 1:
            out.append(variant(path, rows, heads, cap, page, False, (128, "bfloat16")))
    out.sort(key=lambda c: (c.soft_cap > 0) + c.sinks)  # the variants drawn most often first
    return out + [c for c in pinned if fa4.supports(c) is None]


def _fake_cuda(x, mode):  # noqa: ANN001, ANN202 - tensors, lists of tensors, or anything else
    if isinstance(x, torch.Tensor):
        with mode:
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cuda")
    if isinstance(x, list):
        return [_fake_cuda(t, mode) for t in x]
    return x


def compile_only(fn):  # noqa: ANN001, ANN201 - wraps flash_attn_varlen_func
    """A stand-in kernel: compiles `fn` on fake CUDA copies of the arguments, returns zeros."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def call(q, k, v, **kwargs):  # noqa: ANN001, ANN202
        mode = FakeTensorMode()
        args = [_fake_cuda(t, mode) for t in (q, k, v)]
        fake = {name: _fake_cuda(value, mode) for name, value in kwargs.items()}
        with mode:
            fn(*args, **fake)
        total_q, heads = q.shape[0], q.shape[1]
        return torch.zeros(total_q, heads, v.shape[-1], dtype=q.dtype), torch.zeros(heads, total_q)

    return call


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", default="0/1", help="I/N: compile every N-th variant from the I-th")
    args = p.parse_args(argv)
    from harness.run import cache_dir

    cache_dir.apply()  # the disk cache on, in the cache directory, unless FLASH_ATTENTION_CUTE_DSL_* are set
    part, parts = (int(x) for x in args.part.split("/"))
    fa4 = FA4()
    kernel = compile_only(fa4.kernel())
    fa4.kernel = lambda: kernel
    todo = variant_cases()[part::parts]
    start = time.perf_counter()
    for i, case in enumerate(todo, 1):
        fa4.run(build_batch(case, make_inputs(case), "cpu", fa4.capabilities.whole_page_loads))
        print(f"[{part}/{parts}] {i}/{len(todo)} {time.perf_counter() - start:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
