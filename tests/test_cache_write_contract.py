"""The Backend contract's cache write: every backend that runs here leaves this forward's K/V in the
batch's pool at `out_cache_loc` (through `full_to_swa` on a hybrid pool's window layer), as an
engine's attention layer leaves them in its cache (docs/backends.md, "The contract"). The model check
runs its next step over that pool, so a backend that writes only a copy of it (an engine adapter's
own cache, made per run) leaves the next step reading poison. Engine adapters run where their engine
is installed (make test-sglang, make engine-vllm); elsewhere they skip with the reason."""

import pytest
import torch

from harness import backends
from harness.backends.torch_native import TorchNative
from harness.core.batch import build_batch, make_inputs
from harness.core.case import Case, Request
from harness.core.pool import translate_slots
from tests.helpers import AttendsOverACopy

CASES = {
    "decode": Case(mode="DECODE", requests=(Request(40, 1), Request(9, 1))),
    "extend": Case(mode="EXTEND", requests=(Request(20, 5), Request(0, 7))),
    "hybrid window decode": Case(
        mode="DECODE", requests=(Request(40, 1), Request(9, 1)), window_left=7, hybrid_swa_pool=True
    ),
}


def _case_for(backend, case: Case) -> Case:
    """The case in the backend's terms: float32 where it has it, its smallest page size of 16 or more,
    head size 128 (every engine's kernels have it)."""
    caps = backend.capabilities
    dtype = "float32" if "float32" in caps.dtypes else sorted(caps.dtypes)[0]
    page = min((p for p in caps.page_sizes if p >= 16), default=min(caps.page_sizes))
    return case.replace(dtype=dtype, page_size=page, head_dim=128)


def _kv_left_in_pool(backend, case: Case) -> bool:
    """Run the backend on the case; whether the pool then holds this forward's K/V where it wrote them."""
    batch = build_batch(case, make_inputs(case), "cpu", backend.capabilities.whole_page_loads)
    backend.run(batch)
    k, v = batch.pool.read(translate_slots(batch.out_cache_loc, batch.full_to_swa))
    return torch.equal(k, batch.k_new) and torch.equal(v, batch.v_new)


@pytest.mark.parametrize("what", list(CASES))
@pytest.mark.parametrize("name", backends.names())
def test_a_forwards_kv_is_in_the_pool_after_the_run(name, what):
    backend = backends.load(name)
    why = backend.available("cpu")
    if why:
        pytest.skip(why)
    case = _case_for(backend, CASES[what])
    why = backend.supports(case)
    if why:
        pytest.skip(f"{name} does not run this case: {why}")
    assert _kv_left_in_pool(backend, case), f"{name} did not leave this forward's K/V in the batch's pool"


def test_a_backend_that_writes_only_its_own_copy_is_caught():
    case = _case_for(TorchNative(), CASES["decode"])
    assert _kv_left_in_pool(TorchNative(), case)
    assert not _kv_left_in_pool(AttendsOverACopy(), case)
