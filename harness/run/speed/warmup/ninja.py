"""One ninja run over every module's build file, and the dependency logs that let each module's own
ninja find it up to date afterwards.

A library that builds each module with its own ninja (FlashInfer's `JitSpecNvcc.build`: `ninja -C
<module dir> -f <module dir>/build.ninja`) keeps the cores busy only as far as its modules overlap;
one ninja over every module's translation units keeps them busy until the last one (several times
faster than a pool of per-module ninjas). The build files name their outputs
by absolute path, so a top-level file of `subninja` lines builds them all from one directory. ninja
keeps what it built in that directory's `.ninja_log` (output -> command hash, mtime) and
`.ninja_deps` (output -> headers), keyed by those absolute paths; the module's own ninja, run later
in the module's directory, finds neither there and rebuilds everything. So after the build both
logs are copied into every module's directory: the entries it needs are there, under the same
paths and the same command hashes, and it has nothing to do (tests/test_warmup.py proves it with
the real ninja).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TOP_FILE = "attn_harness_warmup.ninja"  # written in the plan's root, ninja's -C directory
LOGS = (".ninja_log", ".ninja_deps")
STATUS = "ninja-step %f/%t: "  # NINJA_STATUS: a line per finished step, parsed for progress
_STEP = re.compile(r"^ninja-step (\d+)/(\d+): ")
_FAILED = re.compile(r"^FAILED: (?:\[code=\d+\] )?(.*)$")
PROGRESS_EVERY = 15.0  # seconds: a progress line at least this often while steps finish, else per 10%


@dataclass(frozen=True)
class Module:
    """One module's build file (outputs by absolute path), the directory its own ninja later runs in,
    and the library file whose change means it was compiled."""

    name: str
    ninja_file: str
    build_dir: str
    library: str


@dataclass(frozen=True)
class Plan:
    """What one ninja run builds: `root` (ninja's -C directory, where the top-level file and its logs
    go), the modules, and the names of modules a prebuilt copy serves (nothing to build)."""

    root: str
    modules: tuple[Module, ...]
    prebuilt: tuple[str, ...] = ()


@dataclass
class Result:
    """Module names by outcome; `failed`: one line per failed module (or for the ninja run)."""

    compiled: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def binary() -> str:
    """The ninja executable: on PATH, else next to this Python (a venv's bin, not activated)."""
    found = shutil.which("ninja") or shutil.which("ninja", path=str(Path(sys.executable).parent))
    if not found:
        raise FileNotFoundError("ninja is not on PATH (pip install ninja)")
    return found


def write_top(plan: Plan) -> Path:
    """The top-level build file: one `subninja` line per module (as flashinfer.jit.build_jit_specs)."""
    path = Path(plan.root) / TOP_FILE
    lines = ["ninja_required_version = 1.3", *(f"subninja {m.ninja_file}" for m in plan.modules), ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


def share_logs(plan: Plan) -> list[str]:
    """Copy the top-level .ninja_log and .ninja_deps into every module's directory (see the module
    docstring); returns a line per copy that failed."""
    problems = []
    for log in LOGS:
        source = Path(plan.root) / log
        if not source.is_file():
            continue
        for m in plan.modules:
            try:
                shutil.copyfile(source, Path(m.build_dir) / log)
            except OSError as e:
                problems.append(f"{m.name}: cannot copy {log}: {e}")
    return problems


def _mtime(path: str) -> int | None:
    return os.stat(path).st_mtime_ns if os.path.exists(path) else None


def _owner(plan: Plan, output: str) -> str | None:
    """The module whose directory holds `output` (deepest match)."""
    dirs = sorted(plan.modules, key=lambda m: len(m.build_dir), reverse=True)
    return next((m.name for m in dirs if output.startswith(m.build_dir.rstrip("/") + "/")), None)


def _reason(block: list[str]) -> str:
    """One line for a failed step from what followed its FAILED line (the command, then its output):
    the output's first line that says error, else its last line."""
    said = [line.strip() for line in block[2:] if line.strip()]
    errors = [line for line in said if "error" in line.lower()]
    return (errors or said or ["failed"])[0 if errors else -1][:300]


class Progress:
    """Prints `[k/N] build steps` at each further tenth of N, or when PROGRESS_EVERY seconds have
    passed since the last line, and at N/N; not a line per step."""

    def __init__(self, say: Callable[[str], None], start: float) -> None:
        self.say, self.start = say, start
        self.tenth, self.last = -1, time.monotonic()

    def step(self, k: int, n: int) -> None:
        now, tenth = time.monotonic(), k * 10 // max(n, 1)
        if tenth > self.tenth or k == n or now - self.last >= PROGRESS_EVERY:
            self.say(f"[{k}/{n}] build steps (compiles and links)  ({now - self.start:.0f} s)")
            self.tenth, self.last = tenth, now


def build(plan: Plan, jobs: int, say: Callable[[str], None], start: float | None = None) -> Result:
    """`ninja -k 0 -j jobs` over every module of `plan` (each failure named by module; the other
    modules still build), progress through `say`, then the logs shared into each module's
    directory. A module is compiled when its library file changed, cached when not."""
    start = time.monotonic() if start is None else start
    result = Result(cached=list(plan.prebuilt))
    if not plan.modules:
        return result
    before = {m.name: _mtime(m.library) for m in plan.modules}
    top = write_top(plan)
    cmd = [binary(), "-k", "0", "-C", plan.root, "-f", str(top), "-j", str(jobs)]
    progress, failures, block, tail = Progress(say, start), {}, None, []
    env = {**os.environ, "NINJA_STATUS": STATUS}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail = (tail + [line])[-20:]
            step, failed = _STEP.match(line), _FAILED.match(line)
            if step or failed or line.startswith("ninja: "):
                block = None
            if step:
                progress.step(int(step.group(1)), int(step.group(2)))
            elif failed:
                outputs = failed.group(1).split()
                block = [line]
                for out in outputs:
                    failures.setdefault(_owner(plan, out) or out, (Path(out).name, block))
            elif block is not None:
                block.append(line)
    code = proc.returncode
    for m in plan.modules:
        if m.name in failures:
            output, lines = failures.pop(m.name)
            result.failed.append(f"{m.name}: {output}: {_reason(lines)}")
        elif _mtime(m.library) is None:
            last = next((x for x in reversed(tail) if x.startswith("ninja: ")), f"exit status {code}")
            result.failed.append(f"{m.name}: not built ({last})")
        elif _mtime(m.library) != before[m.name]:
            result.compiled.append(m.name)
        else:
            result.cached.append(m.name)
    result.failed += [f"{out}: {_reason(lines)}" for out, (_, lines) in failures.items()]
    if code and not result.failed:
        result.failed.append(f"ninja: exit status {code}: {' / '.join(tail[-3:])}")
    result.failed += share_logs(plan)
    return result
