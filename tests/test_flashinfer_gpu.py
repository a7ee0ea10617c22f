"""On the GPU: every FlashInfer mutant is caught, and every healthy adapter is batch-invariant.

Numeric mutants are hunted with the suite's own strategies under the `gpu` profile (bf16,
head_dim 128: only the JIT variants the warm-up builds). The split mutants are caught by the
batch-invariance check on long KV. Skipped, with the reason, without CUDA or a supported flashinfer.
"""

from __future__ import annotations

import pytest
import torch

from harness import backends
from harness.backends.flashinfer_glue import (
    KERNEL_BACKEND,
    PREFILL_NOT_INVARIANT,
    why_unavailable,
    workspace,
)
from harness.checks.invariance import check_invariance, compositions
from harness.checks.numeric import check_case
from harness.core.case import Case, Request
from harness.mutants import by_name, catalogue, hunt
from harness.mutants.flashinfer import CAUGHT_BY_INVARIANCE
from harness.search import profiles

SKIP = (
    "no CUDA device: torch.cuda.is_available() is False"
    if not torch.cuda.is_available()
    else why_unavailable()
)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(SKIP is not None, reason=str(SKIP))]

LONG_KV = 4096
NUMERIC = [
    (m, f)
    for m in catalogue()
    if m.name.startswith("flashinfer") and m.check == "numeric"
    for f in m.families
]
DET = dict(head_dim=128, deterministic=True)
HEALTHY = {
    "paged-verify-tree-swa": (
        "flashinfer_paged",
        Case(
            mode="TARGET_VERIFY", requests=(Request(5000, 5, tree=(-1, 0, 0, 1, 2)),), window_left=4200, **DET
        ),
    ),
    "paged-draft_extend_v2": (
        "flashinfer_paged",
        Case(mode="DRAFT_EXTEND_V2", requests=(Request(5000, 4), Request(9, 4)), **DET),
    ),
    "dec_tc-verify-chain": (
        "flashinfer_dec_tc",
        Case(mode="TARGET_VERIFY", requests=(Request(5000, 4, tree=(-1, 0, 1, 2)),), **DET),
    ),
    "enc-decoder-step": (
        "flashinfer_enc",
        Case(mode="CROSS", requests=(Request(7, 1, 6000), Request(3, 1, 70)), **DET),
    ),
}
# A CROSS prefill whose neighbours move fa2's query tile (found by cases/test_deterministic.py).
PREFILL_TILE_CASE = Case(mode="CROSS", requests=(Request(0, 24, 6000), Request(0, 5, 70)), **DET)


def _qo_tile(qo_lens: list[int], group: int) -> int:
    """FlashInfer fa2's query tile for head_dim 128 (FA2DetermineCtaTileQ): from the batch's mean."""
    avg = sum(q * group for q in qo_lens) // len(qo_lens)
    return 128 if avg > 64 else 64 if avg > 16 else 16


def _tiles(case: Case, failing: str | None) -> tuple[int, int] | None:
    """fa2's query tile for the target alone and in the failing batch (a reduction order per batch)."""
    group = case.num_q_heads // case.num_kv_heads
    for name, reqs, _ in compositions(case, LONG_KV):
        if name == failing:
            alone = _qo_tile([case.requests[0].extend_len], group)
            return alone, _qo_tile([r.extend_len for r in reqs], group)
    return None


def _explain(case: Case, failing: str | None) -> str:
    tiles = _tiles(case, failing)
    return f"; fa2 query tile alone {tiles[0]}, in '{failing}' {tiles[1]}" if tiles else ""


@pytest.mark.parametrize("mutant,family", NUMERIC, ids=[f"{m.name.split('~')[1]}@{f}" for m, f in NUMERIC])
def test_mutant_is_caught(mutant, family):
    profiles.load("gpu")
    d = hunt(mutant, family)
    print(
        f"\n{mutant.name} on {family}: caught={d.caught} after {d.examples} examples, {d.seconds:.1f}s; "
        f"shrunk to {d.shrunk.to_json() if d.shrunk else None}; {d.reason}"
    )
    assert d.caught, f"mutant {mutant.name} ({mutant.bug}) survived {d.examples} examples of {family}"


# A long encoder request (FlashInfer splits its key range) next to a short one, both non-causal paths.
ENCODER_LONG = Case(mode="ENCODER_ONLY", requests=(Request(0, 6000), Request(0, 40)), head_dim=128)


@pytest.mark.parametrize("window", [-1, 1000])
@pytest.mark.parametrize("name", ["flashinfer_ragged", "flashinfer_paged"])
def test_a_long_encoder_request_passes(name, window):
    res = check_case(backends.load(name), ENCODER_LONG.replace(window_left=window), "cuda")
    print(f"\n{name} encoder 6000 + 40 tokens, window_left {window}: {res.reason}")
    assert res.status == "pass", res.failure_text()


@pytest.mark.parametrize("name", sorted(CAUGHT_BY_INVARIANCE))
def test_split_mutant_breaks_batch_invariance_where_the_healthy_adapter_keeps_it(name):
    mutant = by_name(name)
    case = CAUGHT_BY_INVARIANCE[name]
    healthy = check_invariance(backends.load(name.split("~")[0]), case, "cuda", LONG_KV)
    broken = check_invariance(mutant.make(), case, "cuda", LONG_KV)
    print(f"\n{name}: healthy: {healthy.reason}; mutant: {broken.reason}")
    assert healthy.passed, healthy.reason + _explain(case, healthy.failing)
    assert not broken.passed, f"{name} ({mutant.bug}) stayed batch-invariant: {broken.reason}"


@pytest.mark.parametrize("label", sorted(HEALTHY))
def test_healthy_adapter_is_batch_invariant(label):
    name, case = HEALTHY[label]
    res = check_invariance(backends.load(name), case, "cuda", LONG_KV)
    print(f"\n{label}: {res.reason}")
    assert res.passed, res.reason + _explain(case, res.failing)


def test_fa2_prefill_tile_follows_the_batch():
    """Why EXTEND and CROSS prefill declare no deterministic mode: the request moves with its batch.

    If a FlashInfer release keeps the query tile fixed, this fails: declare the mode again.
    """
    enc = backends.load("flashinfer_enc")
    assert enc.supports(PREFILL_TILE_CASE) == PREFILL_NOT_INVARIANT
    enc.supports = lambda case: None  # run what the adapter refuses
    res = check_invariance(enc, PREFILL_TILE_CASE, "cuda", LONG_KV)
    print(f"\nCROSS prefill: {res.reason}{_explain(PREFILL_TILE_CASE, res.failing)}")
    assert not res.passed, f"fa2 prefill stayed batch-invariant: {res.reason}"
    alone, there = _tiles(PREFILL_TILE_CASE, res.failing)
    assert alone != there, f"moved without a change of query tile ({alone}): {res.reason}"


@pytest.mark.parametrize("tensor_cores", [False, True], ids=["decode_cc", "decode_tc"])
def test_plain_fa2_wrappers_drop_sinks(tensor_cores):
    """Why only flashinfer_paged declares sinks: the plain fa2 paths take `sinks=` and ignore it."""
    import flashinfer

    ws = workspace(torch.device("cuda"))
    k = torch.randn(4, 16, 2, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    q = torch.randn(2, 8, 128, dtype=torch.bfloat16, device="cuda")
    sinks = torch.full((8,), 5.0, device="cuda")
    dec = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws, "NHD", use_tensor_cores=tensor_cores, backend=KERNEL_BACKEND
    )
    i32 = dict(dtype=torch.int32)
    dec.plan(
        torch.tensor([0, 2, 4], **i32),
        torch.tensor([0, 1, 2, 3], **i32),
        torch.tensor([16, 9], **i32),
        8,
        2,
        128,
        16,
        q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16,
    )
    plain = dec.run(q, (k, v))
    with_sinks = dec.run(q, (k, v), sinks=sinks)
    assert torch.equal(plain, with_sinks), (
        "this decode path now honours sinks: declare them in flashinfer_dec"
    )


def test_sink_module_name_collision_is_there_on_exactly_the_releases_its_known_issue_names(tmp_path):
    """flashinfer_paged names each sink variant's module itself, so the suite no longer reaches the
    library's collision (known issue flashinfer-sink-module-name); this keeps it in view: FlashInfer's
    own wrapper, a bf16 then an e4m3 cache in one fresh process (its script's child mode), is wrong on
    the releases the entry names and right on any other, where the entry would need updating."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from harness.backends.versions import distribution_version
    from harness.checks.known_issues import KNOWN_ISSUES

    issue = next(i for i in KNOWN_ISSUES if i.id == "flashinfer-sink-module-name")
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(tmp_path)}  # nothing prebuilt shared
    run = subprocess.run(
        [sys.executable, str(root / issue.repro), "bf16", "e4m3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    line = [x for x in run.stdout.splitlines() if x.startswith("max err ")]
    assert line, f"no error printed (exit {run.returncode}): {run.stdout[-1500:]}{run.stderr[-1500:]}"
    wrong = float(line[-1].split()[2].rstrip(";")) > 0.05
    release = distribution_version(issue.library)
    if release in issue.versions:
        assert wrong, f"{issue.id} is gone on {release}: drop the release from the entry ({line[-1]})"
    else:
        assert not wrong, f"{issue.id} is there on {release} too: add the release to the entry ({line[-1]})"
