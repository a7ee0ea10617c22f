"""python -m harness {list, check, repro}: the command line.

Bad input (unknown backend, malformed JSON, an invalid Case) exits 2 with one line naming the
problem; a failing check exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def read_case(text: str):  # noqa: ANN201 - returns a Case
    """A Case from a path to a JSON file or from a JSON literal."""
    from harness.case import Case, CaseError

    src = text
    if not text.lstrip().startswith("{"):
        path = Path(text)
        if not path.is_file():
            raise UsageError(f"no such case file: {text}")
        src = path.read_text()
    try:
        return Case.from_json(src)
    except CaseError as e:
        raise UsageError(f"invalid case: {e}") from None
    except TypeError as e:
        raise UsageError(f"invalid case: {e}") from None


def load_backend(name: str):  # noqa: ANN201 - returns a Backend
    from harness import backends

    try:
        return backends.load(name)
    except backends.BackendError as e:
        raise UsageError(str(e)) from None


def cmd_list(args: argparse.Namespace) -> int:
    from harness import backends

    names = backends.names()
    for name in names:
        b = load_backend(name)
        c = b.capabilities
        feats = [
            f
            for f in ("window", "soft_cap", "sinks", "hybrid_pool", "deterministic", "returns_lse", "tree")
            if getattr(c, f)
        ]
        print(f"{name}  ({b.library})")
        print(f"  modes: {', '.join(sorted(str(m) for m in c.modes))}")
        print(
            f"  dtypes: {', '.join(sorted(c.dtypes))}; page sizes: "
            f"{', '.join(map(str, sorted(c.page_sizes)))}; kv layouts: {', '.join(sorted(c.kv_layouts))}"
        )
        print(f"  features: {', '.join(feats) or '-'}")
        for device in sorted(c.devices):
            why = b.available(device)
            print(f"  {device}: {'available' if why is None else 'unavailable: ' + why}")
        for feature, why in sorted(c.why_not.items()):
            print(f"  no {feature}: {why}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    import pytest

    from harness import profiles
    from harness.modes import FAMILIES

    profile = args.profile or ("gpu" if _default_device() == "cuda" else "ci")
    if profile not in profiles.SIZES:
        raise UsageError(f"unknown profile {profile!r}; known: {', '.join(profiles.SIZES)}")
    for name in args.backend or []:
        load_backend(name)
    os.environ["ATTN_HARNESS_PROFILE"] = profile
    marks = []  # markers are exact names ("-k extend" would also match draft_extend_v2)
    if args.backend:
        marks.append("(" + " or ".join(args.backend) + ")")
    if args.family:
        bad = [f for f in args.family if f not in FAMILIES]
        if bad:
            raise UsageError(f"unknown family {bad[0]!r}; known: {', '.join(FAMILIES)}")
        marks.append("(" + " or ".join(args.family) + ")")
    if args.device:
        marks.append("gpu" if args.device == "cuda" else "not gpu")
    cmd = [str(ROOT / "cases"), "-q", "-p", "no:cacheprovider", f"--rootdir={ROOT}"]
    if marks:
        cmd += ["-m", " and ".join(marks)]
    if args.k:
        cmd += ["-k", args.k]
    if args.results:
        cmd += ["--harness-results", args.results]
    print(f"attn-harness check: profile {profile}; pytest {' '.join(cmd[1:])}", flush=True)
    code = pytest.main(cmd)
    if code == 5:
        print("no tests matched the filters", file=sys.stderr)
        return 2
    return int(code)


def cmd_repro(args: argparse.Namespace) -> int:
    from harness.checks.numeric import check_case

    case = read_case(args.case)
    backend = load_backend(args.backend)
    device = args.device or _default_device()
    res = check_case(backend, case, device)
    print(f"{backend.name} on {device}: {res.status.upper()}: {res.reason}")
    if args.json:
        print(json.dumps(res.to_dict(), indent=1))
    return 0 if res.status in ("pass", "skip") else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="backends, their capabilities, and availability here")
    c = sub.add_parser("check", help="run the suite (cases/) and print the summary")
    c.add_argument("--backend", action="append", help="only this backend (repeatable)")
    c.add_argument(
        "--family",
        action="append",
        help="only this family: decode, prefill, prefix, draft_extend_v2, verify, cross",
    )
    c.add_argument("-k", help="a pytest -k expression, e.g. swa")
    c.add_argument("--device", choices=("cpu", "cuda"), help="only backends on this device")
    c.add_argument("--profile", help="hypothesis profile: ci, dev, gpu, thorough")
    c.add_argument("--results", help="write results.json here")
    r = sub.add_parser("repro", help="replay one case (a JSON file or a JSON literal)")
    r.add_argument("case")
    r.add_argument("--backend", default="torch_native")
    r.add_argument("--device", choices=("cpu", "cuda"))
    r.add_argument("--json", action="store_true", help="also print the full result as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return {"list": cmd_list, "check": cmd_check, "repro": cmd_repro}[args.command](args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
