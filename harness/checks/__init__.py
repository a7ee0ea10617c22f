"""Checks: numeric (reference vs backend), and the others that build on it.

Here, what every known issue's confirmation shares: the verdict on a library's own output for a
case. A known issue excuses a failing case only when the library, called directly with the case's
inputs (outside the backend's glue), is wrong too (harness/checks/known_issues.py). `library_verdict`
judges that direct output the way the numeric check judges a backend's: the same references, the
same budget, over the inputs the direct call was given. Those are the case's own queries even where
the backend declares `fp8_queries`: the cast is its glue's, which the confirmation leaves out (a
confirmation that casts them passes harness/checks/judged_inputs.py's rounded_queries(case, inputs,
rows), with the backend's `fp8_query_rows` as `rows`, so the rows it casts are the rows judged
rounded, as the numeric check judges them).
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from harness.core.batch import Inputs
from harness.core.case import Case
from harness.core.compare import Verdict, compare
from references.torch_ref import references


def library(module: str) -> ModuleType | None:
    """The library's module, or None where it is not installed (then nothing is confirmed)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def library_verdict(case: Case, inputs: Inputs, out: torch.Tensor, device: str) -> Verdict:
    """Judge `out` (the library's output for every query of the case) against the references."""
    fp8 = case.kv_dtype is not None
    exact, native, *rounded = references(
        case, inputs, ("exact", "native", "rounded_kv") if fp8 else ("exact", "native"), device
    )
    extra = {"ref_rounded_kv": rounded[0].out} if fp8 else {}
    return compare(case, out, exact.out, native.out, **extra)
