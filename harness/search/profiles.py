"""Hypothesis profiles and the case sizes each one draws.

ci: CPU, small and fast, derandomized so CI replays exactly. dev: local bisection. gpu: the device
runner (make check on a GPU): bf16, head_dim 128, few compile variants, no target phase (below).
thorough: nightly.
Select with `--hypothesis-profile NAME` or `load(name)`; default `ci`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, settings
from hypothesis import core as hypothesis_core


@dataclass(frozen=True, kw_only=True)
class Sizes:
    max_batch: int
    max_prefix: int
    max_extend: int
    max_encoder: int
    max_draft: int
    max_window: int
    head_dims: tuple[int, ...]
    heads: tuple[tuple[int, int], ...]  # (q heads, kv heads): MHA, GQA, MQA
    dtypes: tuple[str, ...]
    long_kv: int = 0  # occasionally draw a prefix this long (0: never)


SIZES = {
    "ci": Sizes(
        max_batch=4,
        max_prefix=160,
        max_extend=48,
        max_encoder=48,
        max_draft=6,
        max_window=40,
        head_dims=(32, 64),
        heads=((4, 4), (8, 2), (4, 1)),
        dtypes=("bfloat16", "float16"),
    ),
    "dev": Sizes(
        max_batch=6,
        max_prefix=600,
        max_extend=128,
        max_encoder=128,
        max_draft=8,
        max_window=160,
        head_dims=(64, 128),
        heads=((4, 4), (8, 2), (8, 1)),
        dtypes=("bfloat16", "float16"),
    ),
    "gpu": Sizes(
        max_batch=8,
        max_prefix=2048,
        max_extend=512,
        max_encoder=512,
        max_draft=8,
        max_window=700,
        head_dims=(128,),
        heads=((8, 8), (8, 2), (8, 1)),
        dtypes=("bfloat16",),
        long_kv=4096,
    ),
    "thorough": Sizes(
        max_batch=16,
        max_prefix=8192,
        max_extend=1024,
        max_encoder=1024,
        max_draft=16,
        max_window=3000,
        head_dims=(64, 128, 256),
        heads=((4, 4), (8, 2), (16, 2), (8, 1)),
        dtypes=("bfloat16", "float16"),
        long_kv=16384,
    ),
}

# filter_too_much stays on: a search whose cases are mostly rejected checks little (and a backend's
# refusals are counted besides: harness/search/refusals.py). A failure prints its own repro command
# (results.CaseResult.failure_text), so hypothesis's @reproduce_failure blob and its explain phase
# (which points at the harness's bookkeeping lines, not at the kernel) are off.
SEARCH_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
_COMMON = dict(
    deadline=None,
    print_blob=False,
    phases=SEARCH_PHASES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# The gpu profile searches without hypothesis's target phase. Targeting steers each search's second
# half (past max_examples // 2 valid examples) by the measured err/budget, so which cases, and which
# kernel variants, a GPU check drew depended on that machine's rounding, and the warm-up's recording
# (record mode, which checks nothing and so measures nothing) drew fresh cases there instead, so a
# check after a complete flex_compiled warm-up still compiled graphs the warm-up never saw.
# Without it a gpu check draws the same cases on every machine, and the warm-up compiles those.
GPU_PHASES = tuple(p for p in SEARCH_PHASES if p != Phase.target)

settings.register_profile("ci", max_examples=12, derandomize=True, database=None, **_COMMON)
settings.register_profile("dev", max_examples=60, **_COMMON)
settings.register_profile(
    "gpu", max_examples=40, derandomize=True, database=None, **(_COMMON | {"phases": GPU_PHASES})
)
settings.register_profile("thorough", max_examples=1000, **_COMMON)
# A mutant search stops at its first failure; shrinking is kept short so detection stays cheap.
settings.register_profile(
    "mutant",
    max_examples=200,
    derandomize=True,
    database=None,
    **(_COMMON | {"phases": (Phase.explicit, Phase.generate, Phase.shrink)}),
)

PROFILES = tuple(SIZES)
SEED_ENV = "ATTN_HARNESS_SEED"  # a split check's seed instead of derandomized draws (empty: none)


def _without_local_constants() -> None:
    """Hypothesis mixes constants read from the source of every module outside site-packages into
    its draws, so a plugin's own source, or a checkout instead of an installed wheel, changed what a
    fixed-seed profile draws. The suite draws with hypothesis's own constants only."""
    from hypothesis.internal.conjecture import providers

    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    providers.CONSTANTS_CACHE.cache.clear()


_without_local_constants()


_LOADED = ["ci"]  # the profile `load` activated last


def load(name: str | None = None) -> str:
    """Activate a profile (default 'ci'); returns its name. A suite process passes the one its
    settings name (ATTN_HARNESS_PROFILE, harness/run/speed/settings.py)."""
    name = name or "ci"
    if name not in SIZES:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(SIZES)}")
    settings.load_profile(name)
    _LOADED[0] = name
    return name


def current() -> str:
    """The active profile's name, if it is one of ours; 'ci' otherwise."""
    getter = getattr(settings, "get_current_profile_name", None)
    name = getter() if getter else _LOADED[0]
    return name if name in SIZES else "ci"


def fix_draws() -> None:
    """Make the active profile draw the same cases on every machine (no example database): a CI share
    must draw what the same share draws on any other runner. Derandomized (the same set for a given
    source and release, run after run), or, where SEED_ENV gives a seed, seeded with it: a nightly
    passes a new seed each night, so it explores new draws and its shares still agree."""
    name = current()
    seed = os.environ.get(SEED_ENV) or None
    if seed is not None and not seed.strip().isdigit():
        raise ValueError(f"${SEED_ENV}={seed!r} must be a non-negative integer")
    fixed = {"derandomize": seed is None, "database": None}
    settings.register_profile(name, parent=settings.get_profile(name), **fixed)
    settings.load_profile(name)
    if seed is not None:
        hypothesis_core.global_force_seed = int(seed)


def derandomized(name: str | None = None) -> bool:
    """Whether profile `name` (default: the active one) draws a fixed set of cases, the same for a
    given source and release on every run, as ci and gpu do; a nightly thorough run explores."""
    return bool((settings.get_profile(name) if name else settings()).derandomize)


def seeded() -> bool:
    """Whether SEED_ENV gives a split check its seed (fix_draws)."""
    return bool(os.environ.get(SEED_ENV))


def steers_by_target() -> bool:
    """Whether the active profile's searches run hypothesis's target phase. Only then does the suite
    report err/budget to `target()`: hypothesis's generate phase also weighs reported targets (a
    mutated example is kept only if it scores as high), so reporting them in a profile without the
    phase would make its draws depend on the values measured, and a record-mode run (which measures
    nothing) or a variant shard (which measures only its own cases) would draw other cases."""
    return Phase.target in settings().phases


def sizes() -> Sizes:
    return SIZES[current()]
