"""python -m harness.checks.model_table: the model-level check over every backend, as a table.

    python -m harness.checks.model_table [--device cuda] [--backend NAME ...] [--model NAME ...]
                                         [--dtype bfloat16] [--model-dtype float32]
                                         [--json PATH] [--timeout SECONDS]

Jobs (backend x model) run in a worker process. A job that crashes the worker or runs past the time
limit becomes a `crash` row, and a new worker goes on with the remaining jobs (a CUDA context that
saw an illegal memory access is unusable), so one broken backend never hides the others' results.
Exit status: 0 if no job failed or crashed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from harness.checks.model import MODELS, TABLE_HEAD, ModelResult, fallback_summary

START, DONE = "@@job ", "@@result "
DTYPES = ("bfloat16", "float16", "float32")


def worker(jobs: list[tuple[str, str]], device: str, dtypes: list[str]) -> int:
    """Run jobs in this process, announcing each; stop after a CUDA crash (the context is dead)."""
    import torch

    from harness import backends
    from harness.checks.model import check_model

    attn, dense = (getattr(torch, d) if d else None for d in dtypes)
    for name, model in jobs:
        print(START + json.dumps([name, model]), flush=True)
        try:
            res = check_model(backends.load(name), model, device, attn, dense)
        except Exception as e:  # the harness itself broke: report it as this job's crash
            res = ModelResult(model, name, device, "crash", f"{type(e).__name__}: {e}")
        print(DONE + json.dumps(dataclasses.asdict(res)), flush=True)
        if res.status == "crash" and device == "cuda":
            return 3
    return 0


def _reader(stream, q: queue.Queue) -> None:  # noqa: ANN001 - a text stream
    for line in stream:
        q.put(line)
    q.put(None)


def run_jobs(
    jobs: list[tuple[str, str]],
    device: str,
    timeout: float,
    dtype: str | None = None,
    model_dtype: str = "float32",
    on_result: Callable[[ModelResult], None] | None = None,
) -> list[ModelResult]:
    """Run every job, restarting the worker after a crash or a job past `timeout` seconds.
    `dtype`: attention's (None: the device's default); `model_dtype`: the dense layers'.
    `on_result` sees each result as it arrives (so a run cut short still shows what finished)."""
    results: list[ModelResult] = []

    def add(res: ModelResult) -> None:
        results.append(res)
        if on_result:
            on_result(res)

    todo = list(jobs)
    while todo:
        cmd = [sys.executable, "-m", "harness.checks.model_table", "--worker", "--device", device]
        cmd += ["--model-dtype", model_dtype] + (["--dtype", dtype] if dtype else [])
        proc = subprocess.Popen(
            cmd + ["--jobs", json.dumps(todo)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
        current, started, tail = None, False, []
        deadline, why = time.monotonic() + timeout, ""
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                proc.kill()
                why = f"no result within {timeout:.0f} s"
                break
            if line is None:
                break
            if line.startswith(START):
                current, started, tail = tuple(json.loads(line[len(START) :])), True, []
                deadline = time.monotonic() + timeout
            elif line.startswith(DONE):
                add(ModelResult(**json.loads(line[len(DONE) :])))
                todo.remove(current)
                current = None
            else:
                tail = (tail + [line.rstrip()])[-20:]
        proc.wait()
        why = why or f"worker exited with status {proc.returncode}"
        if current is None and not started:  # the worker could not even start: nothing will run
            current = todo[0]
        if current is not None:
            name, model = current
            add(ModelResult(model, name, device, "crash", f"{why}: {' | '.join(tail)}"))
            todo.remove(current)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.checks.model_table", description=__doc__)
    p.add_argument("--device", default=None, help="cuda if available, else cpu")
    p.add_argument("--backend", action="append", help="backend name (repeatable; default: all)")
    p.add_argument("--model", action="append", choices=sorted(MODELS), help="model (default: all)")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per job (first JIT included)")
    p.add_argument("--dtype", choices=DTYPES, help="attention (default: bfloat16 on CUDA, else float32)")
    p.add_argument("--model-dtype", choices=DTYPES, default="float32", help="weights and dense layers")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--jobs", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.worker:
        return worker([tuple(j) for j in json.loads(args.jobs)], device, [args.dtype, args.model_dtype])
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
