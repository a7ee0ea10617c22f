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

FORMAT = "attn-harness-results"
VERSION = 1
RECORD_KEYS = ("status", "backend", "device", "family", "mode", "features", "reason")
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


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
    environment (label -> version), results (one record per checked case or skipped test)."""
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
    return data


def loads(text: str) -> dict:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultsError(f"malformed JSON: {e}") from None
    return validate(_decode(raw))


def load(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ResultsError(f"no such results file: {path}")
    return loads(p.read_text())
