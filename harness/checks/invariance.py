"""Batch invariance: in deterministic mode a request's output is bitwise the same in any batch.

The target is request 0 of a deterministic Case. It is run alone, then again inside other
batches: the same batch twice, permuted, surrounded by requests of very different lengths (long
KV changes how a kernel splits its work), and in batches of 1 to 64 requests. Its logical inputs
are spliced in unchanged, so any bit that moves is the kernel's (or the glue's) doing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from harness.backends.base import Backend
from harness.batch import Inputs, build_batch, make_inputs
from harness.case import Case, Request
from harness.modes import Mode

BATCH_SIZES = (1, 2, 3, 8, 16, 32, 64)


@dataclass
class InvarianceResult:
    passed: bool
    compositions: int  # batches the target was run in, the alone run included
    reason: str
    failing: str | None = None  # the first composition whose target output moved
    max_diff: float = 0.0


def _neighbour(case: Case, rng: random.Random, long_kv: int) -> Request:
    """A request of the same mode with a very different length (sometimes long)."""
    target = case.requests[0]
    prefix = rng.choice([0, 1, rng.randint(2, 64), rng.randint(65, max(66, long_kv))])
    if case.mode == Mode.DECODE:
        return Request(prefix, 1)
    if case.mode == Mode.DRAFT_EXTEND_V2:
        return Request(prefix, target.extend_len)
    if case.mode == Mode.TARGET_VERIFY:
        return Request(prefix, target.extend_len, tree=target.tree)
    if case.mode == Mode.CROSS:  # same phase as the target: a prefill batch or one decoder step
        enc = rng.choice([1, rng.randint(2, 64), rng.randint(65, max(66, long_kv))])
        if target.prefix_len == 0:
            return Request(0, rng.randint(1, 48), enc)
        return Request(max(1, prefix), 1, enc)
    return Request(prefix, rng.choice([1, rng.randint(2, 48), rng.randint(49, 512)]))


def compositions(case: Case, long_kv: int = 4096) -> list[tuple[str, list[Request], int]]:
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
    long_ones = [_neighbour(case, rng, long_kv) for _ in range(4)]
    out.append(("between very different lengths", long_ones[:2] + [target] + long_ones[2:], 2))
    for n in BATCH_SIZES:
        others = [_neighbour(case, rng, long_kv) for _ in range(n - 1)]
        at = rng.randint(0, n - 1)
        out.append((f"batch of {n}", others[:at] + [target] + others[at:], at))
    return out


def _splice(case: Case, base: Inputs, reqs: list[Request], at: int) -> tuple[Case, Inputs]:
    """A Case of `reqs` whose request `at` carries the target's exact logical inputs."""
    comp = case.replace(requests=tuple(reqs), seed=(case.seed * 7919 + len(reqs) * 31 + at) % 2**31)
    inputs = make_inputs(comp)
    inputs.q[at], inputs.k[at], inputs.v[at] = base.q[0], base.k[0], base.v[0]
    inputs.sinks = base.sinks
    return comp, inputs


def target_output(backend: Backend, case: Case, inputs: Inputs, at: int, device: str) -> torch.Tensor:
    batch = build_batch(case, inputs, device, backend.capabilities.whole_page_loads)
    out = backend.run(batch).out
    lo = sum(r.extend_len for r in case.requests[:at])
    return out[lo : lo + case.requests[at].extend_len].detach().cpu()


def check_invariance(
    backend: Backend, case: Case, device: str = "cpu", long_kv: int = 4096
) -> InvarianceResult:
    """Run the target in every composition; it must match the alone run bit for bit."""
    if not case.deterministic:
        raise ValueError("batch invariance is only promised in deterministic mode (deterministic=true)")
    base = make_inputs(case)
    alone = None
    ran = 0
    skipped: list[str] = []
    for name, reqs, at in compositions(case, long_kv):
        comp, inputs = _splice(case, base, reqs, at)
        why = backend.supports(comp)
        if why:
            skipped.append(f"{name}: {why}")
            continue
        out = target_output(backend, comp, inputs, at, device).contiguous()
        ran += 1
        if alone is None:
            alone = out
        elif not torch.equal(out.view(torch.uint8), alone.view(torch.uint8)):
            diff = float((out.float() - alone.float()).abs().max())
            return InvarianceResult(
                False,
                ran,
                f"request 0's output changed in '{name}' (batch of "
                f"{len(reqs)}, at index {at}): max diff {diff:.3g}",
                name,
                diff,
            )
    note = f"; skipped {len(skipped)}: {skipped[0]}" if skipped else ""
    if ran < 2:
        return InvarianceResult(False, ran, "fewer than two batches could run" + note)
    return InvarianceResult(True, ran, f"bitwise identical across {ran} batches{note}")
