"""Variant shards: the N processes of a backend's check split its cases by variant, not its tests.

Every shard runs every search test of the backend and draws the same examples, but checks only the
cases whose variant it owns (Backend.variant_key: by default each case is a variant of its own; a
backend that compiles per case keys the cases that share a compile, as flex_compiled's dynamo
traces each variant anew in every process). It answers another shard's case unchecked, as record
mode does (the check's skip when refused, else a pass), and records nothing for it: hypothesis sees
the same search in every shard, and one shard checks and records each case. Split by test instead,
a shard is no shorter than its heaviest test (flex_compiled's graph family: many replays of a
compiled graph) and meets nearly every variant, since each family draws most of them, so each
shard would trace nearly every variant again.

Draws are alike only in a derandomized profile without the target phase (`gpu`; `ci` has it): in
another profile the shards split the tests, every Nth from the Ith. The tests without a search target
(the backend's model checks) all run whole in one shard (harness/run/pytest_plugin.py): the first model
check in a process pays transformers' import and the first model's construction, several times
what a later one costs: dealt one each to three shards, all three would pay it.

Balance: each variant's weight, the seconds its cases take in the shard that owns it, is kept in
the cache directory: modelled by the warm-up from what its recording drew (record mode, for the
backends it records), then measured by each check that did not compile (the sum of its cases'
seconds, the first one's trace included). The whole tests weigh as one unit (`WHOLE_TESTS`), their
measured seconds summed. Every shard reads that file and deals the variants and the unit out the same
way, heaviest first, each to the lightest shard. A variant the file lacks (no check measured it yet,
or the draws changed), or the unit, goes to the shard a hash of its key names.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Hashable, Iterable
from functools import cache
from pathlib import Path

from hypothesis import settings

from harness.backends.base import Backend
from harness.core.case import Case
from harness.core.graph_case import GraphCase
from harness.core.results import CaseResult
from harness.run import cache_dir, record_mode
from harness.run.parallel import file_name
from harness.search import profiles

# A case's mean seconds by check kind in flex_compiled's one-process check on an H100 (gpu profile,
# cache warm; each variant's first case, with its trace, included): the modelled weights, until a
# check measures them.
KIND_SECONDS = {"numeric": 0.142, "graph": 0.668, "invariance": 1.317}
WEIGHTS_DIR = "variants"  # in the cache directory: <backend>.<profile>.json, keyed by `name`
FORMAT = "attn-harness-variant-weights"
WHOLE_TESTS = "whole tests"  # the weight key of the backend's tests one shard runs whole (model checks)
VARIANT_NAME = re.compile("[0-9a-f]{16}")  # `name`; a key of neither kind (an older file's) is dropped
ELSEWHERE = "elsewhere"  # the `extra` key of an answer for another shard's case: its shard, "I/N"
_shard: tuple[int, int] = (0, 1)  # this process's (index, count); set from --harness-shard


def configure(index: int, count: int) -> None:
    """Make this process shard `index` of `count` (0 <= index < count)."""
    global _shard
    _dealt.cache_clear()  # the weights are read again (a new run may follow a warm-up)
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard {index}/{count}: expected 0 <= index < count")
    _shard = (index, count)


def current() -> tuple[int, int]:
    """This process's (index, count); (0, 1) when it is not a shard."""
    return _shard


def name(key: Hashable) -> str:
    """A variant's name in the weights file and for the hash: 16 hex digits of the SHA-1 of its
    repr, the same in every process (Python's own hash of a string is salted per process)."""
    return hashlib.sha1(repr(key).encode()).hexdigest()[:16]


def owner(key: Hashable, count: int) -> int:
    """The shard of `count` that owns a variant no weights name: its name, as a number, modulo count."""
    return int(name(key), 16) % count


def weights_path(backend: str, profile: str, root: Path | None = None) -> Path:
    """Where the weights of a backend's variants under a profile are kept."""
    return (root or cache_dir.root()) / WEIGHTS_DIR / f"{file_name(backend)}.{profile}.json"


def save_weights(backend: Backend, profile: str, drawn: Iterable[dict], root: Path | None = None) -> Path:
    """Write each variant's weight from the cases a check draws (record mode's lines: `kind`, `case`):
    the KIND_SECONDS of each of its cases."""
    weights: dict[str, float] = {}
    for line in drawn:
        key = name(backend.variant_key(line["case"]))
        weights[key] = weights.get(key, 0.0) + KIND_SECONDS[line["kind"]]
    return _write(backend, profile, weights, root)


def save_measured(
    backend: Backend, profile: str, records: Iterable[dict], root: Path | None = None
) -> Path | None:
    """Replace the weights of the variants a finished check ran with their measured seconds (the sum
    over its results.json records of the backend's cases), and of the whole tests if it ran them (the
    sum over the records of tests with seconds: the model checks); the others keep theirs. None when
    it ran none of them."""
    measured: dict[str, float] = {}
    for r in records:
        if r.get("backend") != backend.name:
            continue
        if not r.get("case"):
            if r.get("test_id") and float(r.get("seconds") or 0.0) > 0:
                measured[WHOLE_TESTS] = measured.get(WHOLE_TESTS, 0.0) + float(r["seconds"])
            continue
        extra = r.get("extra") or {}
        case = (
            GraphCase.from_dict(extra["graph_case"]) if "graph_case" in extra else Case.from_dict(r["case"])
        )
        key = name(backend.variant_key(case))
        measured[key] = measured.get(key, 0.0) + float(r.get("seconds") or 0.0)
    if not measured:
        return None
    return _write(
        backend, profile, {**read_weights(weights_path(backend.name, profile, root)), **measured}, root
    )


def _write(backend: Backend, profile: str, weights: dict[str, float], root: Path | None) -> Path:
    path = weights_path(backend.name, profile, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    rounded = {k: round(w, 3) for k, w in sorted(weights.items())}
    cache_dir.write_json(
        path, {"format": FORMAT, "backend": backend.name, "profile": profile, "weights": rounded}
    )
    return path


def read_weights(path: Path) -> dict[str, float]:
    """A weights file's variant (or WHOLE_TESTS) -> seconds; an absent or unreadable one is empty
    (hashing then deals)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("weights"), dict):
        return {}
    return {
        k: float(w)
        for k, w in doc["weights"].items()
        if (k == WHOLE_TESTS or VARIANT_NAME.fullmatch(k)) and isinstance(w, (int, float)) and w >= 0
    }


def deal(weights: dict[str, float], count: int) -> dict[str, int]:
    """Each variant's shard: heaviest first (ties by key), each to the lightest shard so far (ties to
    the lowest), the same in every process."""
    loads, out = [0.0] * count, {}
    for key, weight in sorted(weights.items(), key=lambda kw: (-kw[1], kw[0])):
        shard = min(range(count), key=lambda i: (loads[i], i))
        out[key], loads[shard] = shard, loads[shard] + weight
    return out


@cache
def _dealt(backend: str, profile: str, count: int) -> dict[str, int]:
    return deal(read_weights(weights_path(backend, profile)), count)


def shard_of_whole_tests(backend: Backend, count: int) -> int:
    """The shard of `count` that runs every whole test of the backend: the unit's, as dealt from the
    saved weights, else as hashed."""
    return _dealt(backend.name, profiles.current(), count).get(WHOLE_TESTS, owner(WHOLE_TESTS, count))


def shard_of(backend: Backend, case: Case | GraphCase, count: int) -> int:
    """The shard of `count` that checks this case: its variant's, as dealt from the saved weights,
    else as hashed."""
    key = backend.variant_key(case)
    return _dealt(backend.name, profiles.current(), count).get(name(key), owner(key, count))


def same_draws() -> bool:
    """Whether every shard draws the same examples: a derandomized profile without hypothesis's
    target phase (which steers by the err/budget of the cases a shard checked; the `ci` profile runs
    it, the `gpu` profile not: harness/search/profiles.py)."""
    return bool(settings().derandomize) and not profiles.steers_by_target()


def splits() -> bool:
    """Whether this process checks only its share of each search's cases: it is a shard and the
    shards draw alike (else they split the tests)."""
    return _shard[1] > 1 and same_draws()


def elsewhere(backend: Backend, case: Case | GraphCase) -> bool:
    """Whether another shard owns this case's variant (so this one must not check it)."""
    if not splits():
        return False
    index, count = _shard
    return shard_of(backend, case, count) != index


def answer(backend: Backend, case: Case | GraphCase, device: str) -> CaseResult:
    """Another shard's case, unchecked: what a checking run shows hypothesis (a refusal's skip, else a
    pass), marked so the suite records nothing for it (harness/run/suite.py, `judge`)."""
    res = record_mode.unchecked(backend, case, device, "checked by the shard that owns its variant")
    res.extra[ELSEWHERE] = "{}/{}".format(*_shard)
    return res


def is_elsewhere(res: CaseResult) -> bool:
    """Whether `res` is another shard's case, answered unchecked."""
    return ELSEWHERE in res.extra
