"""Batch invariance: in deterministic mode a request's output is bitwise the same in any batch.

The target is request 0 of a deterministic Case. It is run alone, then again inside other
batches: the same batch twice, permuted, surrounded by requests of very different lengths (long
KV changes how a kernel splits its work), and in batches of 1 to 64 requests. Its logical inputs
are spliced in unchanged, so any bit that moves is the kernel's (or the glue's) doing.

A composition the backend's supports() refuses is not run, but it is never dropped silently: the
result lists every refused composition with its reason, and the check fails when one it needs is
refused: every one but the `batch of N` with N > MAX_NEEDED_BATCH, which a backend that caps its
batch size may refuse.
"""

from __future__ import annotations

import random
import time
import traceback
from dataclasses import dataclass, field

import torch

from harness.backends.base import Backend
from harness.checks.known_issues import excused_status
from harness.core.batch import Inputs, build_batch, make_inputs
from harness.core.case import Case, Request
from harness.core.modes import Mode
from harness.core.results import CaseResult
from harness.search.profiles import Sizes

BATCH_SIZES = (1, 2, 3, 8, 16, 32, 64)
MAX_NEEDED_BATCH = 8  # compositions of up to this many requests must run; larger ones may be refused


@dataclass(kw_only=True)
class InvarianceResult:
    passed: bool
    compositions: int  # batches the target was run in, the alone run included
    reason: str
    failing: str | None = None  # the first composition whose target output moved
    max_diff: float = 0.0
    crash: str | None = None  # the traceback, when the backend raised in `failing`
    refused: dict[str, str] = field(default_factory=dict)  # composition -> supports()'s reason


def _neighbour(case: Case, rng: random.Random, long_kv: int, long_q: int) -> Request:
    """A request of the same mode with a very different length (sometimes long)."""
    target = case.requests[0]
    prefix = rng.choice([0, 1, rng.randint(2, 64), rng.randint(65, max(66, long_kv))])
    if case.mode == Mode.DECODE:
        return Request(prefix, 1)
    if case.mode == Mode.DRAFT_EXTEND_V2:
        return Request(prefix, target.extend_len)
    if case.mode == Mode.TARGET_VERIFY:
        return Request(prefix, target.extend_len, tree=target.tree)
    if case.mode == Mode.ENCODER_ONLY:  # a whole input, no cache
        return Request(0, rng.choice([1, rng.randint(2, 48), rng.randint(49, max(50, long_q))]))
    if case.mode == Mode.CROSS:  # same phase as the target: a prefill batch or one decoder step
        enc = rng.choice([1, rng.randint(2, 64), rng.randint(65, max(66, long_kv))])
        if target.extend_len > 1:
            return Request(0, rng.randint(1, min(48, long_q)), enc)
        # One query: a decoder step (a first step has no cached tokens yet), so every neighbour is one
        # too; prefill neighbours would move it onto the prefill path, another kernel.
        return Request(prefix, 1, enc)
    return Request(prefix, rng.choice([1, rng.randint(2, 48), rng.randint(49, max(50, long_q))]))


def compositions(case: Case, long_kv: int = 4096, long_q: int = 512) -> list[tuple[str, list[Request], int]]:
    """(name, requests, index of the target) for every batch the target is checked in."""
    rng = random.Random(case.seed)
    target = case.requests[0]
    rest = list(case.requests[1:])
    out = [
        ("alone", [target], 0),
        ("as given", list(case.requests), 0),
        ("as given, again", list(case.requests), 0),
    ]
    if rest:
        out.append(("permuted", rest[::-1] + [target], len(rest)))
    long_ones = [_neighbour(case, rng, long_kv, long_q) for _ in range(4)]
    out.append(("between very different lengths", long_ones[:2] + [target] + long_ones[2:], 2))
    for n in BATCH_SIZES:
        others = [_neighbour(case, rng, long_kv, long_q) for _ in range(n - 1)]
        at = rng.randint(0, n - 1)
        out.append((f"batch of {n}", others[:at] + [target] + others[at:], at))
    return out


def _splice(case: Case, base: Inputs, reqs: list[Request], at: int, device: str) -> tuple[Case, Inputs]:
    """A Case of `reqs` whose request `at` carries the target's exact logical inputs."""
    comp = case.replace(requests=tuple(reqs), seed=(case.seed * 7919 + len(reqs) * 31 + at) % 2**31)
    return comp, make_inputs(comp, device).with_request(at, base)


def target_slice(out: torch.Tensor, case: Case, at: int) -> torch.Tensor:
    """The rows of request `at` in a batch output, copied to the CPU."""
    lo = sum(r.extend_len for r in case.requests[:at])
    return out[lo : lo + case.requests[at].extend_len].detach().cpu().contiguous()


def check_invariance(
    backend: Backend, case: Case, device: str = "cpu", long_kv: int = 4096, long_q: int = 512
) -> InvarianceResult:
    """Run the target in every composition; it must match the alone run bit for bit. Neighbours
    reach `long_kv` keys and (EXTEND) `long_q` new tokens."""
    if not case.deterministic:
        raise ValueError("batch invariance is only promised in deterministic mode (deterministic=true)")
    base = make_inputs(case, device)
    alone = None
    ran = 0
    refused: dict[str, str] = {}
    needed: list[str] = []
    for name, reqs, at in compositions(case, long_kv, long_q):
        comp, inputs = _splice(case, base, reqs, at, device)
        why = backend.supports(comp)
        if why:
            refused[name] = why
            if not name.startswith("batch of") or len(reqs) <= MAX_NEEDED_BATCH:
                needed.append(name)
            continue
        batch = build_batch(comp, inputs, device, backend.capabilities.whole_page_loads)
        try:
            out = target_slice(backend.run(batch).out, comp, at)  # the copy waits for the device
        except Exception as e:  # the backend failed: a CRASH result, not the end of the run
            return InvarianceResult(
                passed=False,
                compositions=ran,
                reason=f"backend raised {type(e).__name__} in '{name}': {e}",
                failing=name,
                crash=traceback.format_exc(),
                refused=refused,
            )
        ran += 1
        if alone is None:
            alone = out
        elif not torch.equal(out.view(torch.uint8), alone.view(torch.uint8)):
            diff = float((out.float() - alone.float()).abs().max())
            return InvarianceResult(
                passed=False,
                compositions=ran,
                reason=f"request 0's output changed in '{name}' (batch of "
                f"{len(reqs)}, at index {at}): max diff {diff:.3g}",
                failing=name,
                max_diff=diff,
                refused=refused,
            )
    listed = "; ".join(f"'{n}': {why}" for n, why in refused.items())
    if needed:
        which = ", ".join(f"'{n}'" for n in needed)
        reason = f"the check needs {which}, which the backend refused"
        return InvarianceResult(
            passed=False, compositions=ran, reason=f"{reason}: {listed}", failing=needed[0], refused=refused
        )
    note = f"; refused {len(refused)} larger batches: {listed}" if refused else ""
    return InvarianceResult(
        passed=True, compositions=ran, reason=f"bitwise identical across {ran} batches{note}", refused=refused
    )


def invariance_result(
    backend: Backend, case: Case, device: str = "cpu", long_kv: int = 4096, long_q: int = 512
) -> CaseResult:
    """check_invariance as a suite result: pass, fail (a bit moved) or crash (the backend raised);
    a skip with the reason when the backend cannot run the case here."""
    why = backend.available(device) or backend.supports(case)
    if why:
        return CaseResult(status="skip", backend=backend.name, device=device, case=case, reason=why)
    start = time.perf_counter()
    res = check_invariance(backend, case, device, long_kv, long_q)
    status = "pass" if res.passed else ("crash" if res.crash else "fail")
    reason = res.reason
    # a known library bug on the installed version (checks/known_issues.py)
    status, reason = excused_status(backend.name, case, status, reason, device)
    extra = {"check": "batch_invariance", "compositions": res.compositions, "failing": res.failing}
    if res.refused:
        extra["refused_compositions"] = res.refused
    if res.max_diff:
        extra["max_diff"] = res.max_diff
    if res.crash:
        extra["traceback"] = res.crash
    return CaseResult(
        status=status,
        backend=backend.name,
        device=device,
        case=case,
        reason=reason,
        seconds=time.perf_counter() - start,
        extra=extra,
    )


def neighbour_sizes(sizes: Sizes) -> tuple[int, int]:
    """(long_kv, long_q) for the invariance check under a profile: its long KV (or twice its longest
    prefix) and twice its longest extend, at most 512."""
    return sizes.long_kv or 2 * sizes.max_prefix, min(512, 2 * sizes.max_extend)
