"""`check --jobs N`: the suite split by backend over N pytest processes, merged into one report.

On a GPU a check is bound by the host (Python, kernel launches, compiling), not by the device: one
pytest process leaves the GPU idle most of the time. Here each backend's suite is its own pytest
process (with its own isolation worker), at most N run at once, the longest first, and their
results files are merged into the run's results.json, from which the report is rendered as usual.
With more jobs than backends each backend is split into `jobs // backends` shards (pytest's
`--harness-shard I/N`), so one backend's suite can use several processes too.
A process's output goes to `<run dir>/parts/<backend>.log`; its results to `parts/<backend>.json`
(a shard's: `parts/<backend>.<I>of<N>.log` and `.json`).
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from harness.core.vocab import STATUSES
from harness.report import results_json
from harness.run.workers import Child

# The longest suites on the H100 (docs/bench.md): started first so that they do not start last.
SLOW_FIRST = ("flex_compiled", "fa4", "flex_eager")
STATUS_EVERY_S = 30.0  # a line naming the running backends, between completions
NO_TESTS = 5  # pytest: nothing collected (a backend with no test under the filters)
INTERRUPTED = 2  # pytest's status for an interrupted run
INTERRUPT_GRACE_S = 20.0  # for an interrupted pytest to write its results


@dataclass
class Part:
    """One backend's pytest process, or one shard of it."""

    backend: str
    results: Path
    log: Path
    shard: int = 0
    shards: int = 1
    child: Child | None = None
    seconds: float = 0.0
    code: int | None = None
    records: list[dict] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """How messages name the part: the backend, and its shard when split (`torch_native[0/2]`)."""
        return self.backend if self.shards == 1 else f"{self.backend}[{self.shard}/{self.shards}]"

    @property
    def args(self) -> list[str]:
        """The pytest options that select this part's tests beyond the backend."""
        return [] if self.shards == 1 else ["--harness-shard", f"{self.shard}/{self.shards}"]


def order(names: list[str]) -> list[str]:
    """The backends in start order: the known-slow ones first (in SLOW_FIRST's order), then the rest."""
    slow = [n for n in SLOW_FIRST if n in names]
    return slow + [n for n in names if n not in slow]


def combined_code(codes: list[int]) -> int:
    """One exit status for the run: a failure (or worse) in any part wins; 5 only if every part
    collected nothing; a part killed by a signal counts as an internal error (3)."""
    bad = [3 if c < 0 else c for c in codes if c not in (0, NO_TESTS)]
    if bad:
        return max(bad)
    return NO_TESTS if codes and all(c == NO_TESTS for c in codes) else 0


def counts(records: list[dict]) -> str:
    found = {s: sum(r["status"] == s for r in records) for s in STATUSES}
    return ", ".join(f"{n} {s}" for s, n in found.items() if n) or "no cases"


def shards(names: list[str], jobs: int) -> int:
    """Parts per backend: the jobs left over when every backend has one are shared out evenly."""
    return max(1, jobs // max(1, len(names)))


def parts(names: list[str], jobs: int, parts_dir: Path) -> list[Part]:
    """Every backend's parts in start order (order()), a backend's shards together, each with its
    own files: `<backend>.json`, or `<backend>.<I>of<N>.json` for shard I of N."""
    n = shards(names, jobs)
    out = []
    for backend in order(names):
        for i in range(n):
            stem = _file_name(backend) + (f".{i}of{n}" if n > 1 else "")
            out.append(Part(backend, parts_dir / f"{stem}.json", parts_dir / f"{stem}.log", i, n))
    return out


def _file_name(backend: str) -> str:
    """A backend name or module:factory spec as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", backend)


def _start(part: Part, cmd: list[str], env: dict[str, str], backends_env: str, cwd: Path) -> None:
    argv = [*cmd, *part.args, "--harness-results", str(part.results)]
    part.child = Child(argv, part.log, env={**env, backends_env: part.backend}, cwd=cwd)


def _finish(part: Part, code: int) -> None:
    part.code, part.seconds = code, time.monotonic() - part.child.started
    if part.results.is_file():
        try:
            doc = results_json.load(part.results)
            part.records, part.environment = doc["results"], doc["environment"]
        except (OSError, results_json.ResultsError) as e:
            part.code = part.code or 3
            with part.log.open("a") as log:
                log.write(f"\nattn-harness: cannot read {part.results}: {e}\n")


def run(
    cmd: list[str],
    env: dict[str, str],
    backends_env: str,
    names: list[str],
    jobs: int,
    parts_dir: Path,
    cwd: Path,
    out: IO[str] = sys.stdout,
    status_every: float = STATUS_EVERY_S,
) -> list[Part]:
    """Run `cmd` (a pytest command line) once per part (parts(): a backend, or a shard of one when
    there are more jobs than backends), at most `jobs` at once; returns the parts in start order,
    each with its exit code, seconds and records. Prints a line as each ends. On an interrupt
    (Ctrl-C, a time limit's SIGINT) the running parts are asked to stop and write what they
    checked; parts not started are marked interrupted."""
    todo = parts(names, jobs, parts_dir)
    waiting, running, done = list(todo), [], 0
    last_status = time.monotonic()
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                part = waiting.pop(0)
                _start(part, cmd, env, backends_env, cwd)
                running.append(part)
            for part in list(running):
                code = part.child.poll()
                if code is None:
                    continue
                running.remove(part)
                _finish(part, code)
                done += 1
                note = "" if code in (0, NO_TESTS) else f"  exit {code}, log: {part.log}"
                line = f"[{done}/{len(todo)}] {part.name}: {counts(part.records)} ({part.seconds:.0f} s)"
                print(line + note, file=out, flush=True)
            if running and time.monotonic() - last_status >= status_every:
                last_status = time.monotonic()
                now = time.monotonic()
                busy = ", ".join(f"{p.name} {now - p.child.started:.0f} s" for p in running)
                print(f"running: {busy}; {len(waiting)} waiting", file=out, flush=True)
            time.sleep(0.2)
    except KeyboardInterrupt:  # stopped: what the running parts checked so far still makes the report
        print(f"interrupted: stopping {', '.join(p.name for p in running)}", file=out, flush=True)
        for part in running:
            part.child.interrupt()  # pytest writes its results on an interrupt
        for part in running:
            part.child.stop(INTERRUPT_GRACE_S)
            _finish(part, INTERRUPTED)
        for part in waiting:
            part.code = INTERRUPTED
    return todo
