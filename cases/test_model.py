"""Model level: per-token logprobs of tiny random HF models served step by step through each backend.

Gemma2-, GPT-OSS- and Mistral-like models (harness/checks/model/check.py) run prefill, prefix reuse,
chunked extend, decode past the window, DRAFT_EXTEND_V2 and verify over a persistent paged KV cache;
every query's logprob is compared with the model's own eager forward, and in deterministic mode a
request's logprobs must not move with the batch composition.

Ids read `test_model_logprobs[<backend>-<device>-<model>]` and carry only the backend and `gpu`
markers: no family keyword occurs in them, so `-k swa` or `-k decode` leave them out and
`-k <backend>` selects them. Under the `ci` profile the CPU runs torch_native only (CI's promise);
other CPU backends run under the other profiles (flex_eager takes ~40 s a model on the CPU). On
CUDA each check runs, within its own test, in the worker process the suite's cases run in
(harness/run/isolation.py: torch, CUDA and the backend are loaded there already), so a kernel that
kills its CUDA context fails its own test, not the rest of the session (harness/checks/model/table.py),
and a backend whose library is broken raises in its test before any check is sent there. Each check is a
results.json record of family `model` (docs/reports.md), in the summary, index.html and junit.xml.
"""

import pytest

from harness import backends
from harness.checks.model.check import MODELS, check_model
from harness.checks.model.table import PRELOAD, run_jobs
from harness.run import isolation
from harness.run.workers import Worker
from harness.search import profiles

CUDA_JOB_TIMEOUT = 900.0  # seconds per model check, a first JIT compile included


def _params() -> list:
    out = []
    for name in backends.selected():  # `check --backend` (and each `--jobs` part) runs its own only
        for device in sorted(backends.load(name).capabilities.devices):
            marks = [getattr(pytest.mark, name)] if name.isidentifier() else []  # a spec is no marker
            marks += [pytest.mark.gpu] if device == "cuda" else []
            for model in MODELS:
                out.append(pytest.param(name, device, model, id=f"{name}-{device}-{model}", marks=marks))
    return out


@pytest.fixture(scope="session")
def cuda_model_worker():
    """Where the CUDA model checks run, each within its own test (so its wall time is its own): this
    process's isolation worker, or where isolation is off one of their own for the session."""
    if isolation.enabled("cuda"):
        yield isolation.runner_for("cuda").worker
        return
    worker = Worker(preload=PRELOAD)
    yield worker
    worker.stop()


@pytest.mark.parametrize(("backend_name", "device", "model"), _params())
def test_model_logprobs(backend_name, device, model, request, record):
    backend = backends.load(backend_name)
    why = backend.available(device)
    if why:
        pytest.skip(why)
    if device == "cpu" and backend_name != "torch_native" and profiles.current() == "ci":
        pytest.skip("the ci profile runs the CPU model-level check on torch_native only")
    if device == "cuda":
        worker = request.getfixturevalue("cuda_model_worker")
        (res,) = run_jobs([(backend_name, model)], "cuda", CUDA_JOB_TIMEOUT, worker=worker)
    else:
        res = check_model(backend, model, device)
    record(res)  # a model-level row of results.json and the reports
    if res.status == "skip":
        pytest.skip(res.reason)
    why = f"{model} served by {backend_name} on {device}: {res.status}: {res.reason}"
    assert res.status in ("pass", "xfail"), why  # xfail: a known library bug on this release
