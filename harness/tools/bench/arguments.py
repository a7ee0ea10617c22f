"""The options of `python -m harness bench`: its sections, sizes and time limits."""

from __future__ import annotations

import argparse


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, e.g. 8192,32768")
    return values


def add(p: argparse.ArgumentParser, default_json: str) -> None:
    """The bench's options on `p` (the command line's `bench` parser)."""
    opt = p.add_argument
    opt("--device", choices=("cpu", "cuda"), help="default: cuda where available, else cpu")
    opt("--backend", action="append", help="only this backend (repeatable; default: every one available "
        "here)")
    opt("--section", help="comma-separated: throughput,phases,scale,detection,coldstart,gpus (default: all "
        "but coldstart and gpus)")
    opt("--cases", type=int, default=64, help="cases in the throughput mix (default 64)")
    opt("--seed", type=int, default=0, help="seed of the throughput mix (default 0)")
    opt("--repeat", type=int, default=3, help="timed throughput passes; the median is reported (default 3)")
    opt("--workers", type=int, default=1, help="throughput: also check the mix in this many processes at "
        "once, as check --jobs N runs one backend (default 1: not)")
    opt("--scale-tokens", type=_int_list, default=None, help="request lengths (default 8192,32768,131072)")
    opt("--scale-timeout", type=float, default=180.0, help="seconds per reference run in scale (default 180)")
    opt("--max-examples", type=int, default=200, help="examples per detection hunt (default 200)")
    opt("--detection-budget", type=float, help="stop starting detection hunts after this many seconds")
    opt("--coldstart-timeout", type=float, default=1800.0, help="seconds per cold-start run (default 1800)")
    opt("--gpus-timeout", type=float, default=1800.0, help="seconds per check of section gpus (default 1800)")
    opt("--json", default=default_json, help=f"default: {default_json}")
