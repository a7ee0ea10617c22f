"""Reviewer-facing reports of a run: results.json (the record), index.html and junit.xml (views).

A run directory is `reports/<run-id>/`; `reports/latest` is a symlink to the newest one. The views
are always rendered from results.json as read back from disk, so re-rendering a results file
(`python -m harness report`) gives the same bytes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from harness.report import html, junit, results_json

RESULTS = "results.json"
INDEX = "index.html"
JUNIT = "junit.xml"
LATEST = "latest"


def render_views(data: dict, directory: str | Path) -> Path:
    """Write index.html and junit.xml for a loaded results document; returns the page's path. Both
    are rendered before either is written, so a document that cannot be rendered replaces neither."""
    page, xml = html.render(data), junit.render(data)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / INDEX).write_text(page, encoding="utf-8")
    (d / JUNIT).write_text(xml, encoding="utf-8")
    return d / INDEX


def write_run(directory: str | Path, data: dict) -> Path:
    """results.json, then the views rendered from it as read back; returns index.html's path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    results_json.dump(d / RESULTS, data)
    return render_views(results_json.load(d / RESULTS), d)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def new_run_dir(root: str | Path, run_id: str) -> Path:
    """Create root/<run_id> (suffixed if it exists already)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path, n = root / run_id, 1
    while path.exists():
        n += 1
        path = root / f"{run_id}.{n}"
    path.mkdir()
    return path


def point_latest(root: str | Path, run_dir: str | Path) -> Path:
    """Atomically make root/latest a relative symlink to run_dir."""
    root = Path(root)
    link, tmp = root / LATEST, root / f".{LATEST}.{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(os.path.relpath(run_dir, root))
    os.replace(tmp, link)
    return link
