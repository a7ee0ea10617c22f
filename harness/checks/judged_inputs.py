"""The inputs a backend's output is judged over: the case's, with the queries as the backend declares
it computes over them.

A backend that declares `fp8_queries` (harness/backends/base.py) casts its queries to an FP8 cache's
dtype before attention, with no query scale (FA3 needs every operand in FP8), either every request's
queries or, declared `fp8_query_rows` "prefill", only those of the requests the engine runs through
its prefill path (vLLM's FlashInfer on Hopper casts its prefill queries for FA3 and keeps its decode
queries in the model dtype for XQA): prefill_requests says which, as vLLM splits a batch. The
tolerance rule models the cache's quantization, not the queries': judged over the case's own
queries, such a backend fails by the queries' rounding alone. Judged over the queries rounded the
same way (the same torch cast, on the same device), every reference (exact, native, rounded KV) and
so the budget describe the kernel's arithmetic on what it was given: a kernel wrong beyond that
still fails. The Batch a backend runs keeps the case's queries; only the references read these.

A backend that declares `fp8_probabilities` also rounds its softmax probabilities to the cache's
dtype before P @ V (FA3's FP8 forward, FlashInfer's sm90 FP8 prefill): where exactly depends on its
key blocks' running max, so no one reference is its arithmetic. The exact reference over P rounded
against each row's final max, times the factor the backend declares (`fp8_probability_scale`), in
the requests whose queries it casts (`fp8_query_rows`: an FP8 P @ V takes FP8 queries too), measures
that rounding instead (references/fp8_probabilities.py): its distance from exact joins the budget's
noise terms (harness/core/compare.py), as the cache's own rounding does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from harness.backends.base import FP8_QUERY_ROWS, Backend
from harness.core.batch import Inputs
from harness.core.case import Case
from harness.core.vocab import TORCH_KV_DTYPES
from references import fp8_probabilities


def prefill_requests(q_lens: Sequence[int]) -> tuple[bool, ...]:
    """Per request, whether vLLM's split_decodes_and_prefills (decode_threshold 1, require_uniform, as
    FlashInferMetadataBuilder calls it) counts it a prefill in a batch of these new-token counts, in
    the batch's order (the adapter does not reorder it): none when no request has more than one new
    token; every one when the first has; else every request from the first whose count differs from
    the first's, so a one-token request after a longer one is a prefill too."""
    if not q_lens or max(q_lens) <= 1:
        return (False,) * len(q_lens)
    if q_lens[0] > 1:
        return (True,) * len(q_lens)
    first = next(i for i, n in enumerate(q_lens) if n != q_lens[0])
    return tuple(i >= first for i in range(len(q_lens)))


def rounded_requests(rows: str, q_lens: Sequence[int]) -> tuple[bool, ...]:
    """Per request, whether the rule `rows` (base.FP8_QUERY_ROWS) rounds its queries."""
    if rows == "all":
        return (True,) * len(q_lens)
    if rows == "prefill":
        return prefill_requests(q_lens)
    raise ValueError(f"unknown fp8_query_rows {rows!r}; known: {', '.join(FP8_QUERY_ROWS)}")


def case_rounded_requests(backend: Backend, case: Case) -> tuple[bool, ...]:
    """Per request of `case`, whether the backend's `fp8_query_rows` rule rounds it."""
    return rounded_requests(backend.capabilities.fp8_query_rows, [r.extend_len for r in case.requests])


def rounded_queries(case: Case, inputs: Inputs, rows: str = "all") -> Inputs:
    """`inputs` with the queries of the requests the rule `rows` names (rounded_requests) rounded to the
    case's FP8 cache dtype and back to their own dtype (scale 1), every other query as it is. A query
    past that dtype's largest finite value is kept as it is: the cast saturates or gives NaN there, a
    loss of range rather than of precision, which stays judged."""
    if case.kv_dtype is None:
        raise ValueError("rounded_queries needs a case with an FP8 cache: this one's kv_dtype is None")
    fp8 = TORCH_KV_DTYPES[case.kv_dtype]
    q = inputs.q_all
    chosen = torch.tensor(rounded_requests(rows, inputs.q_lens), device=q.device)
    per_row = chosen.repeat_interleave(torch.tensor(inputs.q_lens, device=q.device))[:, None, None]
    rounded = q.to(fp8).to(q.dtype)
    keep = (q.abs() <= torch.finfo(fp8).max) & per_row
    return dataclasses.replace(inputs, q_all=torch.where(keep, rounded, q))


def rounds_queries(backend: Backend, case: Case) -> bool:
    """Whether the backend's output on this case is judged over rounded queries: it declares
    `fp8_queries`, the case has an FP8 cache, and its `fp8_query_rows` names a request of the case."""
    declared = backend.capabilities.fp8_queries is not None
    return declared and case.kv_dtype is not None and any(case_rounded_requests(backend, case))


def judged_inputs(backend: Backend, case: Case, inputs: Inputs) -> Inputs:
    """The inputs the references compute over for the backend's output on `case` (module doc)."""
    if not rounds_queries(backend, case):
        return inputs
    return rounded_queries(case, inputs, backend.capabilities.fp8_query_rows)


def rounds_probabilities(backend: Backend, case: Case) -> bool:
    """Whether the budget for the backend's output on this case counts P rounded to the cache's dtype:
    it declares `fp8_probabilities`, the case has an FP8 cache, and its `fp8_query_rows` names a
    request of the case."""
    declared = backend.capabilities.fp8_probabilities is not None
    return declared and case.kv_dtype is not None and any(case_rounded_requests(backend, case))


def rounded_probabilities(backend: Backend, case: Case, judged: Inputs, device: str) -> torch.Tensor | None:
    """The exact reference's output over `judged` with P rounded as the backend declares (its
    `fp8_probability_scale`, in the requests its `fp8_query_rows` names), where it declares so on this
    case (`rounds_probabilities`): compare()'s `ref_rounded_p`. Else None."""
    if not rounds_probabilities(backend, case):
        return None
    scale = backend.capabilities.fp8_probability_scale
    return fp8_probabilities.reference(case, judged, device, scale, case_rounded_requests(backend, case)).out


def judged_note(backend: Backend, case: Case) -> str:
    """What a verdict's reason adds when the references were over rounded queries or the budget
    counts rounded probabilities, else ""."""
    note = ""
    whose = "the" if backend.capabilities.fp8_query_rows == "all" else "its prefill requests'"
    if rounds_queries(backend, case):
        note += f"; judged over {whose} queries rounded to {case.kv_dtype} (the backend declares fp8_queries)"
    if rounds_probabilities(backend, case):
        note += (
            f"; the budget counts {whose} probabilities rounded to {case.kv_dtype} "
            "(the backend declares fp8_probabilities)"
        )
    return note
