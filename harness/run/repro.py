"""`repro`: one Case (or GraphCase) replayed through one backend, as the check ran it, with its
verdict and, on request, the mask probe's picture and the full result as JSON.

A Case is read from a JSON file or a JSON literal; a bad one, or one larger than the device's free
memory (harness/checks/footprint.py), is a RequestError naming the problem before anything runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from harness.run import check
from harness.run.check import RequestError, load_backend

NOTHING_CHECKED = 3  # the exit status when the case did not run (a SKIP: unsupported, no device)


def read_case(text: str):  # noqa: ANN201 - returns a Case or a GraphCase
    """A Case from a path to a JSON file or from a JSON literal; a GraphCase (a CUDA-graph replay
    sequence: an object with `batches`) likewise."""
    from harness.core.case import Case, CaseError
    from harness.core.graph_case import GraphCase

    src = text
    if not text.lstrip().startswith("{"):
        path = Path(text)
        if not path.is_file():
            raise RequestError(f"no such case file: {text}")
        try:
            src = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise RequestError(f"case file {text} is not UTF-8 text: {e}") from None
        except OSError as e:
            raise RequestError(f"cannot read case file {text}: {e.strerror}") from None
    try:
        parsed = json.loads(src)
    except (ValueError, RecursionError):
        parsed = None  # Case.from_json says what is wrong with it
    graph = isinstance(parsed, dict) and "batches" in parsed
    try:
        return GraphCase.from_json(src) if graph else Case.from_json(src)
    except (CaseError, TypeError) as e:
        raise RequestError(f"invalid {'graph case' if graph else 'case'}: {e}") from None


def check_size(case, device: str) -> None:  # noqa: ANN001 - a Case
    """Refuse a case larger than the device's free memory before it runs."""
    from harness.checks.footprint import fits
    from harness.core.case import CaseError

    try:
        fits(case, device)
    except CaseError as e:
        raise RequestError(str(e)) from None


def repro(
    text: str,
    backend_name: str,
    device: str | None,
    probe: bool,
    as_json: bool,
    say: Callable[[str], None] = print,
) -> int:
    """Replay the case `text` names: 0 when it passes, NOTHING_CHECKED when skipped, else 1."""
    from harness.backends import BackendBroken
    from harness.checks.numeric import check_case
    from harness.checks.replay import replay_result
    from harness.core.graph_case import GraphCase

    case = read_case(text)
    backend = load_backend(backend_name)
    device = device or check.default_device()
    graph = isinstance(case, GraphCase)
    if graph and probe:
        raise RequestError("--probe takes a Case, not a GraphCase")
    for batch in case.batches if graph else (case,):
        check_size(batch, device)
    try:
        res = replay_result(backend, case, device) if graph else check_case(backend, case, device)
    except BackendBroken as e:
        say(f"{backend.name} on {device}: BROKEN: {e}")
        return 1
    say(f"{backend.name} on {device}: {res.status.upper()}: {res.reason}")
    if probe:
        res.probe = _probe(backend, case, device, say)
    if as_json:
        say(json.dumps(res.to_dict(), indent=1))
    return {"pass": 0, "skip": NOTHING_CHECKED}.get(res.status, 1)


def _probe(backend, case, device: str, say: Callable[[str], None]) -> dict:  # noqa: ANN001
    """The mask probe of the case, said as its lines and picture; its results.json dict."""
    from harness.checks.probe import THRESHOLD_RULE, picture_text, probe

    pr = probe(backend, case, device)
    say("mask probe: " + (pr.error or f"{pr.runs} backend runs; {THRESHOLD_RULE}"))
    for line in pr.lines:
        say(f"  {line}")
    if pr.requests:
        say(picture_text(pr))
    return pr.to_dict()


def describe_backend(name: str) -> tuple[list[str], bool]:
    """`list`'s lines for one backend (its capabilities and whether it runs here), and whether its
    library is broken here."""
    from harness.backends.versions import describe, installed_version
    from harness.core.vocab import FEATURES
    from harness.run.check import availability

    b = load_backend(name)
    c = b.capabilities
    feats = [f for f in FEATURES if getattr(c, f)]
    lines = [f"{name}  ({b.library})"]
    if getattr(b, "supported", None) is not None:  # a library with a supported range: its release
        lines.append(f"  release: {describe(b.supported, installed_version(b.supported))}")
    lines.append(f"  modes: {', '.join(sorted(str(m) for m in c.modes))}")
    dims = ", ".join(map(str, sorted(c.head_dims))) if c.head_dims else "any multiple of 8"
    lines.append(
        f"  dtypes: {', '.join(sorted(c.dtypes))}; head dims: {dims}; page sizes: "
        f"{', '.join(map(str, sorted(c.page_sizes)))}; kv layouts: {', '.join(sorted(c.kv_layouts))}"
    )
    fp8 = ", ".join(sorted(c.kv_dtypes)) or "-"
    lines.append(f"  features: {', '.join(feats) or '-'}; FP8 KV caches: {fp8}")
    graph = ", ".join(sorted(str(m) for m in c.graph_modes))
    lines.append(f"  CUDA graph: {graph}" if graph else f"  CUDA graph: none: {c.graph_reason()}")
    broken = False
    for device in sorted(c.devices):
        state, why = availability(b, device)
        broken |= state == "broken"
        lines.append(f"  {device}: {state}" + (f": {why}" if why else ""))
    lines += [f"  no {feature}: {why}" for feature, why in sorted(c.why_not.items()) if feature != "graph"]
    return lines, broken
