"""The harness's own benchmark: how fast it checks, where the time goes, how far its reference
scales, and how fast the mutation catalogue is caught. `python -m harness bench`, `make bench`.

A correctness harness that is slow gets run rarely and with small shapes, and small shapes are
where window bugs hide: this measures the harness on whatever device is present and prints a table
and writes JSON (docs/bench.md documents every field). Sections:
- throughput: cases checked per second over a fixed, seeded mix of small cases, caches warm; with
  `workers` > 1 also in that many processes at once, as `check --jobs N` runs one backend;
- phases: fractions of each check's wall time spent building, planning, in the kernel, in the
  references, comparing, and (CPU) in the Hugging Face cross-check (harness/core/timing.py);
- scale: time and peak memory of the reference on one long request, in a subprocess per run;
- detection: examples and seconds until each mutant of the catalogue first fails (harness/hunts.py);
- coldstart (only when asked for: it runs the whole check twice): `check` (its warm-up beside it) in a
  fresh cache directory, then again with that cache warm (coldstart.py);
- gpus (only when asked for: it runs the whole check three or four times): `check` on one GPU, then
  on every visible GPU, the cache warm, and the speedup (gpus.py).
One module per section (cases.py makes the mix; table.py prints the report); this one runs them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from harness import hunts
from harness.backends.base import Backend
from harness.run.isolation import visible_gpus
from harness.tools.bench import cases, coldstart, detection, gpus, scale, throughput

SECTIONS = ("throughput", "phases", "scale", "detection", "coldstart", "gpus")
DEFAULT_SECTIONS = SECTIONS[:-2]  # coldstart and gpus run make check several times: only when asked for


@dataclass(kw_only=True)
class Options:
    device: str
    backends: list[Backend]
    sections: tuple[str, ...] = SECTIONS
    cases: int = 64
    seed: int = 0
    repeat: int = 3  # timed throughput passes; the median is reported
    workers: int = 1  # > 1: throughput also in this many processes at once
    scale_tokens: tuple[int, ...] = scale.SCALE_TOKENS
    scale_timeout: float = 180.0
    max_examples: int = 200
    detection_budget: float | None = None
    mutant_backends: list[str] | None = None  # detection: only these backends' mutants (None: all)
    coldstart_timeout: float = 1800.0  # seconds for one run's check, its warm-up included
    gpus_timeout: float = 1800.0  # seconds for one check of the gpus section
    gpus_results: Path | None = None  # where the gpus section keeps each check's results.json


Keep = Callable[[str, dict], None]  # a section's row, added to the document (and saved)


def _document(opts: Options) -> dict:
    """The document's head: the machine, the mix, the shapes, and an empty list per section."""
    return {
        "schema": 1,
        "meta": {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "device": opts.device,
            "device_name": torch.cuda.get_device_name() if opts.device == "cuda" else "cpu",
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "sections": list(opts.sections),
        },
        "mix": {
            "seed": opts.seed,
            "cases": opts.cases,
            "timed_passes": opts.repeat,
            "workers": opts.workers,
            "max_batch": cases.MAX_BATCH,
            "max_tokens": cases.MAX_TOKENS,
            **cases.MIX_SHAPE,
        },
        "scale_shape": {**scale.SCALE_SHAPE, "mode": "EXTEND", "window_left": scale.SCALE_WINDOW},
        "detection_profile": hunts.DEVICE_PROFILE[opts.device],
        **{section: [] for section in opts.sections},
    }


def _throughput(opts: Options, keep: Keep, say: Callable[[str], None]) -> None:
    for b in opts.backends:
        say(f"  throughput/phases: {b.name} on {opts.device} ...")
        mix = cases.mix(opts.seed, opts.cases, b.capabilities)
        measured = throughput.measure_backend(b, opts.device, mix, opts.sections, opts.repeat, opts.workers)
        row, phases = measured
        if row:
            keep("throughput", dataclasses.asdict(row))
        if phases:
            keep("phases", dataclasses.asdict(phases))


def _scale(opts: Options, keep: Keep, say: Callable[[str], None]) -> None:
    for tokens in opts.scale_tokens:
        for window in (-1, scale.SCALE_WINDOW):
            say(f"  scale: {tokens} tokens, window_left {window} ...")
            row = scale.scale_row(opts.device, tokens, window, opts.scale_timeout)
            keep("scale", dataclasses.asdict(row))


def _detection(opts: Options, keep: Keep, say: Callable[[str], None]) -> None:
    def progress(d: dict) -> None:
        say(f"  detection: {d['outcome']:8} {d['mutant']} ({d['hunt_seconds']:.1f}s)")
        keep("detection", d)

    detection.detection(opts.device, opts.mutant_backends, opts.max_examples, opts.detection_budget, progress)


def _coldstart(opts: Options, keep: Keep, say: Callable[[str], None]) -> None:
    def ran(row: coldstart.ColdStartRow) -> None:
        warm = "no warm-up" if row.warmup_seconds is None else f"warm-up {row.warmup_seconds:.0f} s of it"
        floor = row.cpu_seconds / row.cores
        cpu = f"CPU {row.cpu_seconds:.0f} s: {floor:.0f} s on {row.cores} cores if packed"
        say(f"  coldstart: {row.run}: check {row.seconds:.0f} s ({warm}); {cpu}")
        keep("coldstart", dataclasses.asdict(row))

    coldstart.coldstart(opts.device, opts.mutant_backends, opts.coldstart_timeout, ran)


def _gpus(opts: Options, keep: Keep, say: Callable[[str], None]) -> None:
    def scaled(row: gpus.GpuRow) -> None:
        if row.run == "skip":
            say(f"  gpus: skipped: {row.reason}")
        else:
            plan = f"{row.processes} processes, {row.jobs} at once"
            gain = "" if row.speedup is None else f"; speedup {row.speedup:.2f} ({row.verdict})"
            say(f"  gpus: {row.run} on GPU {','.join(row.gpus)}: check {row.seconds:.0f} s, {plan}{gain}")
        keep("gpus", dataclasses.asdict(row))

    visible = visible_gpus() if opts.device == "cuda" else []
    gpus.scaling(opts.device, visible, opts.mutant_backends, opts.gpus_timeout, scaled, opts.gpus_results)


def run(
    opts: Options, say: Callable[[str], None] = print, save: Callable[[dict], None] | None = None
) -> dict:
    """Every selected section; returns the JSON document (docs/bench.md describes it). `save` gets
    the document after every row, so a run stopped by a time limit keeps what it measured."""
    doc = _document(opts)

    def keep(section: str, row: dict) -> None:
        doc[section].append(row)
        doc["passed"] = passed(doc)
        if save:
            save(doc)

    if "throughput" in opts.sections or "phases" in opts.sections:
        _throughput(opts, keep, say)
    later = {"scale": _scale, "detection": _detection, "coldstart": _coldstart, "gpus": _gpus}
    for section, measure in later.items():
        if section in opts.sections:
            measure(opts, keep, say)
    doc["passed"] = passed(doc)
    return doc


def passed(doc: dict) -> bool:
    """False when a mix case failed, crashed or hung, a parallel measurement failed, a mutant
    survived or its hunt errored, a cold-start check did not exit 0 or could not compile a variant, or
    a check of the gpus section did not exit 0 or left no readable results."""
    bad_case = any(r["failed"] or r["crashed"] for r in doc.get("throughput", []))
    bad_workers = any(r["workers"] > 1 and r["reason"] for r in doc.get("throughput", []))
    bad_hunt = any(r["outcome"] in ("survived", "error") for r in doc.get("detection", []))
    bad_cold = any(r["exit"] != 0 or r["warmup_failed"] for r in doc.get("coldstart", []))
    bad_gpus = any(r["run"] != "skip" and (r["exit"] != 0 or r["reason"]) for r in doc.get("gpus", []))
    return not (bad_case or bad_workers or bad_hunt or bad_cold or bad_gpus)


def write_json(path: str | Path, doc: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))


class OptionError(ValueError):
    """A bench option out of range: one line."""


def options(args: argparse.Namespace, device: str) -> Options:
    """The bench's Options from `python -m harness bench`'s arguments (harness/cli.py)."""
    from harness import backends

    picked = args.section or ",".join(DEFAULT_SECTIONS)
    sections = tuple(s.strip() for s in picked.split(",") if s.strip())
    bad = [s for s in sections if s not in SECTIONS]
    if bad or not sections:
        raise OptionError(f"unknown section {bad[0] if bad else ''!r}; known: {', '.join(SECTIONS)}")
    if min(args.cases, args.max_examples, args.repeat, args.workers) < 1:
        raise OptionError("--cases, --repeat, --workers and --max-examples must be at least 1")
    if args.backend:
        chosen = [_load(n) for n in args.backend]
    else:
        chosen = [b for b in backends.all_backends() if b.available(device) is None]
    return Options(
        device=device,
        backends=chosen,
        sections=sections,
        cases=args.cases,
        seed=args.seed,
        repeat=args.repeat,
        workers=args.workers,
        scale_tokens=args.scale_tokens or scale.SCALE_TOKENS,
        scale_timeout=args.scale_timeout,
        max_examples=args.max_examples,
        detection_budget=args.detection_budget,
        mutant_backends=args.backend,
        coldstart_timeout=args.coldstart_timeout,
        gpus_timeout=args.gpus_timeout,
        gpus_results=Path(args.json).with_name(Path(args.json).stem + "-gpus"),
    )


def _load(name: str) -> Backend:
    from harness import backends

    try:
        return backends.load(name)
    except backends.BackendError as e:
        raise OptionError(str(e)) from None


def command(args: argparse.Namespace, device: str) -> int:
    """`python -m harness bench`: the sections asked for, a line as each row ends, the table, and
    the JSON document (rewritten after every row); 0 when every section passed."""
    from harness.tools.bench.table import render

    opts = options(args, device)
    print(f"attn-harness bench on {device}: {', '.join(opts.sections)}", flush=True)
    doc = run(opts, lambda line: print(line, flush=True), lambda d: write_json(args.json, d))
    print(render(doc))
    write_json(args.json, doc)
    print(f"json: {args.json}")
    return 0 if doc["passed"] else 1
