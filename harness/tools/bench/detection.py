"""The bench's detection section: examples and seconds until each mutant of the catalogue first
fails (harness/hunts.py), seed-class mutants (DESIGN.md's bug classes) first."""

from __future__ import annotations

import time
from collections.abc import Callable

from harness import hunts

# DESIGN.md's table: the bug classes the harness exists for. A mutant is seed-class when its bug
# (the name after "~") is one of them; the target is each caught within 30 s on the GPU.
SEED_CLASS_BUGS = frozenset(
    {
        "ragged_no_window",  # SWA extend with prefix: the ragged pass gets no window
        "no_window",
        "prefix_window_at_end",  # ... the paged prefix pass anchors the window at the prefix end
        "prefix_window_only",
        "de_v2_prefix_only",  # DRAFT_EXTEND_V2 cache extent
        "de_v2_double_counted",
        "de_v2_drafts_twice",
        "split_dropped_swa",  # deterministic split parameters dropped
        "split_dropped_cross",
        "window_ignored",  # SDPA fallback ignores the window
        "swa_untranslated",  # hybrid SWA pool indexed with full-pool slots
        "swa_untranslated_exact",
        "swa_tree_untranslated",
    }
)
DETECTION_TARGET_S = 30.0


def seed_class(mutant_name: str) -> bool:
    """Whether the mutant reintroduces one of DESIGN.md's bug classes."""
    return mutant_name.split("~", 1)[-1] in SEED_CLASS_BUGS


def detection(
    device: str,
    backends: list[str] | None,
    max_examples: int,
    budget: float | None,
    progress: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Hunt each mutant that runs on `device` in its first family (as CI does) with
    harness.hunts, under the device's default profile, without shrinking past the first failure.
    Seed-class mutants go first; once `budget` seconds are spent, the remaining hunts are reported
    as skipped, not dropped."""
    pairs = hunts.select(hunts.every_mutant(), backends=backends, first_family=True)
    pairs = [(m, f) for m, f in pairs if device == "cuda" or m.device == "cpu"]
    pairs.sort(key=lambda pair: not seed_class(pair[0].name))  # a budget cuts the others first
    rows = []
    start = time.perf_counter()
    for m, family in pairs:
        if budget is not None and time.perf_counter() - start > budget:
            row = hunts.Row(
                mutant=m.name,
                backend=m.backend,
                device=device,
                family=family,
                check=m.check,
                method=m.method,
                bug=m.bug,
                outcome="skip",
            )
            row.reason = f"detection budget of {budget:g}s spent"
        else:
            (row,) = hunts.run([(m, family)], [device], max_examples, 0, invariance_shrink_runs=0)
        d = row.to_dict()
        d["seed_class"] = seed_class(m.name)
        d["within_target"] = row.outcome == "caught" and row.seconds <= DETECTION_TARGET_S
        rows.append(d)
        if progress:
            progress(d)
    return rows
