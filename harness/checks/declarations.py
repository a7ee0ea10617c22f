"""Declared means accepted: every capability a backend declares, its supports() takes.

The suite is generated from the declarations (Capabilities), and a search rejects what supports()
refuses, so a backend whose supports() turns down something it declares would leave that part of
the suite to refusals: unchecked, and quiet. `refused_declarations` builds a representative case for
every declared mode, dtype, head dim, page size, KV layout, feature and the verify tree (in every
declared mode the feature is not declared `exclusive` with) and lists each one supports() refuses.
It is pure Python: no device and no kernel library is needed. `returns_lse` is an output, not an
input: no case asks for it.
"""

from __future__ import annotations

from harness.backends.base import Backend, Capabilities
from harness.core.case import Case, CaseError, Request
from harness.core.modes import Mode
from harness.core.vocab import CASE_FEATURES

# A small batch per mode; CROSS has a prefill and a decoder step (traits differ: `cross_prefill`).
BASE_REQUESTS = {
    Mode.EXTEND: [(Request(8, 8),)],
    Mode.DECODE: [(Request(16, 1),)],
    Mode.DRAFT_EXTEND_V2: [(Request(16, 3),)],
    Mode.TARGET_VERIFY: [(Request(16, 3, tree=(-1, 0, 1)),)],
    Mode.CROSS: [(Request(0, 4, 8),), (Request(3, 1, 8),)],
    Mode.ENCODER_ONLY: [(Request(0, 8),)],
}
ANY_HEAD_DIMS = (16, 64, 128, 256)  # tried when a backend declares any multiple of 8
FEATURE_FIELDS = {
    "window": {"window_left": 4},
    "window_right": {"window_left": 4, "window_right": 2},
    "soft_cap": {"soft_cap": 30.0},
    "sinks": {"sinks": True},
    "hybrid_pool": {"hybrid_swa_pool": True, "window_left": 4},
    "deterministic": {"deterministic": True},
}
TREE = (-1, 0, 0)  # a verify tree with topk > 1


def _preferred(values: frozenset, first: object) -> object:
    return first if first in values else sorted(values)[0]


def base_cases(caps: Capabilities) -> list[Case]:
    """One small case per declared mode (two for CROSS), in the backend's preferred dtype, head dim,
    page size and layout."""
    head_dim = 64 if caps.head_dims is None else _preferred(caps.head_dims, 64)
    out = []
    for mode in sorted(caps.modes, key=list(Mode).index):
        for reqs in BASE_REQUESTS[mode]:
            out.append(
                Case(
                    mode=mode,
                    requests=reqs,
                    num_q_heads=4,
                    num_kv_heads=2,
                    head_dim=head_dim,
                    dtype=_preferred(caps.dtypes, "bfloat16"),
                    page_size=_preferred(caps.page_sizes, 16),
                    kv_layout=_preferred(caps.kv_layouts, "NHD"),
                )
            )
    return out


def declared_variants(caps: Capabilities) -> list[tuple[str, Case]]:
    """(what is declared, a case that asks for exactly that) for every declaration, on every base."""
    out = []
    for base in base_cases(caps):
        out.append((f"mode {base.mode}", base))
        out += [(f"dtype {d}", base.replace(dtype=d)) for d in sorted(caps.dtypes)]
        dims = ANY_HEAD_DIMS if caps.head_dims is None else sorted(caps.head_dims)
        out += [(f"head_dim {d}", base.replace(head_dim=d)) for d in dims]
        out += [(f"page_size {p}", base.replace(page_size=p)) for p in sorted(caps.page_sizes)]
        out += [(f"kv_layout {x}", base.replace(kv_layout=x)) for x in sorted(caps.kv_layouts)]
        for feature in CASE_FEATURES:
            if getattr(caps, feature) and not caps.excludes(feature, str(base.mode)):
                try:
                    out.append((f"feature {feature}", base.replace(**FEATURE_FIELDS[feature])))
                except CaseError:  # the mode cannot have it (a window in CROSS): no backend's doing
                    continue
        if caps.tree and base.mode == Mode.TARGET_VERIFY:
            tree = tuple(Request(r.prefix_len, r.extend_len, tree=TREE) for r in base.requests)
            out.append(("tree (topk > 1)", base.replace(requests=tree)))
    return out


def refused_declarations(backend: Backend) -> list[str]:
    """Every declared capability that supports() refuses on its representative case, with the case
    and the reason; empty when declared means accepted. A variant that combines a declared
    `exclusive` pair (the CROSS prefill of a deterministic case, say) is not asked for."""
    caps = backend.capabilities
    problems = []
    asked = set()
    for what, case in declared_variants(caps):
        if not caps.admits(case):
            continue
        asked.add(what)
        why = backend.supports(case)
        if why:
            problems.append(f"{backend.name} declares {what} but supports() refuses {case.to_json()}: {why}")
    for feature in CASE_FEATURES:
        if getattr(caps, feature) and f"feature {feature}" not in asked:
            problems.append(f"{backend.name} declares {feature} but no declared mode admits a case with it")
    return problems
