"""flex_compiled: torch.compile(flex_attention), Triton on CUDA and inductor's C++ template on the CPU.

The glue is FlexBase's (flex.py); this variant pads launches to the shapes it compiles for, sets
dynamo's settings, keys its variants, and captures under a CUDA graph (flex_graph.py).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache

import torch

from harness.backends.flex import (
    CPU_SUITE_ENV,
    CUDA_KERNEL_OPTIONS,
    DETERMINISTIC_KERNEL_OPTIONS,
    SHAPES_ENV,
    FlexBase,
    _cxx_compiler,
    _flex_api,
)
from harness.backends.flex_blocks import BLOCK
from harness.backends.flex_graph import FlexGraphPath
from harness.backends.flex_launch import Launch, bucket
from harness.core.case import Case
from harness.core.graph_case import GraphCase
from harness.core.modes import Mode


@cache
def _compiled_flex(dynamic: bool) -> Callable:
    flex, _ = _flex_api()
    return torch.compile(flex, dynamic=dynamic, fullgraph=True)


def _dynamo_settings() -> dict:
    """Dynamo settings for the compiled call: a high recompile limit, and an error (never a silent
    eager fallback) if it is hit; no automatic dynamic shapes, so a graph follows from its inputs
    alone, whatever the process met before (docs/flex.md, "Compile cost and shapes")."""
    cfg = torch._dynamo.config
    want = {
        "recompile_limit": 512,
        "accumulated_recompile_limit": 4096,
        "fail_on_recompile_limit_hit": True,
        "automatic_dynamic_shapes": False,
    }
    return {k: v for k, v in want.items() if hasattr(cfg, k)}


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a fresh contiguous tensor of `shape` (a size-1 dimension's stride included)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def canonical_layout(x: torch.Tensor) -> torch.Tensor:
    """`x` with contiguous_strides: the same elements. A contiguous tensor may carry any stride on a
    size-1 dimension (a one-row launch's [1, H, 1, D] view of a [1, 1, H, D] tensor), and dynamo
    guards on strides, so each such layout would be a compile of its own."""
    want = contiguous_strides(tuple(x.shape))
    if x.stride() == want:
        return x
    return x.as_strided(x.shape, want) if x.is_contiguous() else x.contiguous()


class FlexCompiled(FlexBase, FlexGraphPath):
    """torch.compile(flex_attention): Triton on CUDA, inductor's C++ template on the CPU.

    On the CPU every new padded shape costs a C++ compile (seconds), so the suite (cases/) skips
    the CPU device unless ATTN_HARNESS_FLEX_CPU_SUITE=1; CPU CI runs it on a dedicated subset
    (tests/test_flex.py). `cpu_in_suite` forces it on (the tests and the mutants use it).

    The CUDA-graph path (the section below, docs/flex.md "Under a CUDA graph") lays the padded batch
    out at fixed sizes from buffers written before each replay; the captured forward gathers K/V,
    builds the BlockMask and calls the compiled kernel from those buffers only.
    """

    name = "flex_compiled"
    cpu_in_suite = False
    capabilities = dataclasses.replace(
        FlexBase.capabilities,
        returns_lse=False,
        graph_modes=frozenset({Mode.DECODE, Mode.TARGET_VERIFY, Mode.DRAFT_EXTEND_V2}),
        why_not={
            "returns_lse": "the compiled CPU kernel has no LSE output (inductor raises "
            "NotImplementedError); on CUDA the LSE is returned and checked, and sinks use it",
        },
    )

    def available(self, device: str) -> str | None:
        why = super().available(device)
        if why or device != "cpu":
            return why
        if _cxx_compiler() is None:
            return "torch.compile on the CPU needs a C++ compiler (g++/clang++ or $CXX); none found"
        if not (self.cpu_in_suite or os.environ.get(CPU_SUITE_ENV) == "1"):
            return (
                "compiled flex on the CPU costs seconds of C++ compilation per new shape; CPU CI "
                f"runs it on a dedicated subset (tests/test_flex.py); set {CPU_SUITE_ENV}=1 to run it here"
            )
        return None

    def returns_lse_on(self, device: str) -> bool:
        return device != "cpu"

    def variant_key(self, case: Case | GraphCase) -> tuple:
        """What plausibly makes torch.compile(flex_attention) compile anew on CUDA (dynamic shapes, so
        not the lengths): dtype, head_dim and heads (static in flex), the softmax scale (a constant of
        the kernel), deterministic mode (its kernel options, one launch per request), and the launch's
        query rows: under 128 (inductor's decoding kernel; one row is no variant of its own, as
        `launch_lengths` pads it). A graph replay's captured launches are keyed apart, by its layer.
        The warm-up groups by it too."""
        if isinstance(case, GraphCase):
            return ("graph", *self.variant_key(case.layer))
        rows = [r.extend_len for r in case.requests]
        launch_rows = max(rows) if case.deterministic else sum(rows)
        return (
            case.dtype,
            case.head_dim,
            case.num_q_heads,
            case.num_kv_heads,
            case.scale,
            case.deterministic,
            launch_rows < 128,
        )

    def static_shapes(self, device: str) -> bool:
        """Static shapes (padded to buckets) on the CPU, where inductor's dynamic-shape flex template
        does not compile; dynamic shapes on CUDA unless ATTN_HARNESS_FLEX_SHAPES=static."""
        return device == "cpu" or os.environ.get(SHAPES_ENV, "").strip().lower() == "static"

    def padded_len(self, n: int, device: str) -> int:
        """With static shapes, padded to a few bucket sizes so that shapes repeat."""
        return bucket(n) if self.static_shapes(device) else n

    def launch_lengths(self, num_queries: int, num_keys: int, device: str) -> tuple[int, int]:
        """With dynamic shapes, lengths past the sizes dynamo specialises (its 0/1 rule: docs/flex.md,
        "Compile cost and shapes"): rows 1 and 128 get one padding row, keys at least two blocks.
        Padding belongs to no request, so its blocks are empty and skipped."""
        if self.static_shapes(device):
            return super().launch_lengths(num_queries, num_keys, device)
        rows = num_queries + 1 if num_queries in (1, BLOCK) else num_queries
        return rows, max(num_keys, BLOCK + 1)

    def kernel(self, device: str) -> Callable:
        return _compiled_flex(dynamic=not self.static_shapes(device))

    def kernel_kwargs(self, device: str, launch: Launch) -> dict:
        """The CUDA kernel's tiles (CUDA_KERNEL_OPTIONS), and in deterministic mode flex's main kernel
        (DETERMINISTIC_KERNEL_OPTIONS: a replay's launch is then bitwise its eager one's)."""
        if device != "cuda":
            return {}
        options = DETERMINISTIC_KERNEL_OPTIONS if launch.deterministic else CUDA_KERNEL_OPTIONS
        return {"kernel_options": options}

    @contextmanager
    def calling(self) -> Iterator[None]:
        """Dynamo's settings (`_dynamo_settings`), no duck shapes and gradients off: each a compile
        saved (docs/flex.md, "Compile cost and shapes")."""
        from torch.fx.experimental import _config as shapes

        shape_settings = {"use_duck_shape": False} if hasattr(shapes, "use_duck_shape") else {}
        with (
            torch._dynamo.config.patch(**_dynamo_settings()),
            shapes.patch(**shape_settings),
            torch.no_grad(),
        ):
            yield

    def kernel_inputs(self, launch: Launch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v in `canonical_layout`: one compile per shape, not per layout."""
        return canonical_layout(launch.q), canonical_layout(launch.k), canonical_layout(launch.v)


BACKENDS = {"flex_compiled": FlexCompiled}
