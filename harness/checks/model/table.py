"""python -m harness.checks.model.table: the model-level check over every backend, as a table.

    python -m harness.checks.model.table [--device cuda] [--backend NAME ...] [--model NAME ...]
                                         [--dtype bfloat16] [--model-dtype float32]
                                         [--json PATH] [--timeout SECONDS]

Jobs (backend x model) run in a worker process (harness/run/workers.py). A job that crashes the
worker or runs past the time limit becomes a `crash` row, and a new worker goes on with the
remaining jobs (a CUDA context that saw an illegal memory access is unusable), so one broken
backend never hides the others' results.
Exit status: 0 if no job failed or crashed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable

from harness.checks.model.check import MODELS, TABLE_HEAD, ModelResult, fallback_summary
from harness.core.vocab import DTYPES
from harness.run.workers import Outcome, Worker, WorkerError, describe_exit

PRELOAD = ("torch", "harness.backends", "harness.checks.model.check")
OUTPUT_LINES = 20  # of the worker's output, in a crash row


def job(name: str, model: str, device: str, dtype: str | None, model_dtype: str) -> ModelResult:
    """One job, in the worker: the model-level check of backend `name` on `model`."""
    import torch

    from harness import backends
    from harness.checks.model.check import check_model

    attn, dense = (getattr(torch, d) if d else None for d in (dtype, model_dtype))
    try:
        return check_model(backends.load(name), model, device, attn, dense)
    except Exception as e:  # the harness itself broke: report it as this job's crash
        return ModelResult(
            model=model, backend=name, device=device, status="crash", reason=f"{type(e).__name__}: {e}"
        )


def _crash_reason(out: Outcome, timeout: float) -> str:
    """Why a job left no result, with the last lines the worker printed."""
    if out.kind == "timeout":
        why = f"no result within {timeout:.0f} s"
    elif out.kind == "raised":
        why = out.error_line
    elif out.code is not None and out.code >= 0:
        why = f"worker exited with status {out.code}"
    else:
        why = f"worker {describe_exit(out.code)}"
    return f"{why}: {' | '.join(out.output.splitlines()[-OUTPUT_LINES:])}"


def run_jobs(
    jobs: list[tuple[str, str]],
    device: str,
    timeout: float,
    dtype: str | None = None,
    model_dtype: str = "float32",
    on_result: Callable[[ModelResult], None] | None = None,
    worker: Worker | None = None,
) -> list[ModelResult]:
    """Run every job in a worker, replaced after a crash (on CUDA also after a crash row: the
    context is dead) or a job past `timeout` seconds. `dtype`: attention's (None: the device's
    default); `model_dtype`: the dense layers'. `on_result` sees each result as it arrives (so a
    run cut short still shows what finished). `worker`: one the caller keeps (the suite passes its
    isolation worker, whose process has torch, CUDA and the backend's kernels loaded already), left
    running at the end; by default a worker of its own, stopped at the end."""
    results: list[ModelResult] = []
    own = worker is None
    worker = worker or Worker(preload=PRELOAD)
    try:
        for name, model in jobs:
            try:
                out = worker.call(job, (name, model, device, dtype, model_dtype), timeout)
            except WorkerError as e:  # the worker could not even start
                out = Outcome(kind="raised", error=str(e).splitlines()[0])
            if out.kind == "ok":
                res = out.value
                if res.status == "crash" and device == "cuda":
                    worker.stop()
            else:
                res = ModelResult(
                    model=model,
                    backend=name,
                    device=device,
                    status="crash",
                    reason=_crash_reason(out, timeout),
                )
            results.append(res)
            if on_result:
                on_result(res)
    finally:
        if own:
            worker.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.checks.model.table", description=__doc__)
    p.add_argument("--device", default=None, help="cuda if available, else cpu")
    p.add_argument("--backend", action="append", help="backend name (repeatable; default: all)")
    p.add_argument("--model", action="append", choices=sorted(MODELS), help="model (default: all)")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per job (first JIT included)")
    p.add_argument("--dtype", choices=DTYPES, help="attention (default: bfloat16 on CUDA, else float32)")
    p.add_argument("--model-dtype", choices=DTYPES, default="float32", help="weights and dense layers")
    args = p.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    from harness import backends

    names = args.backend or backends.names()
    jobs = [(n, m) for n in names for m in (args.model or list(MODELS))]
    print(f"{len(jobs)} model checks on {device}; rows as they finish:\n{TABLE_HEAD}", flush=True)
    rows = run_jobs(
        jobs, device, args.timeout, args.dtype, args.model_dtype, lambda r: print(r.row(), flush=True)
    )
    print(f"\n{TABLE_HEAD}")
    for r in rows:
        print(r.row())
    print()
    for r in rows:
        print(f"{r.model} on {r.backend}: {r.status}: {r.reason}")
        if r.fallback:
            print(f"    steps served by torch_native instead: {fallback_summary(r.fallback)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in rows], f, indent=1)
    return 0 if all(r.status in ("pass", "skip") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
