"""DECODE: one new token per request, seq_lens = P + 1."""

import pytest

from harness.run.suite import family_params, run_family


@pytest.mark.parametrize("target", family_params("decode"))
def test_decode(target, record):
    run_family(target, record)
