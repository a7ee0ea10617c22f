"""EXTEND: `prefill` (no cached tokens) and `prefix` (an extend over a cached prefix)."""

import pytest

from harness.run.suite import family_params, run_family


@pytest.mark.parametrize("target", family_params("prefill"))
def test_prefill(target, record):
    run_family(target, record)


@pytest.mark.parametrize("target", family_params("prefix"))
def test_prefix(target, record):
    run_family(target, record)
