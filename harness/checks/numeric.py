"""The numeric check: run a backend on a case and judge it against the references."""

from __future__ import annotations

import time

import torch

from harness.backends.base import Backend
from harness.batch import build_batch, make_inputs
from harness.case import Case
from harness.compare import compare
from harness.results import CaseResult
from references.torch_ref import reference


def reference_device(device: str) -> torch.device:
    """References run where the backend runs: float64 on the CPU, float32 accumulation on a GPU."""
    return torch.device(device)


def check_case(backend: Backend, case: Case, device: str = "cpu") -> CaseResult:
    """Build the batch, run the backend, compare. Unsupported or unavailable: a skip with the reason."""
    why = backend.available(device) or backend.supports(case)
    if why:
        return CaseResult("skip", backend.name, device, case, reason=why)
    start = time.perf_counter()
    inputs = make_inputs(case)
    batch = build_batch(case, inputs, device, backend.capabilities.whole_page_loads)
    result = backend.run(batch)
    if device == "cuda":
        torch.cuda.synchronize()
    ref_dev = reference_device(device)
    exact = reference(case, inputs, "exact", ref_dev)
    native = reference(case, inputs, "native", ref_dev)
    verdict = compare(case, result.out, exact.out, native.out, result.lse, exact.lse, native.lse)
    status = "pass" if verdict.passed else "fail"
    return CaseResult(
        status, backend.name, device, case, verdict, verdict.reason, time.perf_counter() - start
    )
