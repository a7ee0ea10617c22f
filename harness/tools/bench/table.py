"""The bench's printed report: one aligned table per section that ran, from the JSON document."""

from __future__ import annotations

from harness.tools.bench.detection import DETECTION_TARGET_S
from harness.tools.bench.gpus import SPEEDUP_TARGET, host_load
from harness.tools.bench.phases import PHASES
from harness.tools.bench.scale import GIB


def _grid(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in [header, *rows]
    ]
    return [lines[0], "-" * len(lines[0]), *lines[1:]]


def _mib(n: int | None) -> str:
    return "-" if n is None else (f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.0f} MiB")


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _throughput_cells(r: dict, parallel: bool) -> tuple[str, ...]:
    """A throughput row's cells; `-` for what was not measured (the parallel rate when it failed)."""
    if not r["pass_seconds"]:  # unavailable here
        return (r["backend"], *["-"] * (9 if parallel else 8))
    rate = r["parallel_cases_per_s"]
    procs = (f"{rate:.1f}" if rate else "-",) if parallel else ()
    counts = (r["checked"], r["passed"], r["failed"], r["crashed"], r["skipped"])
    return (
        r["backend"],
        f"{r['cases_per_s']:.1f}",
        *procs,
        *map(str, counts),
        _s(r["seconds"]),
        _s(r["warm_seconds"]),
    )


def _throughput(doc: dict) -> list[str]:
    """The throughput table, then each backend's reason and failures."""
    m, meta = doc["mix"], doc["meta"]
    mix_words = (
        f"seed {m['seed']}, {m['cases']} cases, batch <= {m['max_batch']}, "
        f"<= {m['max_tokens']} tokens/request, {m['num_q_heads']} q / {m['num_kv_heads']} kv heads "
        f"x {m['head_dim']}, {m['dtype']}, page {m['page_size']}"
    )
    dev = f"{meta['device']} ({meta['device_name']}, {meta['threads']} threads)"
    out = [f"throughput on {dev}; mix: {mix_words}"]
    workers = m["workers"]
    procs = (f"{workers} procs/s",) if workers > 1 else ()
    head = (
        "backend",
        "cases/s",
        *procs,
        "checked",
        "pass",
        "fail",
        "crash",
        "skip",
        "seconds",
        "warm-up s",
    )
    out += _grid(head, [_throughput_cells(r, workers > 1) for r in doc["throughput"]])
    for r in doc["throughput"]:
        if r["reason"]:
            what = "not measured" if not r["pass_seconds"] else "parallel measurement failed"
            out.append(f"  {r['backend']}: {what}: {r['reason']}")
        for f in r["failures"]:
            out.append(f"  {r['backend']} {f['status'].upper()}: {f['reason']}\n    {f['repro']}")
    out.append("")
    return out


def _phases(doc: dict) -> list[str]:
    """The phases table: each phase's fraction of the checks' wall time."""
    out = ["phases: fractions of each check's wall time (crossref: the CPU-only HF cross-check)"]
    head = ("backend", "ms/case", *PHASES, "other", "overhead")
    rows = [
        (
            r["backend"],
            f"{r['ms_per_case']:.1f}",
            *(f"{r['fractions'][p]:.3f}" for p in (*PHASES, "other")),
            f"{r['overhead']:.3f}",
        )
        for r in doc["phases"]
    ]
    out += _grid(head, rows)
    out.append("  overhead = 1 - kernel - reference; target on the H100: under 0.5")
    out.append("")
    out.append("ops/syncs per case: aten operations / host reads of tensor values, by phase")
    head = ("backend", *PHASES, "other", "total")
    names = (*PHASES, "other")
    counted = [r for r in doc["phases"] if not r.get("not_counted")]
    cells = [
        (
            r["backend"],
            *(f"{r['ops_per_case'][p]:.0f}/{r['syncs_per_case'][p]:.1f}" for p in names),
            f"{sum(r['ops_per_case'].values()):.0f}/{sum(r['syncs_per_case'].values()):.1f}",
        )
        for r in counted
    ]
    out += _grid(head, cells)
    out += [f"  {r['backend']}: not counted: {r['not_counted']}" for r in doc["phases"] if r not in counted]
    if doc["meta"]["device"] == "cpu":
        out.append("  on the CPU every read counts, host-side data included: an upper bound of a GPU's syncs")
    out.append("")
    return out


def _scale(doc: dict) -> list[str]:
    """The scale table: the reference's seconds and peak memory per request length."""
    out: list[str] = []
    s = doc["scale_shape"]
    out.append(
        f"scale: reference (exact, then native) on one {s['mode']} request, no prefix, "
        f"{s['num_q_heads']} q / {s['num_kv_heads']} kv heads x {s['head_dim']}, {s['dtype']}; "
        "each run in its own process"
    )
    head = (
        "tokens",
        "window",
        "exact s",
        "exact peak",
        "native s",
        "native peak",
        "check s",
        "target",
        "verdict",
    )
    rows = [
        (
            str(r["tokens"]),
            "none" if r["window_left"] < 0 else str(r["window_left"]),
            _s(r["exact_seconds"]),
            _mib(r["exact_peak_bytes"]),
            _s(r["native_seconds"]),
            _mib(r["native_peak_bytes"]),
            _s(r["check_seconds"]) if r["status"] == "ok" else r["reason"],
            r["target"] or "-",
            r["verdict"] or "-",
        )
        for r in doc["scale"]
    ]
    out += _grid(head, rows)
    out.append("")
    return out


def _detection(doc: dict) -> list[str]:
    """The detection table, the outcome counts and the seed-class target."""
    out: list[str] = []
    out.append(
        f"detection: profile {doc['detection_profile']}, first family of each mutant, "
        "seconds to the first failure"
    )
    head = ("mutant", "family", "seed class", "result", "examples", "seconds")
    rows = [
        (
            d["mutant"],
            d["family"],
            "yes" if d["seed_class"] else "",
            d["outcome"].upper() if d["outcome"] != "caught" else f"caught ({d['status']})",
            str(d["examples"]) if d["outcome"] == "caught" else "-",
            _s(d["seconds"]) if d["outcome"] == "caught" else "-",
        )
        for d in doc["detection"]
    ]
    out += _grid(head, rows)
    counts = {
        o: sum(d["outcome"] == o for d in doc["detection"]) for o in ("caught", "survived", "skip", "error")
    }
    seeds = [d for d in doc["detection"] if d["seed_class"] and d["outcome"] != "skip"]
    fast = sum(d["within_target"] for d in seeds)
    out.append(", ".join(f"{n} {o}" for o, n in counts.items()))
    scope = "" if doc["meta"]["device"] == "cuda" else " (the target is for warm GPU time)"
    out.append(f"seed-class mutants caught within {DETECTION_TARGET_S:g} s: {fast} of {len(seeds)}{scope}")
    for d in doc["detection"]:
        if d["outcome"] != "caught":
            out.append(f"  {d['mutant']}: {(d['reason'].splitlines() or [''])[0]}")
    return out


def _check_heading(section: str, r0: dict, what: str) -> str:
    """The first line of a section that runs `check`: its profile, its backends, what it compares."""
    which = ", ".join(r0["backends"]) or "every backend"
    return f"{section}: check --profile {r0['profile']} ({which}); {what}"


def _coldstart(doc: dict) -> list[str]:
    """The cold-start table: the check's wall time (its warm-up beside it) in an empty cache directory,
    then warm; its CPU time, and that over the cores: the wall time it cannot beat here, packed
    perfectly."""
    rows = doc["coldstart"]
    if not rows:
        return []
    r0 = rows[0]
    out = [_check_heading("coldstart", r0, "cold: an empty cache directory")]
    head = ("run", "check s", "warm-up s", "CPU s", f"floor s ({r0['cores']} cores)", "compiled", "failed")
    head += ("cache", "exit")
    cells = [
        (
            r["run"],
            _s(r["seconds"]),
            "-" if r["warmup_seconds"] is None else _s(r["warmup_seconds"]),
            _s(r["cpu_seconds"]),
            _s(r["cpu_seconds"] / r["cores"]),
            str(r["compiled"]),
            str(r["warmup_failed"]),
            _mib(sum(r["cache_bytes"].values())),
            str(r["exit"]),
        )
        for r in rows
    ]
    out += _grid(head, cells)
    last = rows[-1]["cache_bytes"]
    out.append("  cache by library: " + (", ".join(f"{k} {_mib(v)}" for k, v in last.items()) or "empty"))
    out += [f"  {r['run']}: {r['reason'].splitlines()[0]}" for r in rows if r["reason"]]
    out.append("")
    return out


def _gpus(doc: dict) -> list[str]:
    """The gpus table: the check with its cache warm on the first GPU, then on every visible one; the
    speedup against its target and what bounds it."""
    rows = doc["gpus"]
    if not rows:
        return []
    r0 = rows[0]
    out = [_check_heading("gpus", r0, "cache warm: one GPU, then every visible GPU")]
    if r0["run"] == "skip":
        return [*out, f"  skipped: {r0['reason']}", ""]
    head = ("run", "GPUs", "check s", "planned s", "host CPU", "processes", "at once", "busy s per GPU")
    head += ("longest part", "compiled", "exit")
    cells = [
        (
            r["run"],
            ",".join(r["gpus"]),
            _s(r["seconds"]),
            _s(r["expected"]) if r["expected"] else "-",
            f"{host_load(r['cpu_seconds'], r['seconds'], r['cores']):.0%}" if r["seconds"] > 0 else "-",
            str(r["processes"]),
            str(r["jobs"]),
            " ".join(f"{g}:{s:.0f}" for g, s in r["busy"].items()) or "-",
            f"{r['longest']} {r['longest_seconds']:.0f} s" if r["longest"] else "-",
            str(r["compiled"]),
            str(r["exit"]),
        )
        for r in rows
    ]
    out += _grid(head, cells)
    out += [
        f"  speedup {r['speedup']:.2f} on {len(r['gpus'])} GPUs (target {SPEEDUP_TARGET}: {r['verdict']}); "
        f"bound by {r['bound']}{_cases_growth(r)}{_outside_cases(r, rows)}{_ceilings(r)}"
        for r in rows
        if r["speedup"] is not None
    ]
    out += [_longest_parts(r) for r in rows if r["run"] != "prime" and r["parts"]]
    out += [line for r in rows if r["run"] != "prime" and (line := _fixed_seconds(r))]
    out += [f"  {r['run']}: mis-planned: {r['misplanned']}" for r in rows if r.get("misplanned")]
    out += [f"  {r['run']}: {r['reason'].splitlines()[0]}" for r in rows if r["reason"]]
    out.append("")
    return out


def _cases_growth(row: dict) -> str:
    """How much longer the same cases took, in their own seconds, on every GPU than on one."""
    growth = row.get("cases_growth")
    if growth is None:
        return ""
    return f"; cases' own seconds {growth:+.0%} against one GPU ({row['cases_s']:.0f} s)"


def _ceilings(row: dict) -> str:
    """The speedup with the parts packed perfectly, and with no time outside their cases besides."""
    packed, cases = row.get("speedup_packed"), row.get("speedup_cases")
    if packed is None or cases is None:
        return ""
    return f"; at most {packed:.2f} packed perfectly, {cases:.2f} with no part's time outside its cases"


def _outside_cases(row: dict, rows: list[dict]) -> str:
    """The parts' seconds outside their cases on every GPU, and on one: more parts pay more of it."""
    one = next((r for r in rows if r["run"] == "one"), None)
    if row.get("outside_s") is None or one is None or one.get("outside_s") is None:
        return ""
    return (
        f"; parts' seconds outside their cases {row['outside_s']:.0f} of {sum(row['busy'].values()):.0f} "
        f"({row['processes']} parts), against {one['outside_s']:.0f} of {sum(one['busy'].values()):.0f} "
        f"({one['processes']}) on one GPU"
    )


def _fixed_seconds(row: dict) -> str:
    """What a run's parts spent around their pytest sessions: before pytest configured (the
    interpreter, imports) and after (results, exit); empty for a check that did not keep it."""
    parts = [p for p in row["parts"] if p.get("launch_s") is not None and p.get("startup_s") is not None]
    if not parts:
        return ""
    launch = sum(p["launch_s"] for p in parts)
    after = sum(p["startup_s"] - p["launch_s"] for p in parts)
    return (
        f"  {row['run']}: outside pytest: {launch:.0f} s before it configured ({launch / len(parts):.1f} s "
        f"a part, {len(parts)} parts), {after:.0f} s after its session"
    )


def _longest_parts(row: dict, count: int = 5) -> str:
    """A run's longest parts, each with its GPU, when it started, the seconds the plan expected of it
    and, where its results said, how many of its seconds were its cases' own (a check before these
    were kept has neither)."""
    parts = sorted(row["parts"], key=lambda p: -p["seconds"])[:count]
    shown = []
    for p in parts:
        start = "" if p.get("start_s") is None else f", from {p['start_s']:.0f} s"
        cases = "" if p.get("cases_s") is None else f", cases {p['cases_s']:.0f}"
        where = f"GPU {p['gpu']}{start}, planned {p['expected_s']:.0f}{cases}"
        shown.append(f"{p['part']} {p['seconds']:.0f} s ({where})")
    return f"  {row['run']}: longest parts: " + ", ".join(shown)


BLOCKS = {
    "throughput": _throughput,
    "phases": _phases,
    "scale": _scale,
    "detection": _detection,
    "coldstart": _coldstart,
    "gpus": _gpus,
}


def render(doc: dict) -> str:
    """The printed report: one block per section that ran, in the bench's order."""
    return "\n".join(line for name, block in BLOCKS.items() if name in doc for line in block(doc)).rstrip()
