"""TARGET_VERIFY: draft chains and trees (topk > 1); seq_lens = P, KV extent P + num_draft.

The window applies by tree depth, not by flattened index.
"""

import pytest

from harness.run.suite import family_params, run_family


@pytest.mark.parametrize("target", family_params("verify"))
def test_verify(target, record):
    run_family(target, record)
