"""One cache directory for everything the harness compiles, so a CI job saves and restores one folder.

Each library's cache (LIBRARIES) is a subdirectory of the root: `--cache-dir`, else
$ATTN_HARNESS_CACHE, else $XDG_CACHE_HOME/attn-harness, else ~/.cache/attn-harness. `apply` sets
the libraries' own variables before any of them is imported (each reads its variable at import);
every worker and pytest process inherits them. A library variable the user set wins;
ATTN_HARNESS_CACHE_VARS lists the ones the harness set, so a child given another root (the bench's
cold start) re-derives them.

Python's own bytecode joins them where nothing else keeps it: when torch's sources have no .pyc
beside them and none will be written there ($PYTHONDONTWRITEBYTECODE, as container images often set,
or a read-only install), every process the harness starts compiles torch's and transformers' sources
anew, nearly doubling the time every process spends importing them. There the processes share
`pycache/` under the root ($PYTHONPYCACHEPREFIX); a restored cache brings it back.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

ENV = "ATTN_HARNESS_CACHE"
OWNED_ENV = "ATTN_HARNESS_CACHE_VARS"  # comma-separated: the library variables the harness set
FA4_SWITCH = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"  # FA4's disk cache is off unless this is 1
# (what is cached, the library's variable, its subdirectory of the root)
LIBRARIES = (
    ("FlashInfer JIT modules", "FLASHINFER_WORKSPACE_BASE", "flashinfer"),
    ("FA4 CuTe DSL kernels", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "fa4"),
    ("inductor (flex_compiled)", "TORCHINDUCTOR_CACHE_DIR", "inductor"),
    ("Triton kernels", "TRITON_CACHE_DIR", "triton"),
)
BYTECODE_VAR = "PYTHONPYCACHEPREFIX"
BYTECODE = ("Python bytecode", BYTECODE_VAR, "pycache")  # only where `bytecode_missing`
NO_BYTECODE = "PYTHONDONTWRITEBYTECODE"


@dataclass(frozen=True)
class Entry:
    """One library's cache: where it is and who chose it (`user`: the variable was set outside)."""

    what: str
    var: str
    path: str
    user: bool


def root(environ: MutableMapping[str, str] | None = None) -> Path:
    """The cache root (module doc), `--cache-dir` aside."""
    env = os.environ if environ is None else environ
    if env.get(ENV):
        return Path(env[ENV]).expanduser().resolve()
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base).expanduser().resolve() / "attn-harness"


def _owned(env: MutableMapping[str, str]) -> set[str]:
    return {v for v in env.get(OWNED_ENV, "").split(",") if v}


def apply(flag: str | None = None, environ: MutableMapping[str, str] | None = None) -> list[Entry]:
    """Point every library's cache under the root (`flag` first: it sets $ATTN_HARNESS_CACHE for the
    children too), except where the user set the library's own variable."""
    env = os.environ if environ is None else environ
    if flag:
        env[ENV] = str(Path(flag).expanduser().resolve())
    top, owned = root(env), _owned(env)
    if env.get(ENV):
        env[ENV] = str(top)  # absolute: a child in another working directory finds the same root
    for _, var, sub in LIBRARIES:
        if var not in env or var in owned:
            env[var] = str(top / sub)
            owned.add(var)
    if FA4_SWITCH not in env or FA4_SWITCH in owned:
        env[FA4_SWITCH] = "1"
        owned.add(FA4_SWITCH)
    if BYTECODE_VAR in owned or (BYTECODE_VAR not in env and bytecode_missing(env)):
        env[BYTECODE_VAR] = str(top / BYTECODE[2])
        env.pop(NO_BYTECODE, None)  # written under the root, never beside anyone's sources
        owned.add(BYTECODE_VAR)
    env[OWNED_ENV] = ",".join(sorted(owned))
    return entries(env)


def problem(flag: str | None = None, environ: MutableMapping[str, str] | None = None) -> str | None:
    """Why the cache root cannot hold the caches, in one line naming it, or None. A missing root is
    created when its parent exists (the first run, an empty CI cache); the default's parents are
    created too. Writability is tried by writing a file: permission bits say nothing to root or on a
    read-only mount."""
    env = os.environ if environ is None else environ
    given = flag or env.get(ENV)
    name = "--cache-dir" if flag else f"${ENV}" if given else "the cache directory"
    top = Path(given).expanduser().resolve() if given else root(env)
    if top.exists() and not top.is_dir():
        return f"{name} {top}: not a directory"
    if given and not top.exists() and not top.parent.is_dir():
        return f"{name} {top}: no such directory, nor its parent {top.parent}"
    try:
        top.mkdir(parents=True, exist_ok=True)
        probe = top / f".write-test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        return f"{name} {top}: not writable ({e.strerror or e})"
    return None


def write_json(where: Path, doc: dict) -> None:
    """`doc` as `where` (a file in the cache directory), written whole, then renamed: runs sharing the
    directory never read half a file."""
    tmp = where.with_name(f".{where.name}.{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    tmp.replace(where)


def bytecode_missing(environ: MutableMapping[str, str], package: str = "torch") -> bool:
    """Whether `package` has no bytecode beside its sources and none will be written there, so each
    new process would compile it again."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    source = Path(spec.origin)
    beside = source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"
    if beside.exists():
        return False
    return bool(environ.get(NO_BYTECODE)) or not os.access(source.parent, os.W_OK)


def use_bytecode_cache() -> None:
    """This process too: its later imports read and write the bytecode where `apply` put its
    children's."""
    if BYTECODE_VAR in _owned(os.environ):
        sys.pycache_prefix = os.environ[BYTECODE_VAR]
        sys.dont_write_bytecode = False


def entries(environ: MutableMapping[str, str] | None = None) -> list[Entry]:
    """Each library's cache as the environment has it now (after `apply`)."""
    env = os.environ if environ is None else environ
    owned, top = _owned(env), root(env)
    out = []
    for what, var, sub in LIBRARIES + ((BYTECODE,) if BYTECODE_VAR in env else ()):
        out.append(Entry(what, var, env.get(var, str(top / sub)), var in env and var not in owned))
    return out


def fa4_enabled(environ: MutableMapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(FA4_SWITCH, "0") == "1"


def describe(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Lines for `list`: the root, then each library's directory and who set it."""
    env = os.environ if environ is None else environ
    lines = [f"cache directory: {root(env)}  (--cache-dir, ${ENV}; a library's own variable wins)"]
    for e in entries(env):
        who = f"set by the user (${e.var}), not under the cache directory" if e.user else f"${e.var}"
        if e.var == BYTECODE_VAR and not e.user:
            who += ": torch has no bytecode beside its sources and none would be written there"
        lines.append(f"  {e.what}: {e.path}  ({who})")
    if not fa4_enabled(env):
        lines.append(f"  FA4's disk cache is off: ${FA4_SWITCH} is {env.get(FA4_SWITCH)!r}, not 1")
    return lines


def summary(environ: MutableMapping[str, str] | None = None) -> str:
    """One line for the report's environment: the root, and any library cache the user moved."""
    env = os.environ if environ is None else environ
    moved = [f"{e.var}={e.path}" for e in entries(env) if e.user]
    off = [] if fa4_enabled(env) else [f"{FA4_SWITCH}={env.get(FA4_SWITCH)}"]
    return " ".join([str(root(env)), *(f"({x})" for x in moved + off)])
