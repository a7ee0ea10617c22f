"""A check: the suite run as pytest processes and merged into one report, behind one door.

`run_check(CheckRequest) -> RunResult` is what `python -m harness check` calls, and what anything
else that runs a check should call. It validates the request (a RequestError names the first
problem in one line, before anything runs or is written), builds the pytest command
(harness/run/pytest_command.py), and runs it: as one pytest process, or, with more than one job,
as parts planned and run by the speed machinery (harness/run/speed/: the schedule, the costs, the
variant shards, the warm-up beside the check) and merged here into one results.json and report,
whose `run` object is harness/run/__init__.py's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.run import INTERRUPTED, RunInfo, started_now
from harness.run.pytest_command import PytestCommand, command
from harness.run.speed import settings

if TYPE_CHECKING:
    from harness.run.speed.warm_gate import WarmGate

JOBS_PER_GPU = 8  # default pytest processes per GPU (a process keeps a core busy, not the GPU)
CORES_PER_JOB = 2  # a pytest process and its isolation worker
# Memory a process of the check is given, with margin: a CPU part's pytest peaked at 0.4 GiB (torch_native's
# prefix tests, ci profile: ru_maxrss); a CUDA part's worker holds a CUDA context and the model checks
# load transformers on top, not measured here.
GIB_PER_JOB = 2.0
PYTEST_USAGE_ERROR = 4
NO_TESTS = 5
NOTHING_CHECKED = 3  # check's exit status when no case was checked (as repro's)
INTERRUPT_GRACE_S = 20.0  # for an interrupted pytest to write what it checked
# What pytest and hypothesis keep between runs goes to the run's own directory, never to the one
# pytest runs in (the checkout, in a checkout): pytest's cache, in a check of one process (`pytest
# cases --lf -o cache_dir=reports/latest/.pytest_cache` reruns its failures; the processes of a
# parallel check run without it), and hypothesis's storage, with the example database of the dev
# and thorough profiles.
PYTEST_CACHE = ".pytest_cache"
HYPOTHESIS_STORAGE_ENV = "HYPOTHESIS_STORAGE_DIRECTORY"
Say = Callable[[str], None]


class RequestError(ValueError):
    """A request the harness cannot run as asked: one line naming the problem."""


@dataclass(frozen=True, kw_only=True)
class CheckRequest:
    """What to check and where to write it. Empty `backends`: every registered one; `device` None:
    the CUDA backends where CUDA is present, else the CPU ones; `profile` None: gpu on CUDA, else
    ci; `jobs` None: one process on the CPU, several a GPU on CUDA; `gpus` None: every visible one."""

    backends: tuple[str, ...] = ()
    families: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    device: str | None = None
    profile: str | None = None
    marker: str | None = None
    keyword: str | None = None
    require: tuple[str, ...] = ()
    jobs: int | None = None
    gpus: str | None = None  # CUDA_VISIBLE_DEVICES entries, comma-separated
    reports: Path = Path("reports")
    results: Path | None = None
    progress: bool = True
    probe: bool = True
    warmup: bool = True
    command_line: str = "python -m harness check"
    shard: str | None = None  # "I/N": the Ith of N CI shares (harness/run/ci_shards.py)
    costs: Path | None = None  # the cost table a share is dealt by (default: the shipped one)
    pins: str | Path | None = None  # a pins file whose cases every search checks first (search/kept.py)
    keep_failures: str | Path | None = None  # the pins file every failing case of this run is added to


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """How a check ended: pytest's exit status (of every part, combined), its run directory, the
    report page when one was written, and its heading's word (harness/report/verdict.py);
    `interrupted`: stopped by a SIGINT before its end; `share`: one CI share of a --shard check (a
    share that checked nothing is not a verdict: the merge of the shares gives it)."""

    exit_status: int
    run_dir: Path
    latest: Path  # the reports' `latest`, pointed at run_dir when a complete report was written
    page: Path | None = None
    verdict: str | None = None
    why: str = ""  # one line when nothing was checked
    interrupted: bool = False
    share: bool = False


@dataclass(kw_only=True)
class Prepared:
    """A validated request as one pytest command line and what its parts share."""

    cmd: list[str]
    env: dict[str, str]
    names: list[str]
    jobs: int
    gpus: list[str]
    run_dir: Path
    profile: str
    results: str | None
    selection: str
    cwd: Path
    command_line: str
    backends: tuple[str, ...] = field(default=())  # as asked (empty: every one)
    cuda: bool = False  # it runs the CUDA backends
    shard: dict | None = None  # a CI share's index, count and key, once dealt
    interrupted: bool = False  # a SIGINT stopped it (Ctrl-C, a time limit)


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_backend(name: str):  # noqa: ANN201 - returns a Backend
    from harness import backends

    try:
        return backends.load(name)
    except backends.BackendError as e:
        raise RequestError(str(e)) from None


def availability(backend, device: str) -> tuple[str, str | None]:  # noqa: ANN001 - a Backend
    """("available", None), ("unavailable", why) or ("broken", why): an installed library that fails
    to import or is at an unsupported version is broken, an error, not a reason to skip."""
    from harness.backends import BackendBroken

    try:
        why = backend.available(device)
    except BackendBroken as e:
        return "broken", str(e)
    return ("available", None) if why is None else ("unavailable", why)


def writable(path: str, option: str) -> None:
    """Fail now, not after a long run, when the file `path` could not be written."""
    p = Path(path).resolve()
    if p.is_dir():
        raise RequestError(f"{option} {path}: is a directory, not a file")
    if not p.parent.is_dir():
        raise RequestError(f"{option} {path}: no such directory {p.parent}")
    if not os.access(p if p.exists() else p.parent, os.W_OK):
        raise RequestError(f"{option} {path}: not writable")


def pytest_expression(option: str, text: str) -> None:
    """A -m or -k expression that pytest would reject: one line now, instead of pytest's usage error
    (exit 4) after its start and an empty report."""
    from _pytest.mark.expression import Expression  # pytest's own parser

    try:
        Expression.compile(text)
    except Exception as e:  # a SyntaxError in recent pytest; a ParseError ("at column N: ...") before
        why = f"at column {e.offset}: {e.msg}" if isinstance(e, SyntaxError) else str(e)
        raise RequestError(f"{option} {text!r} is not a valid pytest expression: {why}") from None


def families(names: Sequence[str], modes: Sequence[str]) -> list[str]:
    """The families named, then those of each forward mode named (EXTEND: prefill and prefix)."""
    from harness.core.modes import FAMILIES, FAMILY_MODE
    from harness.core.results import GRAPH_CHECK  # the replay tests' marker, and their summary family

    known_families = (*FAMILIES, GRAPH_CHECK)
    bad = [f for f in names if f not in known_families]
    if bad:
        raise RequestError(f"unknown family {bad[0]!r}; known: {', '.join(known_families)}")
    out = list(dict.fromkeys(names))
    known = sorted({str(m) for m in FAMILY_MODE.values()})
    for mode in modes:
        if mode.upper() not in known:
            raise RequestError(f"unknown mode {mode!r}; known: {', '.join(known)}")
        out += [f for f, m in FAMILY_MODE.items() if str(m) == mode.upper() and f not in out]
    return out


def required(given: Sequence[str]) -> list[str]:
    """The backends the request and the settings' `require` ($ATTN_HARNESS_REQUIRE) name, once each."""
    text = ",".join([*settings.current().require, *given])
    return list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))


def unavailable(names: Sequence[str], device: str) -> list[str]:
    """One line per required backend that cannot run on `device` here, saying why."""
    lines = []
    for name in names:
        state, why = availability(load_backend(name), device)
        if state != "available":
            lines.append(f"required backend {name} is {state} on {device}: {why}")
    return lines


def gpus(requested: str | None, cuda: bool) -> list[str]:
    """The GPUs the check spreads over: the requested entries, each one visible here; by default
    every visible GPU on a CUDA check, none on a CPU one."""
    from harness.run.isolation import visible_gpus

    if requested is None:
        return visible_gpus() if cuda else []
    if not cuda:
        raise RequestError(f"--gpus {requested}: this check runs on the CPU (no CUDA here, or --device cpu)")
    given = [g.strip() for g in requested.split(",")]
    visible = visible_gpus()
    for g in given:
        if g not in visible:
            shown = ",".join(visible)
            raise RequestError(f"--gpus {requested}: {g!r} is not a visible GPU (visible: {shown})")
    if len(set(given)) < len(given):
        raise RequestError(f"--gpus {requested}: a GPU is named twice")
    return given


def jobs(requested: int | None, cuda: bool, gpus: int = 1, say: Say = print) -> int:
    """pytest processes at once: as asked, capped by the host (`job_cap`, said in one line); else one
    on the CPU (CI's two cores are busy with one) and, on a CUDA machine, one per CORES_PER_JOB cores
    up to JOBS_PER_GPU per GPU (a check keeps cores busy, not the GPU)."""
    if requested is not None:
        if requested < 1:
            raise RequestError(f"--jobs must be at least 1, got {requested}")
        cap, why = job_cap()
        if requested > cap:
            say(f"attn-harness check: --jobs {requested} capped to {cap}: {why}")
            return cap
        return requested
    return max(1, min(JOBS_PER_GPU * max(1, gpus), (os.cpu_count() or 1) // CORES_PER_JOB)) if cuda else 1


def job_cap() -> tuple[int, str]:
    """The most pytest processes this host runs at once, and why: one a core, and GIB_PER_JOB of the
    memory available now each (a process and its isolation worker each load torch)."""
    from harness.checks.footprint import available

    cores, free = os.cpu_count() or 1, available("cpu")
    by_memory = cores if free is None else max(1, int(free / 2**30 // GIB_PER_JOB))
    memory = "memory unknown" if free is None else f"{free / 2**30:.1f} GiB memory available"
    return min(cores, by_memory), f"{cores} cores, {memory} ({GIB_PER_JOB:g} GiB a process)"


def _profile(request: CheckRequest, cuda: bool) -> str:
    from harness.search import profiles

    if settings.current().record:  # every case would pass unchecked (the warm-up sets it for its own run)
        raise RequestError(f"${settings.RECORD_ENV} is set: a check would record its cases, not check "
                           "them; unset it")
    given = request.profile or settings.current().profile  # the flag beats $ATTN_HARNESS_PROFILE
    profile = given or ("gpu" if cuda else "ci")
    if profile not in profiles.SIZES:
        source = "--profile" if request.profile else f"${settings.PROFILE_ENV}"
        raise RequestError(f"unknown profile {profile!r} ({source}); known: {', '.join(profiles.SIZES)}")
    return profile


def _marks(request: CheckRequest, chosen: list[str], on_gpu: bool, say: Say) -> list[str]:
    """The -m expression's terms: the families (markers are exact names; `-k extend` would also
    match draft_extend_v2), the device, and the user's own marker expression."""
    marks = ["(" + " or ".join(chosen) + ")"] if chosen else []
    if request.device:
        marks.append("gpu" if request.device == "cuda" else "not gpu")
    elif on_gpu:  # the CPU backends at the gpu profile's sizes would take hours: --device cpu runs them
        marks.append("gpu")
        say("attn-harness check: CUDA present: the CUDA backends (--device cpu runs the CPU ones)")
    if request.marker:
        pytest_expression("-m", request.marker)
        marks.append(f"({request.marker})")
    if request.keyword:
        pytest_expression("-k", request.keyword)
    return marks


def prepare(request: CheckRequest, say: Say = print) -> Prepared:
    """The request validated, in the order a user meets the problems, and its pytest command; the
    run directory is created last."""
    on_gpu = default_device() == "cuda"
    cuda = on_gpu and request.device != "cpu"  # this check runs the CUDA backends
    profile = _profile(request, cuda)
    from harness import backends

    names = list(request.backends) or backends.names()
    for name in names:  # a plugin that cannot load or breaks the contract: one line now, not at collection
        load_backend(name)
    if request.device == "cuda" and not on_gpu:
        raise RequestError("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    missing = unavailable(required(request.require), request.device or default_device())
    if missing:
        raise RequestError("\nerror: ".join(missing))
    slots = gpus(request.gpus, cuda)
    count = jobs(request.jobs, cuda, len(slots), say)  # the schedule: harness/run/speed/schedule.py
    marks = _marks(request, families(request.families, request.modes), on_gpu, say)
    if request.results:
        writable(str(request.results), "--results")
    _share_request(request)
    pytest = _command(request, profile, marks, cuda, slots)
    pytest.env.update(_pins_env(request))
    selection = f"profile {profile}; -m {' and '.join(marks)}; -k {request.keyword or ''}"
    results = str(Path(request.results).resolve()) if request.results else None
    run_dir = _run_dir(request.reports)
    pytest.env[HYPOTHESIS_STORAGE_ENV] = str(run_dir / ".hypothesis")  # never the checkout's
    return Prepared(
        cmd=pytest.argv, env=pytest.env, names=names, jobs=count, gpus=slots,
        run_dir=run_dir, profile=profile, results=results, selection=selection,
        cwd=pytest.cwd, command_line=request.command_line, backends=request.backends, cuda=cuda,
    )


def _pins_env(request: CheckRequest) -> dict[str, str]:
    """The pins file the suite replays first (kept.PINS_ENV), read once here so a bad one is a
    RequestError before anything runs; --keep-failures' file must be a pins file (or not exist yet)."""
    from harness.search import kept

    try:
        for path in (request.pins, request.keep_failures):
            if path is not None:
                kept.read(path)
    except kept.PinsError as e:
        raise RequestError(str(e)) from None
    if request.pins is not None and not Path(request.pins).is_file():
        raise RequestError(f"--pins {request.pins}: no such file")
    return {kept.PINS_ENV: str(Path(request.pins).resolve())} if request.pins else {}


def keep_failures(request: CheckRequest, result: RunResult, say: Say = print) -> None:
    """Add the run's failing cases (its results.json, where the run wrote one) to the pins file
    request.keep_failures names, and say how many were new."""
    from harness.report import results_json
    from harness.search import kept

    path = Path(request.results) if request.results else result.run_dir / "results.json"
    if request.keep_failures is None or not path.is_file():
        return
    added = kept.add_failures(results_json.load(path), request.keep_failures)
    say(f"attn-harness check: {added} new failing case(s) kept in {request.keep_failures}")


def _share_request(request: CheckRequest) -> None:
    """A malformed --shard or an unreadable --costs table: one line now, before anything runs."""
    from harness.run import ci_shards

    try:
        if request.shard:
            ci_shards.parse(request.shard)
        if request.costs:
            ci_shards.load_costs(request.costs)
    except ci_shards.ShareError as e:
        raise RequestError(str(e)) from None
    if request.costs and not request.shard:
        raise RequestError("--costs deals the shares of a --shard check: give --shard I/N too")


def deal_share(request: CheckRequest, job: Prepared, say: Say) -> None:
    """Collect the selected tests, deal them into the CI shares and make every pytest process of the
    check run this share's tests alone; the check's backends become those the share has tests of."""
    from harness.backends import BACKENDS_ENV
    from harness.run import ci_shards

    index, count = ci_shards.parse(str(request.shard))
    listing, share = job.run_dir / "collected.json", job.run_dir / "share.json"
    cmd = [*job.cmd, "--collect-only", "-p", "no:cacheprovider", "--harness-ci-collect", str(listing)]
    env = {**job.env, BACKENDS_ENV: ",".join(job.backends)} if job.backends else job.env
    done = subprocess.run(cmd, cwd=job.cwd, env=env, capture_output=True, text=True)
    if done.returncode not in (0, NO_TESTS) or not listing.is_file():
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RequestError(f"--shard {request.shard}: collecting the tests failed (pytest exit "
                           f"{done.returncode}): {last[0]}")
    tests = ci_shards.read_collected(listing)
    costs = ci_shards.item_costs(tests, ci_shards.load_costs(request.costs) if request.costs else None)
    dealt = ci_shards.deal(costs, count)
    mine = [t for t, _ in tests if dealt[t] == index]
    job.shard = {"index": index, "count": count, "key": ci_shards.key(dealt, job.profile)}
    ci_shards.write_share(share, index, count, job.shard["key"], mine)
    job.cmd += ["--harness-ci-share", str(share)]
    kept = {b for t, b in tests if dealt[t] == index}
    job.names = [n for n in job.names if n in kept]
    seconds = sum(costs[t] for t in mine)
    say(f"attn-harness check: share {index}/{count}: {len(mine)} of {len(tests)} tests, about "
        f"{seconds:.0f} of {sum(costs.values()):.0f} s by the cost table")
    if not mine:
        say(f"attn-harness check: share {index}/{count} has nothing to check ({len(tests)} tests over "
            f"{count} shares): not a failure")


def _command(
    request: CheckRequest, profile: str, marks: list[str], cuda: bool, slots: list[str]
) -> PytestCommand:
    """The pytest command every process of the check runs (a part adds its own backend and shard)."""
    from harness.run import isolation
    from harness.run.speed import prestart

    early = cuda and isolation.enabled("cuda")  # each pytest process spawns its worker as it starts
    options = ["--harness-command", request.command_line]  # the report's header shows what the user typed
    options += ["--harness-progress"] if request.progress else []
    options += [] if request.probe else ["--harness-no-probe"]
    first = prestart.OPTIONS if early else ()
    marker = " and ".join(marks) or None
    cmd = command(profile, marker=marker, keyword=request.keyword, first=first, options=options)
    if early:
        cmd.env[settings.PRESTART_ENV] = "1"
    if request.gpus:
        cmd.env["CUDA_VISIBLE_DEVICES"] = ",".join(slots)
    return cmd


def _run_dir(reports: Path) -> Path:
    from harness import report

    try:
        return report.new_run_dir(Path(reports).resolve(), report.new_run_id())
    except OSError as e:
        raise RequestError(f"cannot create a report directory under {reports}: {e}") from None


def _gate(request: CheckRequest, job: Prepared, say: Say) -> WarmGate | None:
    """The warm-up beside a CUDA check (harness/run/speed/warm_gate.py), started; None when it does
    not run: on the CPU, when asked not to, or beside a narrowed check (it compiles for the whole
    profile)."""
    if not (job.cuda and request.warmup):
        return None
    if request.keyword or request.marker or request.families or request.modes:
        say("attn-harness check: no warm-up beside a check narrowed by -k, -m, --family or --mode: each "
            "backend compiles what it draws (`make warmup` fills the cache for the whole profile)")
        return None
    from harness.run.speed import warm_gate, warmup
    from harness.run.speed.warmup.libraries import LIBRARIES

    gate = warm_gate.WarmGate(LIBRARIES, job.profile, warmup.default_jobs(), job.names, say)
    gate.start()
    return gate


def run_check(request: CheckRequest, say: Say = print) -> RunResult:
    """Run the check the request asks for; RequestError before anything runs when it cannot."""
    job = prepare(request, say)
    if request.shard:
        deal_share(request, job, say)
    gate = _gate(request, job, say)
    if job.shard and not job.names:  # nothing to check here: one process writes the empty share
        code = run_single(job, None, say)
        return _finish(job, 0 if code == NO_TESTS else code)
    if job.jobs > 1:  # no cache: processes at once would overwrite each other's last-failed set (--lf)
        job.cmd += ["-p", "no:cacheprovider", "--harness-quick-exit"]  # a part's end is on the wall time
        if job.cuda:
            from harness.run import parallel

            job.env.update(parallel.cuda_threads(job.env))
        code = run_parallel(job, gate, say)
    else:
        code = run_single(job, gate, say)
    result = _finish(job, code)
    keep_failures(request, result, say)
    return result


def run_single(job: Prepared, gate: WarmGate | None = None, say: Say = print) -> int:
    """The check as one pytest process, which writes the report itself; it starts once the whole
    warm-up has ended (it checks every backend)."""
    import shlex

    from harness.backends import BACKENDS_ENV

    if gate is not None:
        say("\n".join(gate.join()))
    cmd = [*job.cmd, "--harness-report", str(job.run_dir), "--harness-run-id", job.run_dir.name]
    cmd += ["-o", f"cache_dir={job.run_dir / PYTEST_CACHE}"]  # not the checkout's: see PYTEST_CACHE
    if job.results:
        cmd += ["--harness-results", job.results]
    env = {**job.env, BACKENDS_ENV: ",".join(job.backends)} if job.backends else job.env
    say(f"attn-harness check: profile {job.profile}; {shlex.join(cmd[1:])}")
    try:
        return run_pytest(cmd, job.cwd, env).returncode
    except Stopped as e:
        job.interrupted = True
        return e.returncode


@contextmanager
def as_ctrl_c() -> Iterator[None]:
    """Within the block a SIGTERM (what `timeout` and CI runners send at a time limit) raises
    KeyboardInterrupt, so a check stops as on Ctrl-C and writes what it checked under a report headed
    INTERRUPTED. Only the main thread may set a handler: elsewhere the block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


class Stopped(Exception):
    """pytest stopped by a SIGINT passed on to it; `returncode`: its exit status once it ended."""

    def __init__(self, returncode: int) -> None:
        super().__init__(f"pytest stopped by SIGINT (exit {returncode})")
        self.returncode = returncode


def run_pytest(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """One pytest process to its end. It runs in its own session, so Ctrl-C reaches this process
    alone and is passed on as one SIGINT (a second one during pytest's own handling would stop it
    writing its results); it then has INTERRUPT_GRACE_S to write what it checked, or a second Ctrl-C
    ends it, and Stopped is raised with its exit status."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, start_new_session=True)
    try:
        return subprocess.CompletedProcess(cmd, proc.wait())
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(INTERRUPT_GRACE_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        proc.kill()
        code = proc.wait()
    raise Stopped(code)


def _cannot_run(name: str, device: str) -> str | None:
    """Why backend `name` cannot run on `device` here (its library is not installed, ...), else None:
    the schedule then plans its part as one that skips every test. A broken library is None: its part
    runs and reports the error."""
    state, why = availability(load_backend(name), device)
    return why if state == "unavailable" else None


def run_parallel(job: Prepared, gate: WarmGate | None = None, say: Say = print) -> int:
    """The suite as pytest processes, one per backend or per shard of one, `job.jobs` at once over
    `job.gpus`, in the schedule's order (harness/run/speed/), merged into one results.json and
    report in the run directory; what the parts took is kept for the next plan. With a `gate` (the
    warm-up beside the check) a backend's parts wait for its libraries."""
    import functools
    import shlex
    import time

    from harness.backends import BACKENDS_ENV
    from harness.run import parallel
    from harness.run.speed import costs
    from harness.run.speed.parts import plan_check
    from harness.search import profiles

    started, t0 = started_now()[1], time.monotonic()
    unavailable_here = functools.partial(_cannot_run, device="cuda" if job.gpus else "cpu")
    planned = plan_check(job.names, job.jobs, job.gpus, job.selection, unavailable_here)
    say(f"attn-harness check: profile {job.profile}; {len(job.names)} backends; each process: "
        f"{shlex.join(job.cmd[1:])}\nplan (expected seconds: measured in {planned.kept / costs.TIMINGS}, "
        "else the default table):")
    say("\n".join(planned.lines))
    gated = {"ready": gate.ready, "nice": gate.nice} if gate is not None else {}
    parts_dir = job.run_dir / "parts"
    parts = parallel.run(job.cmd, job.env, BACKENDS_ENV, planned.plan, parts_dir, job.cwd, **gated)
    warmed = gate.join() if gate is not None else []
    code = parallel.combined_code([p.code for p in parts])
    job.interrupted = any(p.interrupted for p in parts)
    elapsed = time.monotonic() - t0
    records = parallel.merged_records(parts)
    if gate is None or not gate.compiled():
        planned.keep(parts, records, job.profile)
    else:  # the parts shared the cores with the compiles: their times are not the check's cost
        say(f"timings not saved to {planned.kept / costs.TIMINGS}: the warm-up compiled beside the check")
    run = RunInfo(
        id=job.run_dir.name, started=started, elapsed_s=elapsed, profile=job.profile,
        derandomized=profiles.derandomized(job.profile) or (job.shard is not None and not profiles.seeded()),
        command=f"{job.command_line} ({len(planned.plan.parts)} processes, {planned.plan.jobs} at once)",
        exit_status=INTERRUPTED if job.interrupted else code,
        jobs=planned.plan.jobs, expected_s=planned.plan.makespan,
        parts=parallel.part_records(parts), warmup_s=gate.seconds if gate is not None else None,
        shard=job.shard, interrupted={"not_run": parallel.not_run(parts)} if job.interrupted else None,
    )
    environment = next((p.environment for p in parts if p.environment), {})
    _write(job, records, run, environment, warmed + parallel.gpu_lines(parts, elapsed), say)
    return code


def _write(
    job: Prepared, records: list[dict], run: RunInfo, environment: dict, lines: list[str], say: Say
) -> None:
    """The merged results.json (where asked) and the report of a parallel check, after its summary
    table and `lines` (the warm-up's, which GPU ran what)."""
    from harness import report
    from harness.core.results import summary_table
    from harness.report import results_json

    data = results_json.build(records, run.to_dict(), environment)
    if records:
        say(summary_table(records))
    say("\n".join(lines))
    if job.results:
        results_json.dump(Path(job.results), data)
        say(f"results: {job.results}")
    report.write_run(job.run_dir, data)


def _finish(job: Prepared, code: int) -> RunResult:
    """The run's result, its heading's word read back from its results.json. The reports' `latest`
    is pointed at the run only when it wrote a report of a whole run: pytest's refusal of its command
    line (exit 4) leaves an empty report, an interrupted run a partial one."""
    from harness import report
    from harness.report import results_json, verdict

    page, latest = job.run_dir / report.INDEX, job.run_dir.parent / report.LATEST
    done = dict(exit_status=code, run_dir=job.run_dir, latest=latest, interrupted=job.interrupted,
                share=job.shard is not None)
    if code == PYTEST_USAGE_ERROR or not page.is_file():
        return RunResult(**done)
    data = results_json.load(job.run_dir / report.RESULTS)
    word = verdict.verdict(data)
    why = verdict.nothing_checked(data) if word == "NOTHING CHECKED" else ""
    if not job.interrupted:
        report.point_latest(job.run_dir.parent, job.run_dir)
    return RunResult(**done, page=page, verdict=word, why=why)


def conclude(result: RunResult, say: Say = print, err: Say = print) -> int:
    """The exit status of `check` for a finished run, with its last lines (errors through `err`):
    0 passed, 1 a failure, 2 bad input (pytest refused its command line, no test matched),
    NOTHING_CHECKED (3) when no case was checked (but 0 for a CI share: the merge gives the verdict),
    INTERRUPTED (130) when stopped by a SIGINT; pytest's own status otherwise (3: its internal error)."""
    latest = result.latest
    if result.exit_status == PYTEST_USAGE_ERROR:  # its report is empty: latest is kept
        err(f"pytest refused its command line (exit {result.exit_status}): {latest} kept")
        return 2
    if result.interrupted:
        where = f"report: {result.page}  ({latest} not moved)" if result.page else f"no report; {latest} kept"
        err(f"attn-harness check: INTERRUPTED: what it checked is not a verdict; {where}")
        return INTERRUPTED
    if result.page is not None:
        say(f"report: {result.page}  (also {latest})")
    if result.exit_status == NO_TESTS:
        err("no tests matched the filters")
        return 2
    if result.exit_status == 0 and result.verdict == "NOTHING CHECKED" and not result.share:
        err(f"attn-harness check: NOTHING CHECKED (exit {NOTHING_CHECKED}): {result.why}")
        return NOTHING_CHECKED
    return int(result.exit_status)
