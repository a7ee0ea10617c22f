"""ENCODER_ONLY: bidirectional self-attention over each request's own tokens (embedding and reranking
models); no window, a left window, or a two-sided one (window_right)."""

import pytest

from harness.run.suite import family_params, run_family


@pytest.mark.parametrize("target", family_params("encoder"))
def test_encoder(target, record):
    run_family(target, record)
