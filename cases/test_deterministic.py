"""Deterministic mode: a request's output is bitwise the same alone, permuted, between requests of very
different lengths, and in batches of 1 to 64, for every backend that declares deterministic."""

import pytest

from harness.run.determinism import params, run


@pytest.mark.parametrize("target", params())
def test_deterministic(target, record):
    run(target, record)
