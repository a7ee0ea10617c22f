"""CUDA-graph replay: each capturable backend's graph path captured at the engine's batch sizes and
replayed over sequences of batches, every replay checked against the references (and bitwise against
the eager run in deterministic mode). Non-capturable backends skip with their reason."""

import pytest

from harness.run.graph_suite import params, run


@pytest.mark.parametrize("target", params())
def test_graph(target, record):
    run(target, record)
