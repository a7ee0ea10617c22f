"""python -m harness {list, check, warmup, repro, report, merge, mutants, bench}: the command line.

Bad input (unknown backend, malformed JSON, an invalid or oversized Case, a bad results file, an
unwritable output path, a bad option value) exits 2 with one line naming the problem, before anything
runs or is written (docs/reports.md lists it); a failing check or repro exits 1. Each subcommand is
a pair of functions, `add_<name>` (its arguments) and `cmd_<name>` (what it does), registered in
COMMANDS. The compile caches are pointed at one directory (harness/run/cache_dir.py) before any
command runs, so every library and child process sees it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, NoReturn

import harness
from harness.run import check
from harness.run.check import RequestError as UsageError
from harness.run.check import load_backend, writable
from harness.run.speed import settings

DEFAULT_REPORTS = Path("reports")  # under the current directory, checkout or installed


def say(line: str) -> None:
    """A line of a long-running command's output, shown at once."""
    print(line, flush=True)


# --- list -------------------------------------------------------------------------------------
def add_list(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", action="append", help="describe this backend or module:factory spec")


def cmd_list(args: argparse.Namespace) -> int:
    from harness import backends
    from harness.run import cache_dir
    from harness.run.listing import describe_backend

    broken = False
    for name in dict.fromkeys(args.backend or backends.names()):
        lines, bad = describe_backend(name)
        print("\n".join(lines))
        broken |= bad
    print("\n".join(cache_dir.describe()))
    return 1 if broken else 0


# --- check ------------------------------------------------------------------------------------
def add_check(p: argparse.ArgumentParser) -> None:
    opt = p.add_argument
    opt("--backend", action="append", help="only this backend: a name or module:factory (repeatable)")
    opt("--family", action="append", help="only this family: decode, prefill, prefix, draft_extend_v2, "
        "verify, cross, encoder, graph (the CUDA-graph replays) (repeatable)")
    opt("--mode", action="append", help="only this forward mode, e.g. EXTEND (= prefill + prefix) "
        "(repeatable)")
    opt("-k", help="a pytest -k expression, e.g. swa")
    opt("-m", "--marker", help="a pytest marker expression, e.g. 'swa and not gpu'")
    opt("--device", choices=("cpu", "cuda"), help="only backends on this device (default: cuda where "
        "present)")
    opt("--profile", help="hypothesis profile: ci, dev, gpu, thorough")
    opt("--require", action="append", metavar="NAME,...", help="exit 2 before running unless these "
        f"backends run on the device here (also ${settings.REQUIRE_ENV})")
    opt("--reports", default=str(DEFAULT_REPORTS), help="write the report to REPORTS/<run-id>/ and point "
        "REPORTS/latest at it (default: reports/ in the current directory)")
    opt("--results", help="also write results.json here")
    opt("--no-progress", action="store_true", help="no progress line")
    opt("--no-probe", action="store_true", help="do not rerun failures through the mask probe")
    opt("--jobs", type=int, help="pytest processes at once, the longest backends first; one that would bound "
        f"the wall time is split into shards (default 1; on CUDA 1 per {check.CORES_PER_JOB} cores, "
        f"{check.JOBS_PER_GPU} a GPU at most)")
    opt("--no-warmup", action="store_true", help="on CUDA, do not compile the JIT variants beside the check "
        "(harness/run/speed/warm_gate.py); each backend then compiles what it draws in its own processes")
    opt("--gpus", metavar="LIST", help="spread the processes over these GPUs: CUDA_VISIBLE_DEVICES entries, "
        "e.g. 0,1 (default: every visible GPU)")
    opt("--shard", metavar="I/N", help="check the Ith of N shares of the selected tests, as CI runner I of N "
        "(also $ATTN_HARNESS_SHARD; docs/ci.md)")
    opt("--costs", metavar="FILE", help="with --shard: deal the shares by this cost table (a results.json or "
        "test id or backend -> seconds) instead of the shipped one")
    opt("--pins", metavar="FILE", help="check this pins file's cases first in every search (docs/ci.md)")
    opt("--keep-failures", metavar="FILE", help="add this run's failing cases to this pins file (docs/ci.md)")


def cmd_check(args: argparse.Namespace) -> int:
    """The check (harness/run/check.py) as the options ask; its exit status is check.conclude's."""
    request = check.CheckRequest(
        backends=tuple(dict.fromkeys(args.backend or ())),  # named twice: checked once
        families=tuple(args.family or ()),
        modes=tuple(args.mode or ()),
        device=args.device,
        profile=args.profile,
        marker=args.marker,
        keyword=args.k,
        require=tuple(args.require or ()),
        jobs=args.jobs,
        gpus=args.gpus,
        reports=Path(args.reports),
        results=Path(args.results) if args.results else None,
        progress=not args.no_progress, probe=not args.no_probe, warmup=not args.no_warmup,
        command_line=args.command_line,
        shard=args.shard or settings.current().shard,
        costs=Path(args.costs) if args.costs else None,
        pins=args.pins, keep_failures=args.keep_failures,
    )
    return check.conclude(check.run_check(request, say), say, lambda line: print(line, file=sys.stderr))


# --- warmup -----------------------------------------------------------------------------------
def add_warmup(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help="compile the variants this profile draws: ci, dev, gpu, thorough (gpu)")
    p.add_argument("--backend", action="append", help="only what these backends compile (repeatable)")
    p.add_argument("--jobs", type=int, help="cores to compile on (default: all of them)")


def cmd_warmup(args: argparse.Namespace) -> int:
    from harness.run import cache_dir
    from harness.run.speed import warmup
    from harness.run.speed.warmup.libraries import LIBRARIES
    from harness.search import profiles

    profile = args.profile or "gpu"
    if profile not in profiles.SIZES:
        raise UsageError(f"unknown profile {profile!r}; known: {', '.join(profiles.SIZES)}")
    for name in args.backend or []:
        load_backend(name)
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    jobs, cuda = args.jobs or warmup.default_jobs(), check.default_device() == "cuda"
    return warmup.main(LIBRARIES, profile, args.backend, jobs, cuda, str(cache_dir.root()), say)


# --- repro ------------------------------------------------------------------------------------
def add_repro(p: argparse.ArgumentParser) -> None:
    p.add_argument("case", help="a Case as a JSON file or a JSON literal")
    p.add_argument("--backend", default="torch_native", help="a backend name or module:factory")
    p.add_argument("--device", choices=("cpu", "cuda"))
    p.add_argument("--json", action="store_true", help="also print the full result as JSON")
    p.add_argument("--probe", action="store_true", help="also run the mask probe and print its picture")
    p.add_argument("--sanitize", action="store_true", help="rerun it under compute-sanitizer memcheck (CUDA)")


def cmd_repro(args: argparse.Namespace) -> int:
    from harness.run.repro import repro

    if args.sanitize:  # compute-sanitizer memcheck (harness/tools/sanitizer.py)
        from harness.tools import sanitizer

        return sanitizer.repro(args.case, args.backend, args.device)
    return repro(args.case, args.backend, args.device, args.probe, args.json)


# --- mutants ----------------------------------------------------------------------------------
def positive_int(text: str) -> int:
    """An argument that counts something there must be at least one of, checked as it is parsed."""
    value = int(text) if text.strip().lstrip("-").isdigit() else None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer of at least 1")
    return value


def add_mutants(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mutant", action="append", help="only mutants whose name contains this (repeatable)")
    p.add_argument("--backend", action="append", help="only mutants of this backend (repeatable)")
    p.add_argument("--family", action="append", help="only hunt in this family (repeatable)")
    p.add_argument("--first-family", action="store_true", help="hunt each mutant in its first family only")
    p.add_argument("--device", action="append", choices=("cpu", "cuda"), help="default: cpu, and cuda "
                   "where available")
    p.add_argument("--exact-pool", action="store_true", help="add exact-size SWA pool variants (crashes)")
    p.add_argument("--max-examples", type=positive_int, default=200, help="examples per hunt (default 200)")
    p.add_argument("--shrink-runs", type=int, help="at most this many new cases while shrinking")
    p.add_argument("--invariance-shrink-runs", type=int, help="the same for the determinism mutants "
                   "(default: as above)")
    p.add_argument("--profile", help="case sizes: default ci on the CPU, gpu on CUDA")
    p.add_argument("--isolate", action="store_true", help="run CPU cases in worker processes too")
    p.add_argument("--timeout", type=float, help="seconds per case in a worker (default 120)")
    p.add_argument("--json", help="write the rows (with each shrunk case) to this file")
    p.add_argument("--list", action="store_true", help="list the selected mutants and exit")


def cmd_mutants(args: argparse.Namespace) -> int:
    from harness import hunts
    from harness.search import profiles

    if args.profile and args.profile not in profiles.SIZES:
        raise UsageError(f"unknown profile {args.profile!r}; known: {', '.join(profiles.SIZES)}")
    if args.json:
        writable(args.json, "--json")
    every = hunts.every_mutant(args.exact_pool)
    pairs = hunts.select(every, args.mutant, args.backend, args.family, args.first_family)
    if not pairs:
        raise UsageError("no mutant matches the filters (see --list)")
    if args.list:
        print("\n".join(hunts.listing(pairs)))
        return 0
    if args.isolate:
        settings.use(isolate=True)
    if args.timeout:
        settings.use(case_timeout=args.timeout)
    devices = args.device or (["cpu", "cuda"] if check.default_device() == "cuda" else ["cpu"])
    print(f"attn-harness mutants: {len(pairs)} hunts on {', '.join(devices)}", flush=True)
    shrink = (args.shrink_runs, args.invariance_shrink_runs)
    rows = hunts.hunt_all(pairs, devices, args.max_examples, shrink, args.profile, args.json)
    print(hunts.table(rows))
    if args.json:
        print(f"json: {args.json}")
    return 0 if hunts.passed(rows) else 1


# --- bench ------------------------------------------------------------------------------------
def add_bench(p: argparse.ArgumentParser) -> None:
    from harness.tools.bench import arguments

    arguments.add(p, default_json=str(DEFAULT_REPORTS / "bench.json"))


def cmd_bench(args: argparse.Namespace) -> int:
    from harness.tools import bench

    try:
        return bench.command(args, args.device or check.default_device())
    except bench.OptionError as e:
        raise UsageError(str(e)) from None


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


def add_merge(p: argparse.ArgumentParser) -> None:
    p.add_argument("shares", nargs="+", help="each CI runner's results.json of a `check --shard I/N`")
    p.add_argument("--out", required=True, help="where the merged results.json and report go")
    p.add_argument("--previous", help="the last run's merged results.json: new failures, fixed ones")


def cmd_merge(args: argparse.Namespace) -> int:
    from harness.report import merge

    try:
        page, code = merge.write(args.shares, args.out, args.previous, args.command_line)
    except merge.MergeError as e:
        raise UsageError(str(e)) from None
    print(f"report: {page}")
    return code


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
then `pytest cases --lf -o cache_dir=reports/latest/.pytest_cache` reruns the tests that failed.
exit: 0 passed, 1 a failure, 2 bad input or environment, 3 nothing checked (all skipped), 130 interrupted
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
MERGE_EXAMPLES = """
  python -m harness merge share1/results.json share2/results.json --out merged
  python -m harness merge share*/results.json --out merged --previous last/results.json
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
    "warmup": Command("compile every JIT variant a profile draws, into the cache", add_warmup, cmd_warmup,
                      WARMUP_EXAMPLES),
    "repro": Command("replay one case (a JSON file or a JSON literal)", add_repro, cmd_repro, REPRO_EXAMPLES),
    "report": Command("re-render index.html and junit.xml from a results.json", add_report, cmd_report,
                      REPORT_EXAMPLES),
    "merge": Command("join the results of a check split with --shard into one report", add_merge, cmd_merge,
                     MERGE_EXAMPLES),
    "mutants": Command("hunt the mutation catalogue with the suite's strategies", add_mutants, cmd_mutants,
                       MUTANTS_EXAMPLES),
    "bench": Command("benchmark the harness: throughput, phases, reference scale, detection", add_bench,
                     cmd_bench, BENCH_EXAMPLES),
}


CACHE_DIR_COMMANDS = ("check", "warmup", "repro", "mutants", "bench")


def add_cache_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", help="the compile caches' directory (default: $ATTN_HARNESS_CACHE, else "
                   "~/.cache/attn-harness)")


def use_cache_dir(flag: str | None) -> None:
    """Point the libraries' compile caches at the cache directory, before any of them is imported."""
    from harness.run import cache_dir

    why = cache_dir.problem(flag)  # an environment fault, named before anything runs
    if why:
        raise UsageError(why)
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
    p.add_argument("--version", action="version", version=f"attn-harness {harness.__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        raw = argparse.RawDescriptionHelpFormatter
        sp = sub.add_parser(name, help=command.help, description=command.help,
                            epilog=f"examples:{command.examples}", formatter_class=raw)
        command.add(sp)
        if name in CACHE_DIR_COMMANDS:
            add_cache_dir(sp)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with check.as_ctrl_c():
        return _main(argv)


def _main(argv: list[str]) -> int:
    try:
        args = parser().parse_args(argv)
        prog = "attn-harness" if Path(sys.argv[0]).name == "attn-harness" else "python -m harness"
        args.command_line = f"{prog} {shlex.join(argv)}"  # the report shows the command as typed
        use_cache_dir(getattr(args, "cache_dir", None))
        return COMMANDS[args.command].run(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before or between a command's steps (a check's run handles its own)
        print("interrupted", file=sys.stderr)
        return check.INTERRUPTED
