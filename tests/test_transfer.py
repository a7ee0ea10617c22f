"""Host values reach the device without the host waiting for the GPU (harness/core/transfer.py).

On the CPU: the values and dtypes arrive. On CUDA (skipped, with the reason, without it): under
torch's sync debug mode set to raise, the transfers, the metadata upload and the per-call glue that
uses them (flex's launch packing, torch_native's mask) run without a sync.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.backends.flex_eager import FlexEager
from harness.backends.torch_native import TorchNative
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case, Request
from harness.core.metadata import upload_int32
from harness.core.modes import Mode
from harness.core.transfer import copy_into, to_device


def test_values_and_dtypes_arrive_on_the_cpu():
    host = np.array([3, -1, 7], dtype=np.int32)
    t = to_device(host, "cpu")
    assert t.dtype == torch.int32 and t.tolist() == [3, -1, 7]
    assert to_device(torch.tensor(2.5), "cpu").item() == 2.5
    dst = torch.zeros(3, dtype=torch.int64)
    copy_into(dst, np.array([4, 5, 6], dtype=np.int64))
    assert dst.tolist() == [4, 5, 6]


CUDA = torch.cuda.is_available()
TREE = (-1, 0, 0, 1)
CASES = {
    "prefix-window-cap": Case(
        mode="EXTEND",
        requests=(Request(40, 9), Request(0, 5)),
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=64,
        window_left=7,
        soft_cap=20.0,
    ),
    "verify-tree": Case(
        mode="TARGET_VERIFY",
        requests=(Request(30, 4, tree=TREE), Request(9, 4, tree=TREE)),
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=64,
    ),
}


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA: a host sync exists only on a GPU")
def test_transfers_do_not_sync():
    host = np.arange(10, dtype=np.int32)
    torch.cuda.set_sync_debug_mode("error")
    try:
        t = to_device(host, "cuda")
        dst = torch.empty(10, dtype=torch.int32, device="cuda")
        copy_into(dst, host[::-1].copy())
        parts = upload_int32(torch.device("cuda"), [[1, 2, 3], np.ones((2, 3), dtype=np.int32)])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert t.tolist() == list(range(10)) and dst.tolist() == list(range(9, -1, -1))
    assert parts[0].tolist() == [1, 2, 3] and parts[1].shape == (2, 3)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA: a host sync exists only on a GPU")
@pytest.mark.parametrize("label", list(CASES))
def test_per_call_glue_does_not_sync(label):
    case = CASES[label]
    batch = build_batch(case, make_inputs(case, "cuda"), "cuda")
    flex, native = FlexEager(), TorchNative()
    requests = list(range(len(case.requests)))
    verify = case.mode == Mode.TARGET_VERIFY
    torch.cuda.set_sync_debug_mode("error")
    try:
        if not verify:  # a verify launch reads the tree mask back to the host: that read syncs
            flex.pack(batch, requests)
        native.build_mask(batch, 0, *native.key_ranges(batch)[0])
    finally:
        torch.cuda.set_sync_debug_mode("default")


FAULT = "CUDA error: an illegal memory access was encountered"


def _faults_on_call(n: int):
    """A settle() that raises a late kernel fault on its n-th call (1-based), as a GPU would."""
    calls = []

    def settle(device):
        calls.append(device)
        if len(calls) == n:
            raise RuntimeError(FAULT)

    return settle


def test_a_fault_the_device_reports_late_is_the_backends_crash_in_a_case(monkeypatch):
    from harness.checks import numeric

    monkeypatch.setattr(numeric, "settle", _faults_on_call(1))
    case = CASES["prefix-window-cap"]
    res = numeric.check_case(TorchNative(), case, "cpu")
    assert res.status == "crash" and FAULT in res.reason


def test_a_fault_the_device_reports_late_is_the_replays_crash(monkeypatch):
    from harness.backends.flex_compiled import FlexCompiled
    from harness.checks import replay
    from harness.core.graph_case import GraphCase

    flex = FlexCompiled()
    flex.cpu_in_suite = True
    g = GraphCase((Case(mode="DECODE", requests=(Request(9, 1), Request(3, 1)), head_dim=64),), 2, 40)
    monkeypatch.setattr(replay, "settle", _faults_on_call(2))  # capture settles, then replay 0 faults
    res = replay.replay_result(flex, g, "cpu")
    assert res.status == "crash" and res.reason.startswith("replay 0: ") and FAULT in res.reason


def test_a_fault_the_device_reports_late_is_the_model_checks_crash(monkeypatch):
    from harness.checks.model import check, serving

    monkeypatch.setattr(serving, "settle", _faults_on_call(3))  # the third forward's
    res = check.check_model(TorchNative(), "mistral", "cpu", determinism=False)
    assert res.status == "crash" and FAULT in res.reason and res.reason.startswith("crashed in ")
