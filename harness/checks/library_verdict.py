"""The verdict on a library's own output for a case: what a known issue's confirmation judges.

A known issue excuses a failing case only when the library, called directly with the case's inputs
(outside the backend's glue), is wrong too (harness/checks/known_issues.py). This judges that direct
output the way the numeric check judges a backend's: the same references, the same budget, over the
inputs the direct call was given. Those are the case's own queries even where the backend declares
`fp8_queries`: the cast is its glue's, which the confirmation leaves out (a confirmation that casts
them passes harness/checks/judged_inputs.py's rounded_queries(case, inputs) instead). A library
that rounds its softmax probabilities to the cache's dtype (FA3's FP8 forward, whatever calls it) is
judged with that rounding in its budget when the confirmation says so (`fp8_probabilities`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from harness.core.batch import Inputs
from harness.core.case import Case
from harness.core.compare import Verdict, compare
from references import fp8_probabilities as rounded_p
from references.torch_ref import references


def library(module: str) -> ModuleType | None:
    """The library's module, or None where it is not installed (then nothing is confirmed)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def library_verdict(
    case: Case, inputs: Inputs, out: torch.Tensor, device: str, fp8_probabilities: bool = False
) -> Verdict:
    """Judge `out` (the library's output for every query of the case) against the references;
    `fp8_probabilities`: the library rounds P to an FP8 cache's dtype (module doc)."""
    fp8 = case.kv_dtype is not None
    exact, native, *rounded = references(
        case, inputs, ("exact", "native", "rounded_kv") if fp8 else ("exact", "native"), device
    )
    extra = {"ref_rounded_kv": rounded[0].out} if fp8 else {}
    if fp8 and fp8_probabilities:
        extra["ref_rounded_p"] = rounded_p.reference(case, inputs, device).out
    return compare(case, out, exact.out, native.out, **extra)
