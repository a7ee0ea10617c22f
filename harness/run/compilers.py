"""Which compilers are running: whether a case that ran past its time limit was compiling, not hanging.

A JIT library's first use of a variant compiles inside the case that needs it (FlashInfer's modules:
ninja, nvcc and its cicc / ptxas steps, as the worker's children), and a cold compile of a large
module (an FA3 prefill module on sm90) can outlast the limit; so can a wait for another process's
build of the same module (FlashInfer builds each module under a file lock). Read from /proc (Linux);
elsewhere nothing is found and a timeout is worded as before.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

# Executable names of the compile steps the JIT libraries run as child processes.
COMPILERS = frozenset(
    {"ninja", "nvcc", "cicc", "ptxas", "cudafe++", "fatbinary", "nvlink", "cc1plus", "gcc", "g++", "c++"}
)
PROC = Path("/proc")


def processes(proc: Path = PROC) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, executable name) of every process readable under `proc`."""
    out = {}
    for entry in proc.glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended while listed, or is not ours to read
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ")"
        head, _, rest = stat.rpartition(")")
        fields = rest.split()
        if len(fields) >= 2:
            out[int(entry.name)] = (int(fields[1]), head.partition("(")[2])
    return out


def descendants(pid: int, table: dict[int, tuple[int, str]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def counted(names: list[str]) -> str:
    """'nvcc x1, cicc x4': each compiler's count, most first."""
    return ", ".join(f"{name} x{n}" for name, n in Counter(names).most_common())


def survey(pid: int, proc: Path = PROC) -> str:
    """A clause on the compilers running when process `pid` ran out of time: its own (it was
    compiling), else other processes' (it may have been waiting for their build); "" when none is
    running or /proc cannot be read."""
    if not proc.is_dir():
        return ""
    table = processes(proc)
    own = descendants(pid, table)
    mine = [table[p][1] for p in own if table[p][1] in COMPILERS]
    if mine:
        return f"while compiling (its worker was running {counted(mine)}: a JIT build, not a hung kernel)"
    others = [name for p, (_, name) in table.items() if name in COMPILERS and p not in own]
    if others:
        return (
            f"while other processes were compiling ({counted(others)}: the case may have been waiting for "
            "their JIT build of a module it needs)"
        )
    return ""
