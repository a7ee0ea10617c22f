"""pytest plugin: records every checked case, prints the per-family summary, writes the reports.

Registered by the root conftest.py. `--harness-results PATH` writes results.json; `--harness-report
DIR` writes results.json, index.html and junit.xml into DIR (docs/reports.md); `--harness-progress`
prints a progress line while the suite runs; `--harness-shard I/N` keeps every Nth test from the
Ith, so N processes can split one backend's suite (harness/run/parallel.py); where the shards draw
alike (the `gpu` profile) each keeps every search test and checks its Ith share of the cases in
each, by variant (harness/run/speed/variant_shards.py). The summary table is printed at the end of any
run that checked cases. Examples hypothesis tried while shrinking a failure (or crash, or hang) are
dropped except the final (minimal) one, so a failure counts once; a failing one is rerun through
the mask probe.

A suite test (one that takes the `record` fixture) always leaves a record of how it ended: a test
that failed without a failing case (the harness raised: build_batch, a reference, compare, this
plugin) leaves an `error` record with the traceback, one whose search the backend mostly refused a
`fail` record saying so, and a test skipped as a whole a `skip` record.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from hypothesis import settings

from harness.core.results import REFUSALS_CHECK, CaseResult, summary_table, test_record
from harness.report import environment, results_json, write_run
from harness.report.progress import Progress
from harness.run import (
    INTERRUPTED,
    RunInfo,
    ci_shards,
    default_id,
    isolation,
    record_mode,
    started_now,
    workers,
)
from harness.run.speed import variant_shards
from harness.run.speed.settings import RECORD_ENV
from harness.run.suite import Target
from harness.search import profiles
from harness.search.refusals import TooManyRefusals

pytest_plugins = ["harness.run.profile_option"]  # an unknown profile: a usage error, before it loads

_RESULTS_KEY = pytest.StashKey[list]()
_ITEM_KEY = pytest.StashKey[list]()
_PROGRESS_KEY = pytest.StashKey[Progress]()
_STARTED_KEY = pytest.StashKey[tuple]()
_SHARD_KEY = pytest.StashKey[tuple]()
_CI_SHARE_KEY = pytest.StashKey[dict]()  # a CI share's run.shard object (check --shard)
_EXIT_KEY = pytest.StashKey[int]()  # pytest's exit status, for --harness-quick-exit
_COLLECTED_KEY = pytest.StashKey[list]()  # (test id, backend@device, family) of every test to run
_RUNNING_KEY = pytest.StashKey[tuple]()  # (test id, its records so far) of the suite test running
_TIMES_KEY = pytest.StashKey[dict]()  # "collect": seconds to the end of collection; nodeid -> test wall
PROGRESS_EVERY_S = 5.0  # while a test runs; a line is also printed when a test ends (at most 1/s)
RECORD_LINE = "attn-harness RECORD MODE: drawn cases recorded to"
TRACEBACK_CHARS = 20000  # of a harness error's traceback kept in its record
NOT_FAILURES = ("pass", "xfail", "refused", "skip")  # kept whether or not the test failed
_INTERRUPTS: list[type] = []  # pytest_keyboard_interrupt's exceptions, read once by the run's end


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attn-harness")
    group.addoption("--harness-results", default=None, help="write results.json here")
    group.addoption("--harness-report", default=None, help="write results.json, index.html, junit.xml here")
    group.addoption("--harness-run-id", default=None, help="the run id recorded in the report")
    group.addoption("--harness-progress", action="store_true", help="print a progress line as cases run")
    group.addoption("--harness-command", default=None, help="the command the report's header shows")
    group.addoption(
        "--harness-no-probe", action="store_true", help="do not rerun failures through the mask probe"
    )
    group.addoption(
        "--harness-quick-exit",
        action="store_true",
        help="end the process at once when pytest is done, its output and results written, without "
        "Python's finalisation (`check` gives it to each part)",
    )
    group.addoption(
        "--harness-ci-collect",
        default=None,
        metavar="FILE",
        help="write the collected tests (id, backend) to FILE as JSON (`check --shard` deals from them)",
    )
    group.addoption(
        "--harness-ci-share",
        default=None,
        metavar="FILE",
        help="check only the tests of the CI share in FILE, derandomized (`check --shard` writes it)",
    )
    group.addoption(
        "--harness-shard",
        default=None,
        metavar="I/N",
        help="run only the tests whose index (after -k/-m) modulo N is I, 0 <= I < N (in a profile "
        "whose shards draw alike, such as gpu: every search test, checking the Ith share of its cases)",
    )


def parse_shard(text: str) -> tuple[int, int]:
    """`I/N` as (I, N); checked before collection so a typo fails at once, not after a long collect."""
    expected = f"--harness-shard {text!r}: expected I/N with integers 0 <= I < N, e.g. 0/2"
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise pytest.UsageError(expected) from None
    if count < 1 or not 0 <= index < count:
        raise pytest.UsageError(expected)
    return index, count


def pytest_report_header(config: pytest.Config) -> str | None:
    if record_mode.path():
        return f"{RECORD_LINE} {record_mode.path()} (${RECORD_ENV}): nothing is checked"
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_RESULTS_KEY] = []
    config.stash[_PROGRESS_KEY] = Progress()
    config.stash[_STARTED_KEY] = started_now()
    config.stash[_TIMES_KEY] = {}
    shard = config.getoption("--harness-shard")
    config.stash[_SHARD_KEY] = parse_shard(shard) if shard else (0, 1)
    variant_shards.configure(*config.stash[_SHARD_KEY])
    if config.getoption("--harness-command") and hasattr(config.option, "force_short_summary"):
        # Run by `check`: a failure on a case has printed its verdict and repro already; on CI pytest
        # would repeat the whole text in its short summary (running_on_ci()), so keep that to one line.
        config.option.force_short_summary = True
    from harness import backends

    for line in (
        "swa: sliding-window cases",
        "prefix: EXTEND with a cached prefix",
        "prefill: EXTEND without a cached prefix",
        "decode: DECODE",
        "draft_extend_v2: DRAFT_EXTEND_V2",
        "verify: TARGET_VERIFY",
        "cross: cross-attention",
        "encoder: ENCODER_ONLY, bidirectional self-attention over each request's own tokens",
        "deterministic: determinism checks",
        "graph: CUDA-graph capture and replay checks",
        "gpu: needs a CUDA device",
    ):
        config.addinivalue_line("markers", line)
    for name in backends.names():
        config.addinivalue_line("markers", f"{name}: the {name} backend")
        try:  # a plugin that cannot load or breaks the contract: one line, not a collection traceback
            backends.load(name)
        except backends.BackendError as e:
            raise pytest.UsageError(str(e)) from None


def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo) -> None:
    """Note a SIGINT (Ctrl-C, `check` stopping its parts): pytest calls this hook for collection errors
    too (its `Interrupted` is a KeyboardInterrupt), and those stopped nothing the user asked to stop."""
    _INTERRUPTS.append(excinfo.type)


def interrupted_by_signal() -> bool:
    """Whether this run was stopped by a SIGINT, read once (a run inside another starts clean)."""
    stopped = KeyboardInterrupt in _INTERRUPTS
    _INTERRUPTS.clear()
    return stopped


def not_run(config: pytest.Config) -> list[str]:
    """The tests an interrupted run did not run to their end, a line per backend and device: how
    many, of which families (run.interrupted's `not_run`)."""
    ran = config.stash[_TIMES_KEY].get("ended", set())
    left: dict[str, list[str]] = {}
    total: dict[str, int] = {}
    for test_id, backend, family in config.stash.get(_COLLECTED_KEY, []):
        total[backend] = total.get(backend, 0) + 1
        if test_id not in ran:
            left.setdefault(backend, []).append(family)
    return [
        f"{backend}: {len(fams)} of {total[backend]} tests not run to their end "
        f"({', '.join(dict.fromkeys(fams))})"
        for backend, fams in left.items()
    ]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_KEY] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    variant_shards.configure(0, 1)  # a run inside another (pytester) must not leave its shard set
    _INTERRUPTS.clear()
    if config.getoption("--harness-quick-exit") and _EXIT_KEY in config.stash:
        quick_exit(config.stash[_EXIT_KEY])


def quick_exit(code: int) -> None:
    """End a part's pytest process once every plugin has unconfigured: its results and output are
    written; its worker is stopped first (it ends at once too). Python's finalisation of a process
    with torch, hypothesis and the harness loaded would keep every part running about a second
    after its results are written."""
    workers.stop_all()
    workers.quick_exit(code)


@pytest.fixture
def record(request: pytest.FixtureRequest):  # noqa: ANN201 - a callable fixture
    """Append a result of the running test to the session's records: a CaseResult, or anything with
    a `status` and a `to_dict()` giving its results.json record (the model-level ModelResult)."""
    items: list[CaseResult] = []
    request.node.stash[_ITEM_KEY] = items
    config = request.config
    config.stash[_RUNNING_KEY] = (request.node.nodeid, items)  # an interrupt keeps what it checked
    progress = config.stash[_PROGRESS_KEY]

    def record(result: CaseResult) -> None:
        items.append(result)
        progress.case(result.status, request.node.nodeid)
        if config.getoption("--harness-progress") and progress.due(PROGRESS_EVERY_S):
            _print_progress(config, progress)

    return record


def _print_progress(config: pytest.Config, progress: Progress) -> None:
    """One progress line on the terminal, past pytest's output capture."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return
    if capture is None:
        reporter.write_line(progress.line())
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(progress.line())


@pytest.hookimpl(trylast=True)  # after -k and -m: the shards split what is selected, evenly
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without the placeholders of empty parametrizations (`_drop_empty_parametrizations`), a CI
    share's items (`_keep_ci_share`), this part's (`_keep_shard`), the model checks first
    (`_models_first`)."""
    _drop_empty_parametrizations(config, items)
    _keep_ci_share(config, items)
    _keep_shard(config, items)
    _models_first(items)


EMPTY_PARAMETERS = "got empty parameter set"  # the start of pytest's skip reason for such a placeholder


def _drop_empty_parametrizations(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the item pytest makes for a test parametrized over nothing: none of the selected
    backends has such a test (a backend that declares no deterministic mode has no determinism test;
    `list` shows its capabilities). Kept, it was a skip record of backend `?` on device `?`."""
    dropped = [item for item in items if _empty_parametrization(item)]
    if dropped:
        items[:] = [item for item in items if not _empty_parametrization(item)]
        config.hook.pytest_deselected(items=dropped)


def _empty_parametrization(item: pytest.Item) -> bool:
    return any(
        str(mark.kwargs.get("reason", "")).startswith(EMPTY_PARAMETERS) for mark in item.iter_markers("skip")
    )


def _keep_ci_share(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tests of the CI share `check --shard` wrote (harness/run/ci_shards.py), drawing the
    same cases as the same share on any other runner; the rest are reported as deselected."""
    path = config.getoption("--harness-ci-share")
    if not path:
        return
    shard, tests = ci_shards.read_share(path)
    config.stash[_CI_SHARE_KEY] = shard
    profiles.fix_draws()
    dropped = [item for item in items if item.nodeid not in tests]
    items[:] = [item for item in items if item.nodeid in tests]
    if dropped:
        config.hook.pytest_deselected(items=dropped)


def _models_first(items: list[pytest.Item]) -> None:
    """Move the model checks ahead of the other tests, in their order. A model check imports
    transformers, whose output classes register as pytree types; dynamo guards each graph of a
    compiled call on that registry (flex_compiled's, which traces through pytree), so every graph a
    process traced before the import would be traced again after it."""
    items.sort(key=lambda item: "model" not in _params(item))


def _params(item: pytest.Item) -> dict:
    """A test's parametrize values (none for a test without parameters)."""
    return item.callspec.params if hasattr(item, "callspec") else {}


def _keep_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep this shard's items: every search test where the shards split the cases by variant, a
    backend's whole tests where the variant weights deal them (all in one shard: the first pays
    transformers' import), and every Nth of the others; the rest are reported as deselected, so the
    counts add up."""
    index, count = config.stash[_SHARD_KEY]
    if count == 1:
        return
    by_test = [item for item in items if not _split_by_variant(item)]
    dealt = {id(item): _dealt_shard(item, count) for item in by_test}
    by_index = [item for item in by_test if dealt[id(item)] is None]
    mine = {id(item) for i, item in enumerate(by_index) if i % count == index}
    mine |= {id(item) for item in by_test if dealt[id(item)] == index}
    dropped = [item for item in by_test if id(item) not in mine]
    items[:] = [item for item in items if id(item) in mine or _split_by_variant(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)


def _split_by_variant(item: pytest.Item) -> bool:
    """Whether a test is a search whose cases the shards split by variant (every shard runs it)."""
    return isinstance(_params(item).get("target"), Target) and variant_shards.splits()


def _dealt_shard(item: pytest.Item, count: int) -> int | None:
    """The shard the variant weights deal a backend's whole tests to (its model checks), or None."""
    name = _params(item).get("backend_name")
    if not isinstance(name, str) or not variant_shards.splits():
        return None
    from harness import backends

    return variant_shards.shard_of_whole_tests(backends.load(name), count)


def pytest_collection_finish(session: pytest.Session) -> None:
    progress = session.config.stash[_PROGRESS_KEY]
    progress.total_tests = len(session.items)
    progress.examples_per_test = settings().max_examples  # of the loaded profile: the estimate's unit
    idents = [(i.nodeid, _identity(i)) for i in session.items]
    to_run = [(t, f"{d['backend']}@{d['device']}", d["family"]) for t, d in idents]
    session.config.stash[_COLLECTED_KEY] = to_run
    session.config.stash[_TIMES_KEY]["collect"] = time.time() - session.config.stash[_STARTED_KEY][0]
    collected = session.config.getoption("--harness-ci-collect")
    if collected:
        ci_shards.write_collected(collected, [(i.nodeid, _identity(i).get("backend")) for i in session.items])


def _identity(item: pytest.Item) -> dict:
    """backend, device, family, features (and a model-level test's model, in `extra`) of a suite
    test, from its Target or its parameters: the fields of its test_record."""
    params = _params(item)
    t = params.get("target")
    if isinstance(t, Target):
        features = ["window"] if t.window == "swa" else []
        return dict(backend=t.backend_name, device=t.device, family=t.family, features=features)
    family = "model" if "model" in params else getattr(item, "originalname", item.name).removeprefix("test_")
    backend, device = str(params.get("backend_name", "?")), str(params.get("device", "?"))
    ident: dict = dict(backend=backend, device=device, family=family)
    if "model" in params:
        ident["extra"] = {"model": params["model"]}
    return ident


def _exceptions(exc: BaseException) -> list[BaseException]:
    """The exception, or those inside an exception group (hypothesis reports several bugs as one)."""
    subs = getattr(exc, "exceptions", None)  # an exception group (Python 3.11+)
    if isinstance(subs, tuple):
        return [e for sub in subs for e in _exceptions(sub)]
    return [exc]


def _harness_error(item: pytest.Item, report: pytest.TestReport, exc: BaseException) -> dict:
    """The `error` record of a suite test in which the harness itself raised `exc`."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = f" (at {tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno})" if tb else ""
    first = (str(exc).strip().splitlines() or [""])[0]
    when = " while setting the test up" if report.when == "setup" else ""
    reason = f"the harness raised {type(exc).__name__}: {first}{where}{when}"
    ident = _identity(item)
    ident.setdefault("extra", {})["traceback"] = report.longreprtext[-TRACEBACK_CHARS:]
    return test_record("error", reason=reason, test_id=item.nodeid, **ident)


def _test_records(item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo, kept: list) -> list:
    """The records of how a suite test ended that no case record says: skipped as a whole, failed on
    its refusals, or failed because the harness raised (every exception that is not a case's failure)."""
    if report.skipped:
        if kept:
            return []
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        return [test_record("skip", reason=reason, test_id=item.nodeid, **_identity(item))]
    if not report.failed or call.excinfo is None:
        return []
    failed_case = any(r.status not in NOT_FAILURES for r in kept)
    out = []
    for exc in _exceptions(call.excinfo.value):
        if isinstance(exc, TooManyRefusals):
            ident = _identity(item)
            ident.setdefault("extra", {})["check"] = REFUSALS_CHECK
            out.append(test_record("fail", reason=str(exc), test_id=item.nodeid, **ident))
        elif not (failed_case and isinstance(exc, AssertionError)):
            out.append(_harness_error(item, report, exc))
    return out


def _case_failure_only(report: pytest.TestReport, call: pytest.CallInfo) -> None:
    """A test that failed on a case prints that case's failure text (its verdict and one repro command)
    instead of the traceback through the search and hypothesis's repr of the same case; a harness error
    or a search that was mostly refused keeps its traceback."""
    if call.excinfo is None:
        return
    excs = _exceptions(call.excinfo.value)
    if all(type(e) is AssertionError for e in excs):
        report.longrepr = "\n".join(str(e) for e in excs)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201
    outcome = yield
    report = outcome.get_result()
    tests = item.config.stash[_TIMES_KEY].setdefault("tests", {})
    tests[item.nodeid] = tests.get(item.nodeid, 0.0) + report.duration
    if report.when == "teardown" or (report.when == "setup" and report.passed):
        return
    item.config.stash[_TIMES_KEY].setdefault("ended", set()).add(item.nodeid)
    items: list[CaseResult] = item.stash.get(_ITEM_KEY, [])
    kept = [r for r in items if r.status in NOT_FAILURES]
    fails = [r for r in items if r.status not in NOT_FAILURES]  # fail, crash, hang
    t = _params(item).get("target")
    if report.failed and fails:
        kept.append(fails[-1])
        _case_failure_only(report, call)
        probing = isinstance(t, Target) and not item.config.getoption("--harness-no-probe")
        if probing and fails[-1].status == "fail":
            fails[-1].probe = isolation.probe_failure(t.backend(), fails[-1].case, t.device)
    out = item.config.stash[_RESULTS_KEY]
    before = len(out)
    for r in kept:
        d = r.to_dict()
        d["test_id"] = item.nodeid
        out.append(d)
    if "record" in getattr(item, "fixturenames", ()):  # a suite test: how it ended is a record too
        out += _test_records(item, report, call, kept)
    progress = item.config.stash[_PROGRESS_KEY]
    progress.test_done(item.nodeid, report.failed, len(out) - before)
    if item.config.getoption("--harness-progress") and progress.due(1.0):
        _print_progress(item.config, progress)


def run_info(config: pytest.Config, exitstatus: int) -> RunInfo:
    """This process's `run` object; its command is the user's (`check` passes it), else pytest's."""
    start, started = config.stash[_STARTED_KEY]
    command = config.getoption("--harness-command") or " ".join(["pytest", *config.invocation_params.args])
    times = config.stash[_TIMES_KEY]
    return RunInfo(
        id=config.getoption("--harness-run-id") or default_id(start),
        started=started,
        configured_at=start,
        elapsed_s=time.time() - start,
        profile=profiles.current(),
        derandomized=profiles.derandomized(),
        command=command,
        exit_status=exitstatus,
        collect_s=times.get("collect", 0.0),
        test_s=times.get("tests", {}),
        shard=config.stash.get(_CI_SHARE_KEY, None),
    )


def _in_flight(config: pytest.Config) -> list[dict]:
    """The records of the test an interrupt stopped, as its end would have kept them: every case
    that is not a failure, and the last failure (the examples before it were shrinking)."""
    test_id, items = config.stash.get(_RUNNING_KEY, ("", []))
    if not items or test_id in config.stash[_TIMES_KEY].get("ended", set()):
        return []
    fails = [r for r in items if r.status not in NOT_FAILURES]
    kept = [r for r in items if r.status in NOT_FAILURES] + fails[-1:]
    return [r.to_dict() | {"test_id": test_id} for r in kept]


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:  # noqa: ANN001
    interrupted = interrupted_by_signal()
    results = config.stash.get(_RESULTS_KEY, []) + (_in_flight(config) if interrupted else [])
    if config.getoption("--harness-progress"):
        terminalreporter.write_line(config.stash[_PROGRESS_KEY].line())
    if results:
        terminalreporter.write_sep("=", "attn-harness summary (records per backend and family)")
        terminalreporter.write_line(summary_table(results))
    path, report_dir = config.getoption("--harness-results"), config.getoption("--harness-report")
    if record_mode.path():  # its passes were drawn, not checked: no results.json, no report
        terminalreporter.write_line(f"{RECORD_LINE} {record_mode.path()}; no results or report written")
        return
    if not (path or report_dir):
        return
    run = run_info(config, exitstatus)
    if interrupted:
        run = dataclasses.replace(run, exit_status=INTERRUPTED, interrupted={"not_run": not_run(config)})
    data = results_json.build(results, run.to_dict(), environment.collect())
    if path:
        results_json.dump(path, data)
        terminalreporter.write_line(f"results: {path}")
    if report_dir:
        page = write_run(report_dir, data)
        if not config.getoption("--harness-command"):  # `check` names the page itself (and latest)
            terminalreporter.write_line(f"report: {page}")
