"""The suite's pytest command line: where the suite is, and the argv, environment and directory a
pytest process that runs it starts with. `check` (harness/run/check.py) and the warm-up's recording
run (harness/run/speed/warmup/libraries.py) both start theirs from here, so they run the same suite
the same way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from harness.run.speed.settings import PROFILE_ENV

PACKAGE = Path(__file__).resolve().parents[1]  # harness/
ROOT = PACKAGE.parent  # the repository, in a checkout; site-packages, installed
PLUGIN = "harness.run.pytest_plugin"


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


@dataclass
class PytestCommand:
    """One pytest process over the suite: run `argv` in `cwd` with `env`."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path


def command(
    profile: str,
    *,
    marker: str | None = None,
    keyword: str | None = None,
    first: Sequence[str] = (),
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> PytestCommand:
    """The suite under `profile`, selected by a -m `marker` and a -k `keyword`: `first` are the
    options pytest must see before the suite's own (plugins it loads first), `options` come after;
    the environment is `env` (default: this process's) without a backend selection, with the
    profile and the suite's own variables."""
    from harness.backends import BACKENDS_ENV  # imports torch: only once a command is built

    where = suite()
    argv = [sys.executable, "-m", "pytest", str(where.path), "-q", *first, *where.options]
    if marker:
        argv += ["-m", marker]
    if keyword:
        argv += ["-k", keyword]
    argv += options
    base = {k: v for k, v in (os.environ if env is None else env).items() if k != BACKENDS_ENV}
    return PytestCommand(argv, {**base, PROFILE_ENV: profile, **where.env}, where.cwd)
