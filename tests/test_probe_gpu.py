"""The mask probe on the GPU: every registered CUDA backend attends exactly the reference support.

Shapes follow the `gpu` profile (bf16, head_dim 128, 8 q heads, 2 kv heads) so FlashInfer compiles
no variant the suite does not already need. Skips on a machine without CUDA.
"""

import pytest
import torch

from harness import backends
from harness.checks.probe import probe
from tests.helpers import case

GPU_SHAPE = dict(head_dim=128, num_q_heads=8, num_kv_heads=2, dtype="bfloat16")
CASES = {
    "prefix-swa": case("EXTEND", ((300, 70), (5, 40)), window_left=63, **GPU_SHAPE),
    "prefix-full": case("EXTEND", ((140, 30),), **GPU_SHAPE),
    "prefill-swa": case("EXTEND", ((0, 200),), window_left=31, **GPU_SHAPE),
    "prefix-swa-hybrid": case("EXTEND", ((260, 20),), window_left=47, hybrid_swa_pool=True, **GPU_SHAPE),
    "decode-swa": case("DECODE", ((500, 1), (20, 1)), window_left=127, page_size=32, **GPU_SHAPE),
    "draft_extend_v2": case("DRAFT_EXTEND_V2", ((100, 4), (33, 4)), **GPU_SHAPE),
    "verify-tree-swa": case("TARGET_VERIFY", ((90, 5, 0, (-1, 0, 0, 1, 2)),), window_left=40, **GPU_SHAPE),
    "cross": case("CROSS", ((0, 20, 50), (0, 7, 33)), **GPU_SHAPE),
    "prefix-swa-cap-sinks": case(
        "EXTEND", ((64, 16),), window_left=15, soft_cap=30.0, sinks=True, **GPU_SHAPE
    ),
}
CUDA_BACKENDS = [n for n in backends.names() if "cuda" in backends.load(n).capabilities.devices]


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False"
)
@pytest.mark.parametrize("case_name", list(CASES))
@pytest.mark.parametrize("name", CUDA_BACKENDS)
def test_cuda_backend_attends_exactly_the_reference_support(name, case_name):
    backend = backends.load(name)
    c = CASES[case_name]
    why = backend.available("cuda") or backend.supports(c)
    if why:
        pytest.skip(why)
    r = probe(backend, c, "cuda")
    assert r.error is None and r.clean, "\n".join(r.lines[:8])
