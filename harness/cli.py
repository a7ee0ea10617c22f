"""python -m harness {list, check, warmup, repro, report, mutants, bench}: the command line.

Bad input (unknown backend, malformed JSON, an invalid or oversized Case, a bad results file, an
unwritable output path, a bad option value) exits 2 with one line naming the problem, before anything
runs or is written (docs/reports.md lists it); a failing check or repro exits 1. Each subcommand is
a pair of functions, `add_<name>` (its arguments) and `cmd_<name>` (what it does), registered in
COMMANDS. The compile caches are pointed at one directory (harness/run/cache_dir.py) before any
command runs, so every library and child process sees it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, NoReturn

if TYPE_CHECKING:
    from harness.run.warm_gate import WarmGate

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent  # the repository, in a checkout; site-packages, installed
DEFAULT_REPORTS = Path("reports")  # under the current directory, checkout or installed
PLUGIN = "harness.run.pytest_plugin"
REQUIRE_ENV = "ATTN_HARNESS_REQUIRE"  # comma-separated backends `check` requires, as --require (CI)
NOTHING_CHECKED = 3  # repro's exit status when the case did not run (a SKIP: unsupported, no device)
PYTEST_USAGE_ERROR = 4
JOBS_PER_GPU = 8  # check's default pytest processes per GPU (a process keeps a core busy, not the GPU)
CORES_PER_JOB = 2  # a pytest process and its isolation worker


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def read_case(text: str):  # noqa: ANN201 - returns a Case or a GraphCase
    """A Case from a path to a JSON file or from a JSON literal; a GraphCase (a CUDA-graph replay
    sequence: an object with `batches`) likewise."""
    from harness.core.case import Case, CaseError
    from harness.core.graph_case import GraphCase

    src = text
    if not text.lstrip().startswith("{"):
        path = Path(text)
        if not path.is_file():
            raise UsageError(f"no such case file: {text}")
        try:
            src = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"case file {text} is not UTF-8 text: {e}") from None
        except OSError as e:
            raise UsageError(f"cannot read case file {text}: {e.strerror}") from None
    try:
        parsed = json.loads(src)
    except (ValueError, RecursionError):
        parsed = None  # Case.from_json says what is wrong with it
    graph = isinstance(parsed, dict) and "batches" in parsed
    try:
        return GraphCase.from_json(src) if graph else Case.from_json(src)
    except (CaseError, TypeError) as e:
        raise UsageError(f"invalid {'graph case' if graph else 'case'}: {e}") from None


def check_size(case, device: str) -> None:  # noqa: ANN001 - a Case
    """Refuse a case larger than the device's free memory (harness/checks/footprint.py) before it runs."""
    from harness.checks.footprint import fits
    from harness.core.case import CaseError

    try:
        fits(case, device)
    except CaseError as e:
        raise UsageError(str(e)) from None


def writable(path: str, option: str) -> None:
    """Fail now, not after a long run, when the file `path` could not be written."""
    p = Path(path).resolve()
    if p.is_dir():
        raise UsageError(f"{option} {path}: is a directory, not a file")
    if not p.parent.is_dir():
        raise UsageError(f"{option} {path}: no such directory {p.parent}")
    if not os.access(p if p.exists() else p.parent, os.W_OK):
        raise UsageError(f"{option} {path}: not writable")


def pytest_expression(option: str, text: str) -> None:
    """A -m or -k expression that pytest would reject: one line now, instead of pytest's usage error
    (exit 4) after its start and an empty report."""
    from _pytest.mark.expression import Expression  # pytest's own parser

    try:
        Expression.compile(text)
    except Exception as e:  # a SyntaxError in recent pytest; a ParseError ("at column N: ...") before
        why = f"at column {e.offset}: {e.msg}" if isinstance(e, SyntaxError) else str(e)
        raise UsageError(f"{option} {text!r} is not a valid pytest expression: {why}") from None


class Suite(NamedTuple):
    """Where the suite's pytest runs: the test folder, pytest's options that pin its configuration,
    the directory it runs in, and environment variables it runs with."""

    path: Path
    options: list[str]
    cwd: Path
    env: dict[str, str]


def suite() -> Suite:
    """The checkout's cases/ with its pyproject.toml and conftest.py, or, where the harness is
    installed (setup.py ships cases/ as `harness.cases`), the package's copy: run from the current
    directory with no configuration file, so that a pytest configuration around the environment
    (a project's pyproject.toml above its venv) cannot change the run, and no conftest.py outside it
    is loaded, and without the current directory on sys.path (PYTHONSAFEPATH; `python -m` puts it
    first), where a project's own `harness` package would shadow the installed one. `-p` loads the
    plugin even where plugin autoloading is off."""
    installed = PACKAGE / "cases"
    plugin = ["-p", PLUGIN]
    if not installed.is_dir():
        return Suite(ROOT / "cases", [*plugin, f"--rootdir={ROOT}"], ROOT, {})
    options = [*plugin, "-c", os.devnull, f"--rootdir={installed}", f"--confcutdir={installed}"]
    options += ["-W", "ignore::DeprecationWarning:torch.*"]
    options += ["-o", f"cache_dir={Path.cwd() / '.pytest_cache'}"]  # --lf / --sw: never in site-packages
    return Suite(installed, options, Path.cwd(), {"PYTHONSAFEPATH": "1"})


def load_backend(name: str):  # noqa: ANN201 - returns a Backend
    from harness import backends

    try:
        return backends.load(name)
    except backends.BackendError as e:
        raise UsageError(str(e)) from None


def availability(backend, device: str) -> tuple[str, str | None]:  # noqa: ANN001 - a Backend
    """("available", None), ("unavailable", why) or ("broken", why): an installed library that fails
    to import or is at an unsupported version is broken, an error, not a reason to skip."""
    from harness.backends import BackendBroken

    try:
        why = backend.available(device)
    except BackendBroken as e:
        return "broken", str(e)
    return ("available", None) if why is None else ("unavailable", why)


# --- list -------------------------------------------------------------------------------------


def add_list(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", action="append", help="describe this backend or module:factory spec")


def cmd_list(args: argparse.Namespace) -> int:
    from harness import backends
    from harness.backends.versions import describe, installed_version
    from harness.core.vocab import FEATURES
    from harness.run import cache_dir

    broken = False
    for name in args.backend or backends.names():
        b = load_backend(name)
        c = b.capabilities
        feats = [f for f in FEATURES if getattr(c, f)]
        print(f"{name}  ({b.library})")
        if getattr(b, "supported", None) is not None:  # a library with a supported range: its release
            print(f"  release: {describe(b.supported, installed_version(b.supported))}")
        print(f"  modes: {', '.join(sorted(str(m) for m in c.modes))}")
        dims = ", ".join(map(str, sorted(c.head_dims))) if c.head_dims else "any multiple of 8"
        print(
            f"  dtypes: {', '.join(sorted(c.dtypes))}; head dims: {dims}; page sizes: "
            f"{', '.join(map(str, sorted(c.page_sizes)))}; kv layouts: {', '.join(sorted(c.kv_layouts))}"
        )
        fp8 = ", ".join(sorted(c.kv_dtypes)) or "-"
        print(f"  features: {', '.join(feats) or '-'}; FP8 KV caches: {fp8}")
        graph = ", ".join(sorted(str(m) for m in c.graph_modes))
        print(f"  CUDA graph: {graph}" if graph else f"  CUDA graph: none: {c.graph_reason()}")
        for device in sorted(c.devices):
            state, why = availability(b, device)
            broken |= state == "broken"
            print(f"  {device}: {state}" + (f": {why}" if why else ""))
        for feature, why in sorted(c.why_not.items()):
            if feature == "graph":  # on the CUDA graph line
                continue
            print(f"  no {feature}: {why}")
    print("\n".join(cache_dir.describe()))
    return 1 if broken else 0


# --- check ------------------------------------------------------------------------------------


def add_check(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend", action="append", help="only this backend: a name or module:factory (repeatable)"
    )
    p.add_argument(
        "--family",
        action="append",
        help="only this family: decode, prefill, prefix, draft_extend_v2, verify, cross, encoder "
        "(repeatable)",
    )
    p.add_argument(
        "--mode",
        action="append",
        help="only this forward mode, e.g. EXTEND (= prefill + prefix) (repeatable)",
    )
    p.add_argument("-k", help="a pytest -k expression, e.g. swa")
    p.add_argument("-m", "--marker", help="a pytest marker expression, e.g. 'swa and not gpu'")
    p.add_argument(
        "--device", choices=("cpu", "cuda"), help="only backends on this device (default: cuda where present)"
    )
    p.add_argument("--profile", help="hypothesis profile: ci, dev, gpu, thorough")
    p.add_argument(
        "--require",
        action="append",
        metavar="NAME,...",
        help=f"exit 2 before running unless these backends run on the device here (also ${REQUIRE_ENV})",
    )
    p.add_argument(
        "--reports",
        default=str(DEFAULT_REPORTS),
        help="write the report to REPORTS/<run-id>/ and point REPORTS/latest at it (default: reports/ in the "
        "current directory)",
    )
    p.add_argument("--results", help="also write results.json here")
    p.add_argument("--no-progress", action="store_true", help="no progress line")
    p.add_argument("--no-probe", action="store_true", help="do not rerun failures through the mask probe")
    p.add_argument(
        "--jobs",
        type=int,
        help="pytest processes at once, the longest backends first; one that would bound the wall time "
        f"is split into shards (default 1; on CUDA 1 per {CORES_PER_JOB} cores, "
        f"{JOBS_PER_GPU} a GPU at most)",
    )
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="on CUDA, do not compile the JIT variants beside the check (harness/run/warm_gate.py); "
        "each backend then compiles what it draws in its own processes",
    )
    p.add_argument(
        "--gpus",
        metavar="LIST",
        help="spread the processes over these GPUs: CUDA_VISIBLE_DEVICES entries, e.g. 0,1 (default: "
        "every visible GPU)",
    )


def _families(args: argparse.Namespace) -> list[str]:
    from harness.core.modes import FAMILIES, FAMILY_MODE

    bad = [f for f in args.family or [] if f not in FAMILIES]
    if bad:
        raise UsageError(f"unknown family {bad[0]!r}; known: {', '.join(FAMILIES)}")
    out = list(args.family or [])
    modes = sorted({str(m) for m in FAMILY_MODE.values()})
    for mode in args.mode or []:
        if mode.upper() not in modes:
            raise UsageError(f"unknown mode {mode!r}; known: {', '.join(modes)}")
        out += [f for f, m in FAMILY_MODE.items() if str(m) == mode.upper() and f not in out]
    return out


def _required(given: list[str] | None) -> list[str]:
    """The backends named by --require and $ATTN_HARNESS_REQUIRE (comma-separated), once each."""
    text = ",".join([os.environ.get(REQUIRE_ENV, ""), *(given or [])])
    return list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))


def _unavailable(names: list[str], device: str) -> list[str]:
    """One line per required backend that cannot run on `device` here, saying why."""
    lines = []
    for name in names:
        state, why = availability(load_backend(name), device)
        if state != "available":
            lines.append(f"required backend {name} is {state} on {device}: {why}")
    return lines


def cmd_check(args: argparse.Namespace) -> int:
    from harness import backends, report
    from harness.backends import BACKENDS_ENV
    from harness.run import isolation, parallel, prestart, record_mode
    from harness.search import profiles

    if record_mode.path():  # every case would pass unchecked (the warm-up sets it for its own run only)
        raise UsageError(f"${record_mode.RECORD_ENV} is set: a check would record its cases, not check "
                         "them; unset it")
    on_gpu = _default_device() == "cuda"
    cuda = on_gpu and args.device != "cpu"  # this check runs the CUDA backends
    profile = args.profile or ("gpu" if cuda else "ci")
    if profile not in profiles.SIZES:
        raise UsageError(f"unknown profile {profile!r}; known: {', '.join(profiles.SIZES)}")
    for name in args.backend or []:
        load_backend(name)
    if args.device == "cuda" and not on_gpu:
        raise UsageError("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    missing = _unavailable(_required(args.require), args.device or _default_device())
    if missing:
        print("\n".join(f"error: {line}" for line in missing), file=sys.stderr)
        return 2
    names = args.backend or backends.names()
    gpus = _gpus(args.gpus, cuda)
    jobs = _jobs(args.jobs, cuda, len(gpus))  # the schedule: run/schedule.py
    marks = []  # markers are exact names ("-k extend" would also match draft_extend_v2)
    families = _families(args)
    if families:
        marks.append("(" + " or ".join(families) + ")")
    if args.device:
        marks.append("gpu" if args.device == "cuda" else "not gpu")
    elif on_gpu:  # the CPU backends at the gpu profile's sizes would take hours: --device cpu runs them
        marks.append("gpu")
        print("attn-harness check: CUDA present: the CUDA backends (--device cpu runs the CPU ones)")
    if args.marker:
        pytest_expression("-m", args.marker)
        marks.append(f"({args.marker})")
    if args.k:
        pytest_expression("-k", args.k)
    if args.results:
        writable(args.results, "--results")
    root = Path(args.reports).resolve()
    try:
        run_dir = report.new_run_dir(root, report.new_run_id())
    except OSError as e:
        raise UsageError(f"cannot create a report directory under {args.reports}: {e}") from None
    where = suite()
    early = cuda and isolation.enabled("cuda")  # each pytest process spawns its worker as it starts
    cmd = [sys.executable, "-m", "pytest", str(where.path), "-q", *(prestart.OPTIONS if early else ())]
    cmd += where.options
    if marks:
        cmd += ["-m", " and ".join(marks)]
    if args.k:
        cmd += ["-k", args.k]
    cmd += ["--harness-command", args.command_line]  # the report's header shows what the user typed
    if not args.no_progress:
        cmd.append("--harness-progress")
    if args.no_probe:
        cmd.append("--harness-no-probe")
    env = {k: v for k, v in os.environ.items() if k != BACKENDS_ENV}
    env["ATTN_HARNESS_PROFILE"] = profile
    if early:
        env[prestart.ENV] = "1"
    if args.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    env.update(where.env)
    gate = None
    warm = cuda and not args.no_warmup
    narrowed = args.k or args.marker or families  # the warm-up compiles for the whole profile
    if warm and narrowed:
        print(
            "attn-harness check: no warm-up beside a check narrowed by -k, -m, --family or --mode: each "
            "backend compiles what it draws (`make warmup` fills the cache for the whole profile)"
        )
    elif warm:
        from harness.run.warm_gate import WarmGate
        from harness.tools import warmup
        from harness.tools.warmup.libraries import LIBRARIES

        say = lambda line: print(line, flush=True)  # noqa: E731
        gate = WarmGate(LIBRARIES, profile, warmup.default_jobs(), names, say)
        gate.start()
    if jobs > 1:  # no cache: processes at once would overwrite each other's last-failed set (--lf)
        cmd += ["-p", "no:cacheprovider", "--harness-quick-exit"]  # a part's end is on the wall time
        if cuda:
            env.update(parallel.cuda_threads(env))
        selection = f"profile {profile}; -m {' and '.join(marks)}; -k {args.k or ''}"
        code = _check_parallel(
            cmd, env, names, jobs, gpus, run_dir, profile, args.results, selection, where.cwd,
            args.command_line, gate,
        )
    else:
        if gate is not None:  # one process checks every backend: it waits for the whole warm-up
            print("\n".join(gate.join()), flush=True)
        cmd += ["--harness-report", str(run_dir), "--harness-run-id", run_dir.name]
        if args.results:
            cmd += ["--harness-results", str(Path(args.results).resolve())]
        if args.backend:
            env[BACKENDS_ENV] = ",".join(args.backend)
        print(f"attn-harness check: profile {profile}; {shlex.join(cmd[1:])}", flush=True)
        code = subprocess.run(cmd, cwd=where.cwd, env=env).returncode
    if code == PYTEST_USAGE_ERROR:  # pytest refused the command line: its report is empty, keep latest
        print(f"pytest refused its command line (exit {code}): {root / report.LATEST} kept", file=sys.stderr)
        return 2
    if (run_dir / report.INDEX).is_file():
        report.point_latest(root, run_dir)
        print(f"report: {run_dir / report.INDEX}  (also {root / report.LATEST})")
    if code == 5:
        print("no tests matched the filters", file=sys.stderr)
        return 2
    return int(code)


def _gpus(requested: str | None, cuda: bool) -> list[str]:
    """The GPUs the check spreads over: --gpus's entries, each one visible here; by default every
    visible GPU on a CUDA check, none on a CPU one."""
    from harness.run.isolation import visible_gpus

    if requested is None:
        return visible_gpus() if cuda else []
    if not cuda:
        raise UsageError(f"--gpus {requested}: this check runs on the CPU (no CUDA here, or --device cpu)")
    given = [g.strip() for g in requested.split(",")]
    visible = visible_gpus()
    for g in given:
        if g not in visible:
            raise UsageError(f"--gpus {requested}: {g!r} is not a visible GPU (visible: {','.join(visible)})")
    if len(set(given)) < len(given):
        raise UsageError(f"--gpus {requested}: a GPU is named twice")
    return given


def _jobs(requested: int | None, cuda: bool, gpus: int = 1) -> int:
    """pytest processes at once: as asked; else one on the CPU (CI's two cores are busy with one)
    and, on a CUDA machine, one per CORES_PER_JOB cores up to JOBS_PER_GPU per GPU (a check keeps
    cores busy, not the GPU)."""
    if requested is not None:
        if requested < 1:
            raise UsageError(f"--jobs must be at least 1, got {requested}")
        return requested
    return max(1, min(JOBS_PER_GPU * max(1, gpus), (os.cpu_count() or 1) // CORES_PER_JOB)) if cuda else 1


def _cannot_run(name: str, device: str) -> str | None:
    """Why backend `name` cannot run on `device` here (its library is not installed, ...), else None:
    the schedule then plans its part as one that skips every test. A broken library is None: its part
    runs and reports the error."""
    state, why = availability(load_backend(name), device)
    return why if state == "unavailable" else None


def _check_parallel(
    cmd: list[str],
    env: dict[str, str],
    names: list[str],
    jobs: int,
    gpus: list[str],
    run_dir: Path,
    profile: str,
    results_path: str | None,
    selection: str,
    cwd: Path,
    command_line: str,
    gate: WarmGate | None = None,
) -> int:
    """The suite as pytest processes, one per backend or per shard of one, `jobs` at once over
    `gpus`, in the schedule's order (harness/run/schedule.py, costs from harness/run/costs.py),
    merged into one results.json and report in run_dir; the measured costs (and the weights of each
    backend's variants, by which its shards split its cases) saved for the next run.
    With a `gate` (the warm-up running beside the check) a backend's parts wait for its libraries."""
    import time

    from harness import backends, report
    from harness.backends import BACKENDS_ENV
    from harness.core.results import summary_table
    from harness.report import results_json
    from harness.run import cache_dir, costs, parallel, schedule, variant_shards

    started, t0 = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.monotonic()
    kept = cache_dir.root()  # the costs travel with the compile caches a CI job restores
    kept.mkdir(parents=True, exist_ok=True)
    unavailable = functools.partial(_cannot_run, device="cuda" if gpus else "cpu")
    expected, sources, startups = costs.expected(names, selection, kept, unavailable)
    plan = schedule.plan(expected, jobs, gpus, startups)
    print(
        f"attn-harness check: profile {profile}; {len(names)} backends; each process: {shlex.join(cmd[1:])}\n"
        f"plan (expected seconds: measured in {kept / costs.TIMINGS}, else the default table):",
        flush=True,
    )
    print("\n".join(schedule.describe(plan, sources)), flush=True)
    gated = {"ready": gate.ready, "nice": gate.nice} if gate is not None else {}
    parts = parallel.run(cmd, env, BACKENDS_ENV, plan, run_dir / "parts", cwd, **gated)
    warmed = gate.join() if gate is not None else []
    code = parallel.combined_code([p.code for p in parts])
    elapsed = time.monotonic() - t0
    records = parallel.merged_records(parts)
    if gate is None or not gate.compiled():
        ran = [(p.backend, p.code, p.seconds) for p in parts]
        costs.save(kept, selection, costs.measured(ran, startups), costs.shard_means(ran))
        for name in names:  # how the next run's shards deal each backend's variants
            variant_shards.save_measured(backends.load(name), profile, records, kept)
    else:  # the parts shared the cores with the compiles: their times are not the check's cost
        print(f"timings not saved to {kept / costs.TIMINGS}: the warm-up compiled beside the check")
    environment = next((p.environment for p in parts if p.environment), {})
    run = {
        "id": run_dir.name,
        "started": started,
        "elapsed_s": round(elapsed, 3),
        "profile": profile,
        "command": f"{command_line} ({len(plan.parts)} processes, {plan.jobs} at once)",
        "exit_status": code,
        "jobs": plan.jobs,
        "expected_s": round(plan.makespan, 1),
        "parts": parallel.part_records(parts),
    }
    if gate is not None and gate.seconds is not None:
        run["warmup_s"] = round(gate.seconds, 3)  # beside the check: part of elapsed_s, not added to it
    data = results_json.build(records, run, environment)
    if records:
        print(summary_table(records))
    print("\n".join(warmed + parallel.gpu_lines(parts, elapsed)))
    if results_path:
        results_json.dump(Path(results_path).resolve(), data)
        print(f"results: {Path(results_path).resolve()}")
    report.write_run(run_dir, data)
    return code


# --- warmup -----------------------------------------------------------------------------------


def add_warmup(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help="compile the variants this profile draws: ci, dev, gpu, thorough (gpu)")
    p.add_argument("--backend", action="append", help="only what these backends compile (repeatable)")
    p.add_argument("--jobs", type=int, help="cores to compile on (default: all of them)")


def cmd_warmup(args: argparse.Namespace) -> int:
    from harness.run import cache_dir
    from harness.search import profiles
    from harness.tools import warmup
    from harness.tools.warmup.libraries import LIBRARIES

    profile = args.profile or "gpu"
    if profile not in profiles.SIZES:
        raise UsageError(f"unknown profile {profile!r}; known: {', '.join(profiles.SIZES)}")
    for name in args.backend or []:
        load_backend(name)
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    jobs = args.jobs or warmup.default_jobs()
    cuda = _default_device() == "cuda"
    say = lambda line: print(line, flush=True)  # noqa: E731
    return warmup.main(LIBRARIES, profile, args.backend, jobs, cuda, str(cache_dir.root()), say)


# --- repro ------------------------------------------------------------------------------------


def add_repro(p: argparse.ArgumentParser) -> None:
    p.add_argument("case", help="a Case as a JSON file or a JSON literal")
    p.add_argument("--backend", default="torch_native", help="a backend name or module:factory")
    p.add_argument("--device", choices=("cpu", "cuda"))
    p.add_argument("--json", action="store_true", help="also print the full result as JSON")
    p.add_argument("--probe", action="store_true", help="also run the mask probe and print its picture")
    p.add_argument("--sanitize", action="store_true", help="rerun it under compute-sanitizer memcheck (CUDA)")


def cmd_repro_sanitized(args: argparse.Namespace) -> int:
    """The repro under compute-sanitizer memcheck; exit 2 saying so where the tool is not installed."""
    from harness.tools import sanitizer

    if not hasattr(read_case(args.case), "seed"):
        raise UsageError("--sanitize takes a Case, not a GraphCase")
    load_backend(args.backend)
    if args.device == "cpu":
        raise UsageError("--sanitize checks CUDA memory accesses: use it with --device cuda")
    if sanitizer.find() is None:
        raise UsageError(sanitizer.not_installed())
    code = sanitizer.run(args.case, args.backend)
    print(f"compute-sanitizer memcheck: exit {code}" + (" (memory errors found)" if code == 86 else ""))
    return code


def cmd_repro(args: argparse.Namespace) -> int:
    from harness.backends import BackendBroken
    from harness.checks.numeric import check_case
    from harness.checks.probe import THRESHOLD_RULE, picture_text, probe
    from harness.checks.replay import replay_result
    from harness.core.graph_case import GraphCase

    if args.sanitize:
        return cmd_repro_sanitized(args)
    case = read_case(args.case)
    backend = load_backend(args.backend)
    device = args.device or _default_device()
    graph = isinstance(case, GraphCase)
    if graph and args.probe:
        raise UsageError("--probe takes a Case, not a GraphCase")
    for batch in case.batches if graph else (case,):
        check_size(batch, device)
    try:
        res = replay_result(backend, case, device) if graph else check_case(backend, case, device)
    except BackendBroken as e:
        print(f"{backend.name} on {device}: BROKEN: {e}")
        return 1
    print(f"{backend.name} on {device}: {res.status.upper()}: {res.reason}")
    if args.probe:
        pr = probe(backend, case, device)
        res.probe = pr.to_dict()
        print("mask probe: " + (pr.error or f"{pr.runs} backend runs; {THRESHOLD_RULE}"))
        for line in pr.lines:
            print(f"  {line}")
        if pr.requests:
            print(picture_text(pr))
    if args.json:
        print(json.dumps(res.to_dict(), indent=1))
    return {"pass": 0, "skip": NOTHING_CHECKED}.get(res.status, 1)


# --- mutants ----------------------------------------------------------------------------------


def positive_int(text: str) -> int:
    """An argument that counts something there must be at least one of, checked as it is parsed."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_mutants(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mutant", action="append", help="only mutants whose name contains this (repeatable)")
    p.add_argument("--backend", action="append", help="only mutants of this backend (repeatable)")
    p.add_argument("--family", action="append", help="only hunt in this family (repeatable)")
    p.add_argument("--first-family", action="store_true", help="hunt each mutant in its first family only")
    p.add_argument(
        "--device", action="append", choices=("cpu", "cuda"), help="default: cpu, and cuda where available"
    )
    p.add_argument("--exact-pool", action="store_true", help="add exact-size SWA pool variants (crashes)")
    p.add_argument("--max-examples", type=positive_int, default=200, help="examples per hunt (default 200)")
    p.add_argument("--shrink-runs", type=int, help="at most this many new cases while shrinking")
    p.add_argument(
        "--invariance-shrink-runs", type=int, help="the same for the determinism mutants (default: as above)"
    )
    p.add_argument("--profile", help="case sizes: default ci on the CPU, gpu on CUDA")
    p.add_argument("--isolate", action="store_true", help="run CPU cases in worker processes too")
    p.add_argument("--timeout", type=float, help="seconds per case in a worker (default 120)")
    p.add_argument("--json", help="write the rows (with each shrunk case) to this file")
    p.add_argument("--list", action="store_true", help="list the selected mutants and exit")


def cmd_mutants(args: argparse.Namespace) -> int:
    import time

    from harness.report.environment import collect
    from harness.run import isolation, mutation
    from harness.search import profiles

    if args.profile and args.profile not in profiles.SIZES:
        raise UsageError(f"unknown profile {args.profile!r}; known: {', '.join(profiles.SIZES)}")
    if args.json:
        writable(args.json, "--json")
    every = mutation.every_mutant(args.exact_pool)
    pairs = mutation.select(every, args.mutant, args.backend, args.family, args.first_family)
    if not pairs:
        raise UsageError("no mutant matches the filters (see --list)")
    if args.list:
        for m in {m.name: m for m, _ in pairs}.values():
            print(f"{m.name:44} {m.check:10} {m.method:24} {', '.join(m.families)}\n    {m.bug}")
        return 0
    if args.isolate:
        os.environ[isolation.ISOLATE_ENV] = "1"
    if args.timeout:
        os.environ[isolation.TIMEOUT_ENV] = str(args.timeout)
    devices = args.device or (["cpu", "cuda"] if _default_device() == "cuda" else ["cpu"])

    meta = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **collect()}
    done: list = []

    def progress(row) -> None:  # noqa: ANN001 - a mutation.Row
        where = f"{row.device}/{row.family}"
        print(f"  {row.outcome:8} {row.mutant} on {where} ({row.hunt_seconds:.1f}s)", flush=True)
        done.append(row)
        if args.json:  # rewritten after every hunt: a run stopped early keeps what it found
            mutation.write_json(args.json, done, meta)

    print(f"attn-harness mutants: {len(pairs)} hunts on {', '.join(devices)}", flush=True)
    shrink = (args.shrink_runs, args.invariance_shrink_runs)
    rows = mutation.run(pairs, devices, args.max_examples, shrink[0], args.profile, progress, shrink[1])
    print(mutation.table(rows))
    if args.json:
        print(f"json: {args.json}")
    return 0 if mutation.passed(rows) else 1


# --- bench ------------------------------------------------------------------------------------


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, e.g. 8192,32768")
    return values


def add_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda where available, else cpu")
    p.add_argument(
        "--backend", action="append", help="only this backend (repeatable; default: every one available here)"
    )
    p.add_argument(
        "--section",
        help="comma-separated: throughput,phases,scale,detection,coldstart,gpus (default: all but coldstart "
        "and gpus)",
    )
    p.add_argument("--cases", type=int, default=64, help="cases in the throughput mix (default 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the throughput mix (default 0)")
    p.add_argument(
        "--repeat", type=int, default=3, help="timed throughput passes; the median is reported (default 3)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="throughput: also check the mix in this many processes at once, as check --jobs N runs "
        "one backend (default 1: not)",
    )
    p.add_argument(
        "--scale-tokens", type=_int_list, default=None, help="request lengths (default 8192,32768,131072)"
    )
    p.add_argument(
        "--scale-timeout", type=float, default=180.0, help="seconds per reference run in scale (default 180)"
    )
    p.add_argument("--max-examples", type=int, default=200, help="examples per detection hunt (default 200)")
    p.add_argument(
        "--detection-budget", type=float, help="stop starting detection hunts after this many seconds"
    )
    p.add_argument(
        "--coldstart-timeout", type=float, default=1800.0, help="seconds per cold-start run (default 1800)"
    )
    p.add_argument(
        "--gpus-timeout", type=float, default=1800.0, help="seconds per check of section gpus (default 1800)"
    )
    p.add_argument("--json", default=str(DEFAULT_REPORTS / "bench.json"), help="default: reports/bench.json")


def cmd_bench(args: argparse.Namespace) -> int:
    from harness import backends
    from harness.tools import bench
    from harness.tools.bench.table import render

    device = args.device or _default_device()
    picked = args.section or ",".join(bench.DEFAULT_SECTIONS)
    sections = tuple(s.strip() for s in picked.split(",") if s.strip())
    bad = [s for s in sections if s not in bench.SECTIONS]
    if bad or not sections:
        raise UsageError(f"unknown section {bad[0] if bad else ''!r}; known: {', '.join(bench.SECTIONS)}")
    if min(args.cases, args.max_examples, args.repeat, args.workers) < 1:
        raise UsageError("--cases, --repeat, --workers and --max-examples must be at least 1")
    if args.backend:
        chosen = [load_backend(n) for n in args.backend]
    else:
        chosen = [b for b in backends.all_backends() if b.available(device) is None]
    opts = bench.Options(
        device=device,
        backends=chosen,
        sections=sections,
        cases=args.cases,
        seed=args.seed,
        repeat=args.repeat,
        workers=args.workers,
        scale_tokens=args.scale_tokens or bench.scale.SCALE_TOKENS,
        scale_timeout=args.scale_timeout,
        max_examples=args.max_examples,
        detection_budget=args.detection_budget,
        mutant_backends=args.backend,
        coldstart_timeout=args.coldstart_timeout,
        gpus_timeout=args.gpus_timeout,
        gpus_results=Path(args.json).with_name(Path(args.json).stem + "-gpus"),
    )
    print(f"attn-harness bench on {device}: {', '.join(sections)}", flush=True)
    doc = bench.run(opts, lambda line: print(line, flush=True), lambda d: bench.write_json(args.json, d))
    print(render(doc))
    bench.write_json(args.json, doc)
    print(f"json: {args.json}")
    return 0 if doc["passed"] else 1


# --- report -----------------------------------------------------------------------------------


def add_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", help="a results.json written by `check`")
    p.add_argument("--out", help="directory for index.html and junit.xml (default: next to results.json)")


def cmd_report(args: argparse.Namespace) -> int:
    from harness.report import render_views, results_json

    try:
        data = results_json.load(args.results)
    except results_json.ResultsError as e:
        raise UsageError(f"{args.results}: {e}") from None
    try:
        page = render_views(data, args.out or Path(args.results).parent)
    except OSError as e:
        raise UsageError(f"cannot write the report: {e}") from None
    print(f"report: {page}")
    return 0


# --- dispatch ---------------------------------------------------------------------------------


class Command(NamedTuple):
    help: str
    add: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    examples: str  # the epilog of its --help; tests/test_cli.py parses every example line


LIST_EXAMPLES = """
  python -m harness list                                  # every backend, and whether it runs here
  python -m harness list --backend flashinfer_paged       # one backend's capabilities
  python -m harness list --backend mypkg.attn:make_backend
"""
CHECK_EXAMPLES = """
  python -m harness check                                 # the whole suite on this machine
  python -m harness check --backend torch_native --family decode
  python -m harness check --backend flashinfer_ragged -k swa --profile dev
  python -m harness check --backend mypkg.attn:make_backend --device cpu
  python -m harness check --require flashinfer_paged,fa4 --results results.json
then `pytest cases --lf` reruns only the tests that failed (--sw: one at a time).
"""
REPRO_EXAMPLES = """
  python -m harness repro case.json --backend flashinfer_ragged   # a Case saved as JSON
  python -m harness repro '{"mode": "DECODE", "requests": [{"prefix_len": 40, "extend_len": 1}]}' --probe
  python -m harness repro case.json --backend flashinfer_paged --device cuda --sanitize
"""
REPORT_EXAMPLES = """
  python -m harness report reports/latest/results.json
  python -m harness report results.json --out review/
"""
WARMUP_EXAMPLES = """
  python -m harness warmup
  python -m harness warmup --backend fa4 --cache-dir /ci/cache/attn-harness
"""
MUTANTS_EXAMPLES = """
  python -m harness mutants --list --backend torch_native
  python -m harness mutants --backend torch_native --first-family
  python -m harness mutants --mutant window --max-examples 100 --json mutants.json
"""
BENCH_EXAMPLES = """
  python -m harness bench --section throughput --cases 32
  python -m harness bench --device cuda --section scale --scale-tokens 8192,32768
  python -m harness bench --device cuda --section gpus
"""

COMMANDS: dict[str, Command] = {
    "list": Command("backends, their capabilities, and availability here", add_list, cmd_list, LIST_EXAMPLES),
    "check": Command("run the suite (cases/) and write a report", add_check, cmd_check, CHECK_EXAMPLES),
    "warmup": Command(
        "compile every JIT variant a profile draws, into the cache", add_warmup, cmd_warmup, WARMUP_EXAMPLES
    ),
    "repro": Command("replay one case (a JSON file or a JSON literal)", add_repro, cmd_repro, REPRO_EXAMPLES),
    "report": Command(
        "re-render index.html and junit.xml from a results.json", add_report, cmd_report, REPORT_EXAMPLES
    ),
    "mutants": Command(
        "hunt the mutation catalogue with the suite's strategies", add_mutants, cmd_mutants, MUTANTS_EXAMPLES
    ),
    "bench": Command(
        "benchmark the harness: throughput, phases, reference scale, detection",
        add_bench,
        cmd_bench,
        BENCH_EXAMPLES,
    ),
}


CACHE_DIR_COMMANDS = ("check", "warmup", "repro", "mutants", "bench")


def add_cache_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-dir",
        help="the compile caches' directory (default: $ATTN_HARNESS_CACHE, else ~/.cache/attn-harness)",
    )


def use_cache_dir(flag: str | None) -> None:
    """Point the libraries' compile caches at the cache directory, before any of them is imported."""
    from harness.run import cache_dir

    if flag and Path(flag).exists() and not Path(flag).is_dir():
        raise UsageError(f"--cache-dir {flag}: not a directory")
    cache_dir.apply(flag)
    cache_dir.use_bytecode_cache()


class Parser(argparse.ArgumentParser):
    """argparse with a usage error as a UsageError (one line, exit 2); its subcommands are Parsers too."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} -h)")


def parser() -> argparse.ArgumentParser:
    first_examples = "".join(c.examples.splitlines(keepends=True)[1] for c in COMMANDS.values())
    p = Parser(
        prog="python -m harness",
        description=__doc__.splitlines()[0],
        epilog=f"examples:\n{first_examples}\nEach command's -h shows its options and more examples.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        sp = sub.add_parser(
            name,
            help=command.help,
            description=command.help,
            epilog=f"examples:{command.examples}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add(sp)
        if name in CACHE_DIR_COMMANDS:
            add_cache_dir(sp)
    return p


def command_line(argv: list[str]) -> str:
    """The command as the user typed it, for the report: `attn-harness ...` or `python -m harness ...`."""
    prog = "attn-harness" if Path(sys.argv[0]).name == "attn-harness" else "python -m harness"
    return f"{prog} {shlex.join(argv)}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parser().parse_args(argv)
        args.command_line = command_line(argv)
        use_cache_dir(getattr(args, "cache_dir", None))
        return COMMANDS[args.command].run(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
