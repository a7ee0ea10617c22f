"""The GPU fast paths against their CPU counterparts: the batch built on the device, the padded
reference, and inputs drawn on the device. Skips on a machine without CUDA."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings

from harness.backends import load
from harness.core.batch import build_batch, make_inputs
from harness.core.modes import FAMILIES
from harness.search.profiles import SIZES
from harness.search.strategies import ALL_CAPS, cases
from references.torch_ref import reference
from tests.helpers import case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False"
    ),
]
SMALL = dataclasses.replace(SIZES["gpu"], max_prefix=300, max_extend=64, long_kv=0)


def _tensors(b):
    return {
        f.name: getattr(b, f.name)
        for f in dataclasses.fields(b)
        if isinstance(getattr(b, f.name), torch.Tensor)
    } | {"pool.k": b.pool.k, "pool.v": b.pool.v}


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
