"""results.json: the machine-readable record of a run. The schema is documented in docs/reports.md.

Every report page is rendered from this file alone (never from in-memory state), so
`python -m harness report results.json` reproduces the page of the run byte for byte.
JSON has no literal for NaN or infinity: non-finite numbers are written as the strings
"NaN", "Infinity" and "-Infinity" and read back as floats.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from harness.core.vocab import STATUSES
from harness.report.trend import fingerprint

FORMAT = "attn-harness-results"
VERSION = 1
RECORD_KEYS = ("status", "backend", "device", "family", "mode", "features", "reason")
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

# The JSON types of the fields the report reads (docs/reports.md), checked before it renders them:
# a record of the right shape with a wrongly typed field is one line naming it, not a traceback.
# Fields not listed are not read by the report and are not checked; a record may add fields.
_NULL = type(None)
STRING, INTEGER, NUMBER = (str, "a string"), (int, "an integer"), ((int, float), "a number")
LIST, OBJECT = (list, "a list"), (dict, "an object")
OPT_STRING, OPT_NUMBER = ((str, _NULL), "a string or null"), ((int, float, _NULL), "a number or null")
OPT_LIST, OPT_OBJECT = ((list, _NULL), "a list or null"), ((dict, _NULL), "an object or null")
RECORD_TYPES = {
    **dict.fromkeys(("backend", "device", "family", "mode"), STRING),
    "features": LIST,
    **dict.fromkeys(("reason", "test_id", "repro"), OPT_STRING),
    **dict.fromkeys(("case", "verdict", "error_map", "probe"), OPT_OBJECT),
    "seconds": OPT_NUMBER,
    "extra": OBJECT,
}
VERDICT_TYPES = {
    **dict.fromkeys(("err", "budget", "ratio", "frac_over", "nonfinite"), OPT_NUMBER),
    **dict.fromkeys(("lse_err", "lse_budget"), OPT_NUMBER),
    "worst": OPT_LIST,
}
ERROR_MAP_TYPES = {
    **dict.fromkeys(("tokens", "heads", "token_bin"), INTEGER),
    "budget": NUMBER,
    "request_starts": LIST,
    "values": LIST,
    "quantity": STRING,
}
PROBE_TYPES = {"error": OPT_STRING, "rule": STRING, "lines": LIST, "legend": OBJECT, "requests": LIST}
PROBE_REQUEST_TYPES = {
    **dict.fromkeys(("request", "queries", "keys", "row_bin", "col_bin"), INTEGER),
    "grid": LIST,
    "summary": STRING,
}
PROBE_CELLS = ".#-+?!"  # the characters of a probe picture (harness/report/pictures.py)


class ResultsError(ValueError):
    """A results file that cannot be read or does not follow the schema; one line naming why."""


def _encode(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    if isinstance(x, dict):
        return {k: _encode(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_encode(v) for v in x]
    return x


def _decode(x: Any) -> Any:
    if isinstance(x, str) and x in _NONFINITE:
        return _NONFINITE[x]
    if isinstance(x, dict):
        return {k: _decode(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_decode(v) for v in x]
    return x


def build(results: list[dict], run: dict, environment: dict[str, str]) -> dict:
    """The document: format, version, run (id, started, elapsed_s, profile, command, exit_status),
    environment (label -> version), results (one record per checked case or skipped test). The run
    gets `draws`, the fingerprint of the cases its records checked (harness/report/trend.py)."""
    run = {**run, "draws": fingerprint(results)}
    return {"format": FORMAT, "version": VERSION, "run": run, "environment": environment, "results": results}


def dumps(data: dict) -> str:
    return json.dumps(_encode(data), indent=1, allow_nan=False) + "\n"


def dump(path: str | Path, data: dict) -> None:
    Path(path).write_text(dumps(data))


def validate(data: Any) -> dict:
    """Check the parts the report relies on; raise ResultsError naming the first problem."""
    if not isinstance(data, dict):
        raise ResultsError(f"results file must hold a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise ResultsError(f"not an attn-harness results file (format={data.get('format')!r})")
    if data.get("version") != VERSION:
        raise ResultsError(
            f"results schema version {data.get('version')!r} is not supported (want {VERSION})"
        )
    for key, kind in (("run", dict), ("environment", dict), ("results", list)):
        if not isinstance(data.get(key), kind):
            raise ResultsError(
                f"results file field {key!r} must be a JSON {kind.__name__.replace('dict', 'object')}"
            )
    for i, rec in enumerate(data["results"]):
        if not isinstance(rec, dict):
            raise ResultsError(f"results[{i}] must be an object")
        missing = [k for k in RECORD_KEYS if k not in rec]
        if missing:
            raise ResultsError(f"results[{i}] lacks field(s): {', '.join(missing)}")
        if rec["status"] not in STATUSES:
            raise ResultsError(f"results[{i}].status={rec['status']!r} is not one of {', '.join(STATUSES)}")
        _check_record(f"results[{i}]", rec)
    _fields("run", data["run"], {"elapsed_s": OPT_NUMBER})
    return data


def _fields(where: str, obj: dict, types: dict, required: bool = False) -> None:
    """Each field of `obj` named in `types` has its JSON type (with `required`, is also present)."""
    for key, (kinds, words) in types.items():
        if key not in obj and required:
            raise ResultsError(f"{where} lacks field {key!r}")
        if key in obj and not isinstance(obj[key], kinds):
            raise ResultsError(f"{where}.{key}={obj[key]!r:.80} must be {words}")


def _items(where: str, values: list, kind: tuple) -> None:
    for j, x in enumerate(values):
        if not isinstance(x, kind[0]):
            raise ResultsError(f"{where}[{j}]={x!r:.80} must be {kind[1]}")


def _check_record(where: str, rec: dict) -> None:
    """The types of what the report reads from one record: its fields, verdict, error map, probe."""
    _fields(where, rec, RECORD_TYPES)
    _items(f"{where}.features", rec["features"], STRING)
    v = rec.get("verdict") or {}
    _fields(f"{where}.verdict", v, VERDICT_TYPES)
    worst = v.get("worst")
    if worst is not None and (len(worst) != 3 or not all(isinstance(x, int) for x in worst)):
        raise ResultsError(f"{where}.verdict.worst={worst!r:.80} must be [request, token, head]")
    if rec.get("error_map"):
        _check_error_map(f"{where}.error_map", rec["error_map"])
    if rec.get("probe"):
        _check_probe(f"{where}.probe", rec["probe"])


def _check_error_map(where: str, em: dict) -> None:
    _fields(where, em, ERROR_MAP_TYPES, required=True)
    if em["token_bin"] < 1 or em["heads"] < 1:
        raise ResultsError(f"{where}: token_bin={em['token_bin']} and heads={em['heads']} must be >= 1")
    _items(f"{where}.request_starts", em["request_starts"], INTEGER)
    for j, column in enumerate(em["values"]):
        if not isinstance(column, list) or len(column) != em["heads"]:
            raise ResultsError(f"{where}.values[{j}] must be a list of heads={em['heads']} values")
        _items(f"{where}.values[{j}]", column, OPT_NUMBER)


def _check_probe(where: str, pr: dict) -> None:
    _fields(where, pr, PROBE_TYPES)
    if pr.get("error"):
        return  # the report shows only the error
    _fields(where, pr, {"lines": LIST}, required=True)
    _items(f"{where}.lines", pr["lines"], STRING)
    _items(f"{where}.legend", list(pr.get("legend", {}).values()), STRING)
    for j, rp in enumerate(pr.get("requests", [])):
        at = f"{where}.requests[{j}]"
        if not isinstance(rp, dict):
            raise ResultsError(f"{at} must be an object")
        _fields(at, rp, PROBE_REQUEST_TYPES, required=True)
        _items(f"{at}.grid", rp["grid"], STRING)
        if len({len(row) for row in rp["grid"]}) > 1 or set("".join(rp["grid"])) - set(PROBE_CELLS):
            raise ResultsError(f"{at}.grid must be rows of one length, of the characters {PROBE_CELLS}")


def loads(text: str) -> dict:
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as e:  # a syntax error, a 5000-digit integer, deep nesting
        raise ResultsError(f"malformed JSON: {e}") from None
    return validate(_decode(raw))


def load(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ResultsError(f"no such results file: {path}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ResultsError(f"not UTF-8 text: {e}") from None
    except OSError as e:
        raise ResultsError(f"cannot read it: {e.strerror}") from None
    return loads(text)
