"""The inputs a backend's output is judged over: the case's, with the queries as the backend declares
it computes over them.

A backend that declares `fp8_queries` (harness/backends/base.py) casts its queries to an FP8 cache's
dtype before attention, with no query scale (FA3 needs every operand in FP8). The tolerance rule
models the cache's quantization, not the queries': judged over the case's own queries, such a backend
fails by the queries' rounding alone. Judged over the queries rounded the same way (the same torch
cast, on the same device), every reference (exact, native, rounded KV) and so the budget describe the
kernel's arithmetic on what it was given: a kernel wrong beyond that still fails. The Batch a backend
runs keeps the case's queries; only the references read these.

A backend that declares `fp8_probabilities` also rounds its softmax probabilities to the cache's
dtype before P @ V (FA3's FP8 forward): where exactly depends on its key blocks' running max, so no
one reference is its arithmetic. The exact reference over P rounded against each row's final max
(references/fp8_probabilities.py) measures that rounding instead: its distance from exact joins
the budget's noise terms (harness/core/compare.py), as the cache's own rounding does.
"""

from __future__ import annotations

import dataclasses

import torch

from harness.backends.base import Backend
from harness.core.batch import Inputs
from harness.core.case import Case
from harness.core.vocab import TORCH_KV_DTYPES
from references import fp8_probabilities


def rounded_queries(case: Case, inputs: Inputs) -> Inputs:
    """`inputs` with every query rounded to the case's FP8 cache dtype and back to its own dtype
    (scale 1). A query past that dtype's largest finite value is kept as it is: the cast saturates or
    gives NaN there, a loss of range rather than of precision, which stays judged."""
    if case.kv_dtype is None:
        raise ValueError("rounded_queries needs a case with an FP8 cache: this one's kv_dtype is None")
    fp8 = TORCH_KV_DTYPES[case.kv_dtype]
    q = inputs.q_all
    rounded = q.to(fp8).to(q.dtype)
    return dataclasses.replace(inputs, q_all=torch.where(q.abs() <= torch.finfo(fp8).max, rounded, q))


def rounds_queries(backend: Backend, case: Case) -> bool:
    """Whether the backend's output on this case is judged over rounded queries: it declares
    `fp8_queries` and the case has an FP8 cache."""
    return backend.capabilities.fp8_queries is not None and case.kv_dtype is not None


def judged_inputs(backend: Backend, case: Case, inputs: Inputs) -> Inputs:
    """The inputs the references compute over for the backend's output on `case` (module doc)."""
    return rounded_queries(case, inputs) if rounds_queries(backend, case) else inputs


def rounds_probabilities(backend: Backend, case: Case) -> bool:
    """Whether the budget for the backend's output on this case counts P rounded to the cache's dtype:
    it declares `fp8_probabilities` and the case has an FP8 cache."""
    return backend.capabilities.fp8_probabilities is not None and case.kv_dtype is not None


def rounded_probabilities(backend: Backend, case: Case, judged: Inputs, device: str) -> torch.Tensor | None:
    """The exact reference's output over `judged` with P rounded as FA3 rounds it, where the backend
    declares so on this case (`rounds_probabilities`): compare()'s `ref_rounded_p`. Else None."""
    if not rounds_probabilities(backend, case):
        return None
    return fp8_probabilities.reference(case, judged, device).out


def judged_note(backend: Backend, case: Case) -> str:
    """What a verdict's reason adds when the references were over rounded queries or the budget
    counts rounded probabilities, else ""."""
    note = ""
    if rounds_queries(backend, case):
        note += f"; judged over the queries rounded to {case.kv_dtype} (the backend declares fp8_queries)"
    if rounds_probabilities(backend, case):
        note += (
            f"; the budget counts the probabilities rounded to {case.kv_dtype} "
            "(the backend declares fp8_probabilities)"
        )
    return note
