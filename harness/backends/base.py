"""The backend protocol: capability declarations (OpInfo-style) and the adapter base class.

An adapter is the glue a serving engine writes around a kernel library. Keep it split into small
methods (KV extent, slots, translation, window arguments, merge, split parameters) so that a mutant
can override exactly one of them.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.core.batch import Batch
from harness.core.case import KV_LAYOUTS, Case, case_features, case_traits
from harness.core.graph_case import GraphCase
from harness.core.modes import Mode
from harness.core.vocab import (
    CASE_FEATURES,
    DTYPES,
    FEATURE_WORDS,
    FEATURES,
    KV_DTYPES,
    SHAPE_TRAITS,
)

# The rules for which requests' queries a backend that declares `fp8_queries` rounds: every request's,
# or only those vLLM's split_decodes_and_prefills (threshold 1) counts as prefills
# (harness/checks/judged_inputs.py's prefill_requests).
FP8_QUERY_ROWS = ("all", "prefill")
# What a backend that declares `fp8_probabilities` multiplies P (relative to the running row max, in
# [0, 1]) by before rounding it to the cache's dtype: "2^8" (FA3: softmax.h's Max_offset 8) or "dtype
# max", the FP8 dtype's largest value, 448 in e4m3 and 57344 in e5m2 (FlashInfer's sm90 FP8 prefill:
# StandardFP8Attention's p_scale, hopper/variants.cuh). references/fp8_probabilities.py's P_SCALES.
FP8_PROBABILITY_SCALES = ("2^8", "dtype max")


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What a backend supports. `why_not` gives the reason for each feature it lacks."""

    modes: frozenset[Mode]
    dtypes: frozenset[str] = frozenset({"bfloat16", "float16"})
    head_dims: frozenset[int] | None = None  # None: any multiple of 8
    page_sizes: frozenset[int] = frozenset({1, 16, 32, 64, 128})
    kv_layouts: frozenset[str] = frozenset({"NHD"})
    devices: frozenset[str] = frozenset({"cuda"})
    window: bool = False
    window_right: bool = False  # a two-sided (ENCODER_ONLY) window: keys right of the query bounded too
    soft_cap: bool = False
    sinks: bool = False
    hybrid_pool: bool = False
    deterministic: bool = False
    returns_lse: bool = False
    tree: bool = False  # TARGET_VERIFY trees with topk > 1 (chains need only the mode)
    whole_page_loads: bool = False  # loads the tail rows of a request's last page (canary there)
    # Pairs of traits (vocab.case_traits: a feature, a mode's name, `tree`, `cross_prefill`) the
    # backend declares but cannot combine; the reason is why_not["a+b"]. supports() refuses such a
    # case and the suite's searches never draw one, so a refusal in a search is a surprise, counted.
    exclusive: frozenset[tuple[str, str]] = frozenset()
    kv_dtypes: frozenset[str] = frozenset()  # FP8 KV-cache dtypes it reads (a Case's kv_dtype)
    # With an FP8 cache it casts the queries to the cache's dtype (scale 1) before attention (FA3
    # needs every operand in FP8): where the code does so, quoted. Its output is then judged against
    # references over those rounded queries (harness/checks/judged_inputs.py). None: queries as given.
    fp8_queries: str | None = None
    # Which requests' queries that cast reaches (FP8_QUERY_ROWS): "all", or "prefill" where an engine
    # casts only the requests it runs through its prefill path (vLLM's FlashInfer on Hopper).
    fp8_query_rows: str = "all"
    # With an FP8 cache it rounds the softmax probabilities to the cache's dtype before P @ V (FA3's
    # FP8 forward: P relative to the running row max, times 2^8; FlashInfer's sm90 FP8 prefill: times
    # the dtype's max): where the code does so, quoted. The exact reference over P rounded so then
    # joins the budget's noise terms (harness/core/compare.py), on the rows fp8_query_rows names (an
    # FP8 P @ V runs in a kernel that takes FP8 queries too). None: P as the arithmetic holds it.
    fp8_probabilities: str | None = None
    # What P is multiplied by before that rounding (FP8_PROBABILITY_SCALES): FA3's 2^8 or FlashInfer's
    # "dtype max".
    fp8_probability_scale: str = "2^8"
    # Modes it can run under a CUDA graph (harness/backends/graph_glue.py); empty: not capturable,
    # why_not["graph"] says why (the replay tests skip with it).
    graph_modes: frozenset[Mode] = frozenset()
    why_not: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        known = {*CASE_FEATURES, *(str(m) for m in Mode), *SHAPE_TRAITS}
        unknown = sorted({t for pair in self.exclusive for t in pair} - known)
        if unknown:
            raise ValueError(f"exclusive names unknown traits {unknown}; known: {', '.join(sorted(known))}")
        if self.fp8_queries is not None and not (self.fp8_queries.strip() and self.kv_dtypes):
            raise ValueError(
                "fp8_queries declares queries cast to an FP8 cache's dtype: it needs the code that casts "
                f"them (got {self.fp8_queries!r}) and an FP8 cache in kv_dtypes ({sorted(self.kv_dtypes)})"
            )
        rows = self.fp8_query_rows
        if rows not in FP8_QUERY_ROWS or (rows != "all" and self.fp8_queries is None):
            raise ValueError(
                f"fp8_query_rows {rows!r} names which requests' queries the fp8_queries cast reaches: one "
                f"of {', '.join(FP8_QUERY_ROWS)}, and other than 'all' only with fp8_queries declared"
            )
        if self.fp8_probabilities is not None and not (self.fp8_probabilities.strip() and self.kv_dtypes):
            raise ValueError(
                "fp8_probabilities declares softmax probabilities rounded to an FP8 cache's dtype: it needs "
                f"the code that rounds them (got {self.fp8_probabilities!r}) and an FP8 cache in kv_dtypes "
                f"({sorted(self.kv_dtypes)})"
            )
        scale = self.fp8_probability_scale
        if scale not in FP8_PROBABILITY_SCALES or (scale != "2^8" and self.fp8_probabilities is None):
            raise ValueError(
                f"fp8_probability_scale {scale!r} names what P is multiplied by before its rounding: one "
                f"of {', '.join(FP8_PROBABILITY_SCALES)}, and other than '2^8' only with fp8_probabilities "
                "declared"
            )

    @classmethod
    def with_features(cls, *features: str, **fields: Any) -> Capabilities:
        """The named features (of FEATURES) on, every other one off, and the other `fields`."""
        unknown = set(features) - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown features {sorted(unknown)}; known: {', '.join(FEATURES)}")
        return cls(**dict.fromkeys(features, True), **fields)

    def reason(self, feature: str, default: str) -> str:
        return self.why_not.get(feature, default)

    def excludes(self, a: str, b: str) -> bool:
        """Whether the backend declares traits `a` and `b` exclusive (in either order)."""
        return (a, b) in self.exclusive or (b, a) in self.exclusive

    def graph_reason(self, mode: Mode | None = None) -> str | None:
        """None when the backend captures `mode` (any mode when None) under a CUDA graph, else why not."""
        if not self.graph_modes:
            return self.reason("graph", "no CUDA-graph path in its glue (not capturable yet)")
        if mode is not None and mode not in self.graph_modes:
            return self.reason(f"graph {mode}", f"no CUDA-graph path for {mode}")
        return None

    def conflict(self, case: Case) -> tuple[str, str] | None:
        """The first declared `exclusive` pair this case has both sides of, or None."""
        traits = case_traits(case)
        return next((pair for pair in sorted(self.exclusive) if set(pair) <= traits), None)

    def admits(self, case: Case) -> bool:
        """Whether the case has no declared exclusive pair (what the suite's searches draw)."""
        return self.conflict(case) is None


# Everything a case can ask for: every mode, dtype, KV layout, device and feature. The CPU fallbacks
# start from it, and the suite's strategies draw from it when no backend narrows them.
ALL_CAPABILITIES = Capabilities.with_features(
    *FEATURES,
    modes=frozenset(Mode),
    dtypes=frozenset(DTYPES),
    kv_layouts=frozenset(KV_LAYOUTS),
    devices=frozenset({"cpu", "cuda"}),
    kv_dtypes=frozenset(KV_DTYPES),
)


class BackendBroken(RuntimeError):
    """A backend's library is installed but unusable here (fails to import, unsupported version): an
    error that its tests, `list` and `check --require` report, never a skip reason."""


@dataclass
class BackendOutput:
    out: torch.Tensor  # [sum E, Hq, D]
    lse: torch.Tensor | None = None  # [sum E, Hq], natural log


class ContractError(TypeError):
    """A backend that breaks the protocol below: the message names the backend, the method and what
    the protocol wants of it (docs/backends.md, "The contract")."""


RUN_RETURNS = "BackendOutput(out=[sum E, Hq, D] tensor, lse=None or [sum E, Hq] tensor)"


def contract_problem(backend: object) -> str | None:
    """What a loaded backend lacks of the protocol, or None: a Backend instance, `capabilities` a
    Capabilities, its own `run`. A plugin's first mistakes, said in one line before any case runs."""
    if not isinstance(backend, Backend):
        return f"is a {type(backend).__name__}, not a harness Backend (subclass harness.api.Backend)"
    cls = type(backend).__name__
    caps = getattr(backend, "capabilities", None)
    if not isinstance(caps, Capabilities):
        got = "has none" if caps is None else f"is a {type(caps).__name__}"
        return (
            f"class {cls}: `capabilities` {got}; set it to a harness Capabilities (the modes, dtypes, "
            "devices and features it runs)"
        )
    if type(backend).run is Backend.run:
        return f"class {cls} does not implement run(batch), which must return a {RUN_RETURNS}"
    return None


def checked_output(backend: Backend, result: object) -> BackendOutput:
    """`result` of backend.run(batch) if it is a BackendOutput holding tensors, else a ContractError."""
    if not isinstance(result, BackendOutput):
        raise ContractError(
            f"backend {backend.name!r}: run() returned a {type(result).__name__}; it must "
            f"return a {RUN_RETURNS}"
        )
    if not isinstance(result.out, torch.Tensor) or not isinstance(result.lse, (torch.Tensor, type(None))):
        raise ContractError(
            f"backend {backend.name!r}: run() returned BackendOutput(out={type(result.out).__name__}, "
            f"lse={type(result.lse).__name__}); it must return a {RUN_RETURNS}"
        )
    return result


class Backend:
    """Base adapter. Subclasses set `name` and `capabilities` and implement `run`."""

    name: str = "unnamed"
    library: str = "torch"
    capabilities: Capabilities

    def available(self, device: str) -> str | None:
        """None if the backend can run on `device` here, else why not (becomes a skip reason).

        Raises BackendBroken where its library is installed but broken (harness/backends/versions.py):
        that is an error, so it must not read as "not here".
        """
        if device not in self.capabilities.devices:
            return f"{self.name} does not run on {device}"
        if device == "cuda" and not torch.cuda.is_available():
            return "no CUDA device: torch.cuda.is_available() is False"
        return None

    def supports(self, case: Case) -> str | None:
        """None if the backend handles this case, else the reason (the case is skipped, never passed)."""
        c = self.capabilities
        n = self.name
        if case.mode not in c.modes:
            return c.reason(str(case.mode), f"{n} does not implement {case.mode}")
        if case.dtype not in c.dtypes:
            return f"{n} does not support dtype {case.dtype}"
        if c.head_dims is not None and case.head_dim not in c.head_dims:
            return f"{n} does not support head_dim {case.head_dim} (supported: {sorted(c.head_dims)})"
        if case.page_size not in c.page_sizes:
            return f"{n} does not support page_size {case.page_size} (supported: {sorted(c.page_sizes)})"
        if case.kv_layout not in c.kv_layouts:
            return f"{n} does not support kv_layout {case.kv_layout}"
        if case.kv_dtype is not None and case.kv_dtype not in c.kv_dtypes:
            return c.reason("kv_dtype", f"{n} does not read a {case.kv_dtype} KV cache")
        for feature in case_features(case):
            if not getattr(c, feature):
                return c.reason(feature, f"{n} does not support {FEATURE_WORDS[feature]}")
        if case.mode == Mode.TARGET_VERIFY and not c.tree:
            if any(p != j - 1 for r in case.requests for j, p in enumerate(r.tree)):
                return c.reason("tree", f"{n} verifies chains only, not trees with topk > 1")
        pair = c.conflict(case)
        if pair:
            return c.reason("+".join(pair), f"{n} does not support {pair[0]} together with {pair[1]}")
        return None

    def variant_key(self, case: Case | GraphCase) -> Hashable:
        """What a process compiles for this case, as a key: cases with equal keys share what was
        compiled for the first. By default each case is a variant of its own (nothing is compiled per
        case). A check's processes split a backend's cases by this key (harness/run/speed/variant_shards.py),
        so a backend that compiles per case (flex_compiled) compiles only its share in each."""
        return case.to_json()

    def run(self, batch: Batch) -> BackendOutput:
        raise NotImplementedError(
            f"{type(self).__name__}.run(batch) is not implemented: it must return a {RUN_RETURNS}"
        )
