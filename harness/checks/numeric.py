"""The numeric check: run a backend on a case and judge it against the references."""

from __future__ import annotations

import time
import traceback

import torch

from harness.backends.base import Backend
from harness.checks import crossref
from harness.checks.errormap import error_map
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case
from harness.core.compare import compare
from harness.core.results import CaseResult
from harness.core.timing import phase
from references.torch_ref import references

# The reference precisions a check needs, by whether the case has an FP8 KV cache (compare's budget).
REFERENCES = {False: ("exact", "native"), True: ("exact", "native", "rounded_kv")}


def check_case(backend: Backend, case: Case, device: str = "cpu") -> CaseResult:
    """Build the batch, run the backend, compare. Unsupported or unavailable: a skip with the reason."""
    why = backend.available(device) or backend.supports(case)
    if why:
        return CaseResult("skip", backend.name, device, case, reason=why)
    start = time.perf_counter()
    with phase("build"):
        inputs = make_inputs(case, device)
        batch = build_batch(case, inputs, device, backend.capabilities.whole_page_loads)
    try:
        with phase("kernel"):
            result = backend.run(batch)
            if device == "cuda":
                torch.cuda.synchronize()
    except Exception as e:  # the backend failed: a CRASH result (harness/run/isolation.py), not the end
        frame = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} in {frame.name}"
        reason = f"backend raised {type(e).__name__}: {e} (at {where})"
        extra = {"traceback": traceback.format_exc()}
        return CaseResult(
            "crash", backend.name, device, case, None, reason, time.perf_counter() - start, extra=extra
        )
    with phase("reference"):  # where the backend ran: float64 on the CPU, float32 accumulation on a GPU
        fp8 = case.kv_dtype is not None
        exact, native, *rounded = references(case, inputs, REFERENCES[fp8], device)
    with phase("compare"):
        extra = {"ref_rounded_kv": rounded[0].out, "lse_rounded_kv": rounded[0].lse} if fp8 else {}
        verdict = compare(case, result.out, exact.out, native.out, result.lse, exact.lse, native.lse, **extra)
        status = "pass" if verdict.passed else "fail"
        took = time.perf_counter() - start
        res = CaseResult(status, backend.name, device, case, verdict, verdict.reason, took)
        if status == "fail" and result.out.shape == exact.out.shape:
            res.error_map = error_map(case, result.out, exact.out, verdict.budget)
    if device == "cpu" and crossref.hf_available():  # the two references must agree on every CPU case
        with phase("crossref"):
            disagree = crossref.disagreement(case, inputs, exact.out)
        if disagree:
            res.status, res.reason = "fail", f"{disagree}; backend: {res.reason}"
    return res
