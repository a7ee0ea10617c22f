"""Every check is shown able to fail: each CPU mutant must be caught, with a shrunk counterexample."""

import pytest

from harness import profiles
from harness.mutants import catalogue, hunt

CPU = [(m, f) for m in catalogue() if m.device == "cpu" for f in m.families]


@pytest.mark.parametrize("mutant,family", CPU, ids=[f"{m.name.split('~')[1]}@{f}" for m, f in CPU])
def test_mutant_is_caught(mutant, family):
    profiles.load("ci")
    d = hunt(mutant, family)
    assert d.caught, f"mutant {mutant.name} ({mutant.bug}) survived {d.examples} examples of {family}"
    assert d.shrunk is not None and d.shrunk.batch_size == 1, d.shrunk
    print(
        f"{mutant.name} on {family}: caught after {d.examples} examples, {d.seconds:.2f}s; "
        f"shrunk to {d.shrunk.to_json()}"
    )
