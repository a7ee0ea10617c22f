"""The numeric check: run a backend on a case and judge it against the references."""

from __future__ import annotations

import time
import traceback

import torch

from harness.backends.base import Backend, ContractError, checked_output
from harness.checks import crossref
from harness.checks.judged_inputs import judged_inputs, judged_note, rounded_probabilities
from harness.checks.known_issues import excused_status
from harness.core.batch import Inputs, build_batch, make_inputs
from harness.core.case import Case
from harness.core.compare import compare, uninformative
from harness.core.pool import storage_dtype
from harness.core.results import CaseResult
from harness.core.timing import phase
from harness.core.transfer import settle
from harness.core.vocab import TORCH_DTYPES
from references.torch_ref import references

# The reference precisions a check needs, by whether the case has an FP8 KV cache (compare's budget).
REFERENCES = {False: ("exact", "native"), True: ("exact", "native", "rounded_kv")}
MAX_BINS = 256  # the error map's token bins at most
QUANTITY = "max over head_dim of |out - ref|"


def nonfinite_cause(
    backend: Backend, case: Case, inputs: Inputs, device: str, lse_exact: torch.Tensor
) -> str:
    """Where an output's NaN/Inf came from, found by experiment rather than assumed: the backend runs
    again on a fresh batch whose unowned pool slots (NaN, harness/core/pool.py) hold 0. A finite
    output then means it read unowned memory; NaN/Inf that stay are its own arithmetic's."""
    batch = build_batch(case, inputs, device, backend.capabilities.whole_page_loads)
    for buf in (batch.pool.k, batch.pool.v):  # owned slots and canaries are finite: NaN is unowned
        buf.view(storage_dtype(buf.dtype)).masked_fill_(buf.isnan(), 0)  # 0 is also FP8's zero code
    try:
        again = backend.run(batch).out
    except Exception as e:  # the first run did not raise: say so rather than guess
        return f"cause unknown: the re-run with unowned pool slots at 0 raised {type(e).__name__}: {e}"
    if bool(torch.isfinite(again).all()):
        return "poisoned (unowned) pool memory was read: the output is finite when unowned slots hold 0"
    cause = "not unowned memory: NaN/Inf remain when unowned pool slots hold 0"
    largest = torch.finfo(TORCH_DTYPES[case.dtype]).max
    lse = lse_exact[torch.isfinite(lse_exact)]
    reach = float(lse.abs().max()) if lse.numel() else 0.0
    if reach > largest:
        cause += (
            f"; the logits' log-sum-exp reaches {reach:.3g}, past {case.dtype}'s largest value "
            f"{largest:.6g} (an overflow where the backend holds logits in {case.dtype})"
        )
    return cause



def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def error_map(case: Case, out: torch.Tensor, ref: torch.Tensor, budget: float) -> dict:
    """Where a failing output is wrong, kept in its record so that the report draws the heatmap
    without rerunning: QUANTITY per (token bin, head), at most MAX_BINS bins, 4 significant digits,
    null for a NaN/Inf in the bin."""
    ref = ref.to(out.device)
    diff = (out.to(ref.dtype) - ref).abs()
    bad = ~torch.isfinite(diff).all(-1)  # [N, H]
    per = torch.nan_to_num(diff, nan=0.0, posinf=0.0).amax(-1)
    n, h = per.shape
    b = max(1, -(-n // MAX_BINS))
    bins = -(-n // b)
    # The bins in one reduction each (a tail bin padded with 0 and False, which change no max): on a
    # GPU a loop over up to MAX_BINS slices cost milliseconds per known-issue case.
    worst = torch.cat([per, per.new_zeros(bins * b - n, h)]).view(bins, b, h).amax(1)
    nan = torch.cat([bad, bad.new_zeros(bins * b - n, h)]).view(bins, b, h).any(1)
    values = [
        [None if dead else _sig(w) for w, dead in zip(row, dead_row)]
        for row, dead_row in zip(worst.double().tolist(), nan.tolist())
    ]
    starts = [0]
    for r in case.requests[:-1]:
        starts.append(starts[-1] + r.extend_len)
    return {
        "quantity": QUANTITY,
        "budget": _sig(budget),
        "tokens": n,
        "heads": h,
        "token_bin": b,
        "request_starts": starts,
        "values": values,
    }


def _crash(backend: Backend, case: Case, device: str, e: Exception, seconds: float) -> CaseResult:
    """The CRASH result of a backend whose run raised `e` (or broke the protocol: ContractError); an
    xfail where a known issue that can fault the library (`faults`) reaches the case and confirms
    itself there. A broken protocol is the glue's, never excused."""
    frame = traceback.extract_tb(e.__traceback__)[-1]
    where = f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} in {frame.name}"
    status = "crash"
    if isinstance(e, ContractError):
        reason = str(e)
    else:
        reason = f"backend raised {type(e).__name__}: {e} (at {where})"
        status, reason = excused_status(backend.name, case, status, reason, device)
    return CaseResult(
        status=status,
        backend=backend.name,
        device=device,
        case=case,
        verdict=None,
        reason=reason,
        seconds=seconds,
        extra={"traceback": "".join(traceback.format_exception(e))},
    )


def check_case(backend: Backend, case: Case, device: str = "cpu") -> CaseResult:
    """Build the batch, run the backend, compare. Unsupported or unavailable: a skip with the reason;
    a backend whose library is installed but broken raises BackendBroken (an error, not a skip)."""
    why = backend.available(device) or backend.supports(case)
    if why:
        return CaseResult(status="skip", backend=backend.name, device=device, case=case, reason=why)
    start = time.perf_counter()
    with phase("build"):
        inputs = make_inputs(case, device)
        batch = build_batch(case, inputs, device, backend.capabilities.whole_page_loads)
    try:
        with phase("kernel"):
            result = checked_output(backend, backend.run(batch))
            settle(device)
    except Exception as e:  # the backend failed: a CRASH result (harness/run/isolation.py), not the end
        return _crash(backend, case, device, e, time.perf_counter() - start)
    with phase("reference"):  # where the backend ran: float64 on the CPU, float32 accumulation on a GPU
        fp8 = case.kv_dtype is not None
        judged = judged_inputs(backend, case, inputs)  # the queries as the backend declares it reads them
        exact, native, *rounded = references(case, judged, REFERENCES[fp8], device)
        rounded_p = rounded_probabilities(backend, case, judged, device)
    vacuous = uninformative(exact.out)
    if vacuous:  # judged by nothing: refused with the reason, as an unsupported case is
        return CaseResult(status="skip", backend=backend.name, device=device, case=case, reason=vacuous)
    with phase("compare"):
        extra = {"ref_rounded_kv": rounded[0].out, "lse_rounded_kv": rounded[0].lse} if fp8 else {}
        extra |= {"ref_rounded_p": rounded_p} if rounded_p is not None else {}
        verdict = compare(case, result.out, exact.out, native.out, result.lse, exact.lse, native.lse, **extra)
        if verdict.nonfinite:  # the backend runs again on the case's own inputs: `inputs`, not `judged`
            verdict.reason += ": " + nonfinite_cause(backend, case, inputs, device, exact.lse)
        verdict.reason += judged_note(backend, case)
        status = "pass" if verdict.passed else "fail"
        status, reason = excused_status(backend.name, case, status, verdict.reason, device)
        took = time.perf_counter() - start
        res = CaseResult(status=status, backend=backend.name, device=device, case=case, verdict=verdict,
                         reason=reason, seconds=took)
        if status != "pass" and result.out.shape == exact.out.shape:
            res.error_map = error_map(case, result.out, exact.out, verdict.budget)
    if device == "cpu" and crossref.hf_available():  # the two references must agree on every CPU case
        with phase("crossref"):
            disagree = crossref.disagreement(case, judged, exact.out)
        if disagree:
            res.status, res.reason = "fail", f"{disagree}; backend: {res.reason}"
    return res
