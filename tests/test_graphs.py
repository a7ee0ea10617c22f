"""The CPU graph emulator (harness/backends/graphs.py) keeps CUDA graph semantics: Python values frozen at
capture, buffers read anew at every replay, host syncs refused during capture, library kernels
replayed as opaque nodes on their recorded arguments."""

from __future__ import annotations

import pytest
import torch

from harness.backends.graphs import EmulatedGraph, GraphCaptureError, kernel


def test_a_python_value_is_frozen_at_capture():
    x = torch.arange(8.0)
    n = {"len": 3, "scale": 2.0}
    g = EmulatedGraph()
    out = g.capture(lambda: x[: n["len"]].sum() * n["scale"])
    n["len"], n["scale"] = 8, 10.0
    g.replay()
    assert float(out) == (0 + 1 + 2) * 2.0


def test_a_buffer_update_is_seen_at_replay():
    x = torch.arange(8.0)
    g = EmulatedGraph()
    out = g.capture(lambda: (x * 2).cumsum(0)[-1] + 1)
    assert float(out) == 57.0
    x.copy_(torch.ones(8))
    assert float(out) == 57.0  # nothing runs until the replay
    g.replay()
    assert float(out) == 17.0


def test_in_place_writes_replay_into_their_buffers():
    pool = torch.zeros(6)
    slots = torch.tensor([1, 2])
    vals = torch.tensor([5.0, 7.0])
    g = EmulatedGraph()
    g.capture(lambda: pool.index_put_((slots,), vals))
    pool.zero_()
    slots.copy_(torch.tensor([4, 0]))
    vals.copy_(torch.tensor([3.0, 9.0]))
    g.replay()
    assert pool.tolist() == [9.0, 0, 0, 0, 3.0, 0]


@pytest.mark.parametrize("sync", [lambda t: t[0].item(), lambda t: int(t[1]), lambda t: t.nonzero()])
def test_a_host_sync_during_capture_raises(sync):
    t = torch.tensor([1, 2])
    g = EmulatedGraph()
    with pytest.raises(GraphCaptureError, match="not permitted when stream is capturing"):
        g.capture(lambda: sync(t))


def test_a_kernel_is_one_node_reading_buffers_at_replay_with_frozen_scalars():
    calls = []

    @kernel
    def scaled_prefix_sum(buf: torch.Tensor, lens: torch.Tensor, scale: float, rows: list) -> torch.Tensor:
        calls.append(scale)
        n = int(lens[0])  # a kernel reads device memory: no host sync of the capture
        return buf[:n].sum().reshape(1) * scale + len(rows)

    buf, lens = torch.arange(6.0), torch.tensor([2])
    rows = [0, 1]
    g = EmulatedGraph()
    out = g.capture(lambda: scaled_prefix_sum(buf, lens, 3.0, rows) + 0)
    lens.fill_(4)
    rows.append(2)  # a Python list argument is frozen too
    g.replay()
    assert float(out) == (0 + 1 + 2 + 3) * 3.0 + 2
    assert calls == [3.0, 3.0, 3.0]  # warm-up, capture, replay: no recording of its inner ops
