"""DRAFT_EXTEND_V2: num_draft tokens per request; the KV extent is the bumped seq_lens = P + num_draft."""

import pytest

from harness.run.suite import family_params, run_family


@pytest.mark.parametrize("target", family_params("draft_extend_v2"))
def test_draft_extend_v2(target, record):
    run_family(target, record)
