"""Host values reach the device without the host waiting for the GPU (harness/core/transfer.py).

On the CPU: the values and dtypes arrive. On CUDA (skipped, with the reason, without it): under
torch's sync debug mode set to raise, the transfers, the metadata upload and the per-call glue that
uses them (flex's launch packing, torch_native's mask) run without a sync; the GPU fast paths equal
their CPU counterparts: the batch built on the device, the padded reference, and inputs drawn on the
device."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from harness.backends import load
from harness.backends.flex_eager import FlexEager
from harness.backends.torch_native import TorchNative
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case, Request
from harness.core.metadata import upload_int32
from harness.core.modes import FAMILIES, Mode
from harness.core.transfer import copy_into, to_device
from harness.search.profiles import SIZES
from harness.search.strategies import ALL_CAPS, cases
from references.torch_ref import reference
from tests.helpers import case


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


ON_GPU = pytest.mark.skipif(not CUDA, reason="no CUDA device: torch.cuda.is_available() is False")
SMALL = dataclasses.replace(SIZES["gpu"], max_prefix=300, max_extend=64, long_kv=0)


def _tensors(b):
    return {
        f.name: getattr(b, f.name)
        for f in dataclasses.fields(b)
        if isinstance(getattr(b, f.name), torch.Tensor)
    } | {"pool.k": b.pool.k, "pool.v": b.pool.v}


@pytest.mark.gpu
@ON_GPU
@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_built_on_the_gpu_equals_the_cpu_batch(family):
    """Same inputs, same layout: every tensor (pool poison and canaries included) bit for bit."""

    @settings(max_examples=15, derandomize=True, database=None, deadline=None)
    @given(cases(family, family != "cross", ALL_CAPS, SMALL))
    def check(c):
        inputs = make_inputs(c)
        for wpl in (False, True):
            cpu, gpu = build_batch(c, inputs, "cpu", wpl), build_batch(c, inputs, "cuda", wpl)
            for name, t in _tensors(cpu).items():
                g = _tensors(gpu)[name]
                assert g.device.type == "cuda", name
                assert torch.equal(t.view(torch.uint8), g.cpu().view(torch.uint8)), name
            assert gpu.host == cpu.host

    check()


@pytest.mark.gpu
@ON_GPU
@pytest.mark.parametrize("family", FAMILIES)
def test_the_padded_reference_agrees_with_the_loop_on_the_gpu(family):
    @settings(max_examples=15, derandomize=True, database=None, deadline=None)
    @given(cases(family, family != "cross", load("torch_native").capabilities, SMALL))
    def check(c):
        inputs = make_inputs(c, "cuda")
        for precision in ("exact", "native"):
            loop = reference(c, inputs, precision, "cuda", padded=False)
            pad = reference(c, inputs, precision, "cuda", padded=True)
            scale = max(1.0, float(loop.out.abs().max()))
            # exact: float32 sums in another order; native: a rounding to the dtype may flip
            dt = torch.float32 if precision == "exact" else getattr(torch, c.dtype)
            bound = (64 if precision == "exact" else 2) * torch.finfo(dt).eps
            assert float((loop.out - pad.out).abs().max()) <= bound * scale
            assert torch.equal(torch.isfinite(loop.lse), torch.isfinite(pad.lse))

    check()


@pytest.mark.gpu
@ON_GPU
def test_inputs_drawn_on_the_gpu_replay_and_stay_on_it():
    c = case("EXTEND", ((30, 20), (0, 5)), head_dim=128, num_q_heads=8, num_kv_heads=2, sinks=True)
    a, b = make_inputs(c, "cuda"), make_inputs(c, "cuda")
    assert all(t.device.type == "cuda" for t in a.q + a.k + a.v)
    assert all(torch.equal(x, y) for x, y in zip(a.q + a.k + a.v, b.q + b.k + b.v))


class _HostCopies(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the copies from host memory to the GPU (each waits for the GPU's queue)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        srcs = [a for a in args if isinstance(a, torch.Tensor)]
        if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default) and isinstance(
            out, torch.Tensor
        ):
            src = srcs[-1] if func is torch.ops.aten.copy_.default else srcs[0]
            self.n += src.device.type == "cpu" and out.device.type == "cuda"
        elif any(a.device.type == "cpu" and a.dim() > 0 for a in srcs) and isinstance(out, torch.Tensor):
            self.n += out.device.type == "cuda" and any(a.device.type == "cuda" for a in srcs)
        return out


@pytest.mark.gpu
@ON_GPU
@pytest.mark.parametrize("family", FAMILIES)
def test_building_a_batch_copies_from_the_host_once(family):
    """Every integer a batch needs on the GPU (metadata, pool slots, canary slots, the tree mask)
    goes in one copy: a pageable copy waits for the GPU, so each extra one costs a round trip."""

    @settings(max_examples=6, derandomize=True, database=None, deadline=None)
    @given(cases(family, family != "cross", ALL_CAPS, SMALL))
    def check(c):
        inputs = make_inputs(c, "cuda")
        for wpl in (False, True):
            with _HostCopies() as copies:
                build_batch(c, inputs, "cuda", wpl)
            assert copies.n == 1, (copies.n, c.to_dict())

    check()
