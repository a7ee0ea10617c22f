"""The replay check: an engine's graph runner over a GraphCase, each replay judged like an eager run.

`GraphRunner` does what an engine's CUDA-graph runner does: allocates the backend's metadata buffers
at the limits (`graph_buffers`) and the static inputs (queries, new K/V, one pool large enough for
every batch, the hybrid pool's map) once; captures every size of `capture_sizes` (1, 2, 4, 8, then
steps of 8) up to max_batch, largest first, each after `capture_metadata` filled the buffers for a
dummy batch; then, per batch, pads it to the smallest captured size that holds it, copies its pool
(and poison) and inputs into the static tensors (padding rows of q/k/v keep what the last replay
left), lets `replay_metadata` write its metadata into the same buffers, and replays.

`replay_result` judges each replay's real rows against the references with the numeric check's
compare() and budgets (over the queries as the backend declares it reads them:
harness/checks/judged_inputs.py), and, when the case is deterministic, bitwise against the same
adapter's eager `run()` on that batch. As in the numeric check, a sequence with an `uninformative`
batch is refused before capture, never passed. A failure names the replay index, the sequence of
sizes and the repro; a failure a known library issue of the graph path reaches is `xfail` on its
versions, and so is a crash one that can fault the kernel reaches (harness/checks/known_issues.py).
"""

from __future__ import annotations

import functools
import time
import traceback
from dataclasses import dataclass, field

import torch

from harness.backends.base import Backend
from harness.backends.graph_glue import GraphGlue, GraphLimits, StaticInputs, capture_sizes, padded_size
from harness.backends.graphs import GraphFactory
from harness.checks.judged_inputs import judged_inputs, judged_note, rounded_probabilities
from harness.checks.known_issues import excused_status
from harness.checks.numeric import REFERENCES
from harness.core.batch import Batch, Inputs, build_batch, make_inputs
from harness.core.compare import compare, uninformative
from harness.core.graph_case import GraphCase
from harness.core.pool import POISON, empty_pool, storage_dtype, stored
from harness.core.results import GRAPH_CHECK, CaseResult
from harness.core.transfer import settle
from references.torch_ref import RefOutput, references


class GraphRunner:
    """One layer's captured graphs and their static inputs (module doc)."""

    def __init__(self, backend: GraphGlue, limits: GraphLimits, batches: list[Batch]) -> None:
        self.backend = backend
        self.limits = limits
        layer = batches[0]
        self.device = layer.device
        self.sizes = capture_sizes(limits.max_batch)
        rows = self.sizes[-1] * limits.queries
        self.state = backend.graph_buffers(limits, layer)
        c = layer.case
        self.q = torch.zeros(rows, *layer.q.shape[1:], dtype=layer.q.dtype, device=self.device)
        self.k_new = torch.zeros(rows, *layer.k_new.shape[1:], dtype=layer.k_new.dtype, device=self.device)
        self.v_new = torch.zeros_like(self.k_new)
        pages = max(b.pool.num_pages for b in batches)
        p = layer.pool
        scales = (p.k_scale, p.v_scale)
        heads, dim = c.num_kv_heads, c.head_dim
        self.pool = empty_pool(pages, p.page_size, heads, dim, p.k.dtype, p.kv_layout, self.device, scales)
        self.state.pool = self.pool
        maps = [b.full_to_swa for b in batches if b.full_to_swa is not None]
        self.full_to_swa = None
        if maps:  # the allocator's full -> SWA map: one persistent tensor, as large as the largest
            size = max(m.numel() for m in maps)
            self.full_to_swa = torch.zeros(size, dtype=maps[0].dtype, device=self.device)
        self.sinks = layer.sinks.clone() if layer.sinks is not None else None
        self.factory = GraphFactory(self.device)
        self.graphs: dict[int, object] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def static(self, bs: int) -> StaticInputs:
        rows = bs * self.limits.queries
        return StaticInputs(
            bs=bs,
            q=self.q[:rows],
            k_new=self.k_new[:rows],
            v_new=self.v_new[:rows],
            pool=self.pool,
            full_to_swa=self.full_to_swa,
            sinks=self.sinks,
        )

    def capture(self) -> None:
        """Capture every size, largest first (as engines do: the pool's largest allocation first)."""
        for bs in sorted(self.sizes, reverse=True):
            self.backend.capture_metadata(self.state, bs)
            graph = self.factory.new()
            static = self.static(bs)
            forward = functools.partial(self.backend.graph_forward, self.state, static)
            self.outputs[bs] = graph.capture(forward)
            self.graphs[bs] = graph

    def load(self, batch: Batch) -> None:
        """Copy the batch's pool (its poison included) and inputs into the static tensors."""
        for dst, src in ((self.pool.k, batch.pool.k), (self.pool.v, batch.pool.v)):
            _fill_poison(dst)
            dst[: src.shape[0]].copy_(src)
        if self.full_to_swa is not None:
            self.full_to_swa.zero_()
            self.full_to_swa[: batch.full_to_swa.numel()].copy_(batch.full_to_swa)
        rows = batch.q.shape[0]
        self.q[:rows].copy_(batch.q)
        self.k_new[:rows].copy_(batch.k_new)
        self.v_new[:rows].copy_(batch.v_new)
        if self.sinks is not None:
            self.sinks.copy_(batch.sinks)

    def replay(self, batch: Batch) -> tuple[int, torch.Tensor]:
        """(the captured size it ran at, its real rows' output)."""
        bs = padded_size(self.sizes, batch.batch_size)
        self.load(batch)
        self.backend.replay_metadata(self.state, batch, bs)
        self.graphs[bs].replay()
        return bs, self.outputs[bs][: batch.q.shape[0]].clone()


def _fill_poison(buf: torch.Tensor) -> None:
    """Every slot of a static pool buffer back to poison (its bytes, for an FP8 pool)."""
    buf.view(storage_dtype(buf.dtype)).fill_(stored(POISON, buf.dtype))


def limits_of(g: GraphCase) -> GraphLimits:
    """The buffers' limits: the largest captured size (which holds max_batch), as engines allocate."""
    return GraphLimits(capture_sizes(g.max_batch)[-1], g.queries, g.max_kv, g.layer.page_size)


def why_not(backend: Backend, g: GraphCase, device: str) -> str | None:
    """Why the backend cannot replay this sequence here (unavailable, not capturable, a batch it does
    not support), or None."""
    why = backend.available(device) or backend.capabilities.graph_reason(g.layer.mode)
    if why:
        return why
    assert isinstance(backend, GraphGlue)
    if why := backend.graph_mode_reason(g.layer.mode):
        return why
    return next((w for c in g.batches for w in (backend.supports(c), backend.graph_supports(c)) if w), None)


def sequence_text(g: GraphCase, sizes: list[int]) -> str:
    """e.g. 'max_batch 8: 3 -> 8 (at 8), 1 -> 1 (at 1)': each batch's real and padded size."""
    steps = ", ".join(f"{c.batch_size} (at {padded_size(sizes, c.batch_size)})" for c in g.batches)
    return f"max_batch {g.max_batch}, max_kv {g.max_kv}: replays of {steps}"


def _raised(e: Exception) -> str:
    frame = traceback.extract_tb(e.__traceback__)[-1]
    return f"backend raised {type(e).__name__}: {e} (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"


def replay_result(backend: Backend, g: GraphCase, device: str = "cpu") -> CaseResult:
    """Capture, replay every batch, judge each (module doc). The record's case is the first failing
    batch (the first batch when all pass); extra holds the GraphCase, the replay index, the sizes."""
    extra: dict = {"check": GRAPH_CHECK, "graph_case": g.to_dict()}
    why = why_not(backend, g, device)
    if why:
        return CaseResult(
            status="skip", backend=backend.name, device=device, case=g.layer, reason=why, extra=extra
        )
    assert isinstance(backend, GraphGlue)
    report = _Report(backend=backend, g=g, device=device, extra=extra)
    inputs = [make_inputs(c, device) for c in g.batches]
    judged = [judged_inputs(backend, c, i) for c, i in zip(g.batches, inputs)]
    refs = [references(c, j, REFERENCES[c.kv_dtype is not None], device) for c, j in zip(g.batches, judged)]
    rounded_p = [rounded_probabilities(backend, c, j, device) for c, j in zip(g.batches, judged)]
    for at, (exact, *_) in enumerate(refs):
        vacuous = uninformative(exact.out)
        if vacuous:  # judged by nothing: refused with the reason, as the numeric check refuses it
            return report.result(at, "skip", vacuous)
    whole = backend.capabilities.whole_page_loads
    batches = [build_batch(c, i, device, whole) for c, i in zip(g.batches, inputs)]
    try:  # the backend's work: an exception there is a CRASH result; the harness's own propagate
        runner = GraphRunner(backend, limits_of(g), batches)
        runner.capture()
        settle(device)
    except Exception as e:
        return report.result(-1, "crash", _raised(e), traceback=traceback.format_exc())
    worst = 0.0
    for at in range(len(g.batches)):
        failed, ratio = _replay_one(report, runner, at, inputs[at], batches[at], refs[at], rounded_p[at])
        if failed is not None:
            return failed
        worst = max(worst, ratio)
    return report.result(-1, "pass", f"{len(g.batches)} replays within budget (worst err/budget {worst:.3g})")


@dataclass(kw_only=True)
class _Report:
    """A replay check's outcome as its CaseResult: where it stopped (capture, or replay `at`), the
    sizes, a known issue's xfail."""

    backend: Backend
    g: GraphCase
    device: str
    extra: dict
    start: float = field(default_factory=time.perf_counter)

    def result(self, at: int, status: str, reason: str, **more: object) -> CaseResult:
        seq = sequence_text(self.g, capture_sizes(self.g.max_batch))
        where = "capture" if at < 0 else f"replay {at}"
        text = f"{where}: {reason}; {seq}" if status != "pass" else f"{reason}; {seq}"
        status, text = excused_status(self.backend.name, self.g, status, text, self.device)
        return CaseResult(
            status=status,
            backend=self.backend.name,
            device=self.device,
            case=self.g.batches[max(at, 0)],
            reason=text,
            seconds=time.perf_counter() - self.start,
            extra={**self.extra, "replay": at, **more},
        )


def _replay_one(
    report: _Report,
    runner: GraphRunner,
    at: int,
    inputs: Inputs,
    batch: Batch,
    refs: list[RefOutput],
    rounded_p: torch.Tensor | None,
) -> tuple[CaseResult | None, float]:
    """Replay batch `at`, judge it against `refs` and `rounded_p` (compare's `ref_rounded_p`) and, in
    deterministic mode, its eager run bit for bit: (the failure or None, its err/budget)."""
    backend, device = report.backend, report.device
    case = report.g.batches[at]
    try:
        bs, out = runner.replay(batch)
        eager = None
        if case.deterministic:
            eager = backend.run(build_batch(case, inputs, device, backend.capabilities.whole_page_loads)).out
        settle(device)
    except Exception as e:
        return report.result(at, "crash", _raised(e), traceback=traceback.format_exc()), 0.0
    exact, native, *rounded = refs
    more = {"ref_rounded_kv": rounded[0].out} if rounded else {}
    more |= {"ref_rounded_p": rounded_p} if rounded_p is not None else {}
    verdict = compare(case, out, exact.out, native.out, None, None, None, **more)
    verdict.reason += judged_note(backend, case)
    if not verdict.passed:
        res = report.result(at, "fail", f"at captured size {bs}: {verdict.reason}")
        res.verdict = verdict
        return res, verdict.ratio
    if eager is not None and not torch.equal(eager, out):
        diff = float((eager.float() - out.float()).abs().nan_to_num(float("inf")).max())
        reason = (
            f"deterministic: the replay at captured size {bs} differs from the eager run "
            f"(max diff {diff:.3g}): not bitwise equal"
        )
        return report.result(at, "fail", reason, max_diff=diff), verdict.ratio
    return None, verdict.ratio
