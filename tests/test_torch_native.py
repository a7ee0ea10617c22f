"""torch_native lets SDPA choose among its flash, memory-efficient and math kernels, never cuDNN's.

cuDNN's SDPA builds a plan for every new shape, and every request of a case is one, so it made
torch_native's check 2 to 5 times as long (docs/design.md). On the CPU: every SDPA call of a run sees
cuDNN's kernel turned off and the others on, and the setting is restored after. On CUDA (skipped,
with the reason, without it): the aten operations a run dispatches include an SDPA kernel and none of
cuDNN's, where torch would pick cuDNN's by default.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.backends.torch_native import TorchNative
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case, Request
from tests.helpers import AtenOps

CASES = {
    "extend-window": Case(
        mode="EXTEND", requests=(Request(40, 9), Request(0, 5)), head_dim=64, window_left=7
    ),
    "decode-sinks": Case(mode="DECODE", requests=(Request(30, 1), Request(9, 1)), head_dim=64, sinks=True),
}


def _flags() -> dict[str, bool]:
    b = torch.backends.cuda
    return {
        "cudnn": b.cudnn_sdp_enabled(),
        "flash": b.flash_sdp_enabled(),
        "efficient": b.mem_efficient_sdp_enabled(),
        "math": b.math_sdp_enabled(),
    }


@pytest.mark.parametrize("label", list(CASES))
def test_every_sdpa_call_runs_without_cudnns_kernel(label, monkeypatch):
    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - SDPA's own signature
        seen.append(_flags())
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    before = _flags()
    case = CASES[label]
    TorchNative().run(build_batch(case, make_inputs(case), "cpu"))
    assert len(seen) == len(case.requests)
    assert all(f == {"cudnn": False, "flash": True, "efficient": True, "math": True} for f in seen)
    assert _flags() == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: cuDNN's SDPA runs only on a GPU")
@pytest.mark.parametrize("label", list(CASES))
def test_no_cudnn_attention_on_cuda(label):
    case = CASES[label]
    batch = build_batch(case, make_inputs(case, "cuda"), "cuda")
    with AtenOps() as ops:
        TorchNative().run(batch)
    attention = [n for n in ops.names if "scaled_dot_product" in n]
    assert attention and not [n for n in attention if "cudnn" in n], attention
