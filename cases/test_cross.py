"""CROSS: decoder queries over encoder keys, non-causal, no window; a prefill batch or one decoder step."""

import pytest

from harness.run.suite import family_params, run_family


@pytest.mark.parametrize("target", family_params("cross"))
def test_cross(target, record):
    run_family(target, record)
