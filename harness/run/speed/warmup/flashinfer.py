"""Build every FlashInfer JIT module the `gpu` profile touches, all at once, before the suite runs.

    python -m harness.run.speed.warmup.flashinfer [--jobs N]

A diagnostic beside `python -m harness warmup`, in two phases (build, check_coverage); docs/flashinfer.md,
"JIT variants".
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.core.case import Case, Request
from harness.run.speed.warmup import ninja

GPU_SHAPE = dict(num_q_heads=8, num_kv_heads=2, page_size=16)
GPU_VARIANT = ("bfloat16", 128)  # the gpu profile's only dtype and head_dim
# The gpu profile's KV caches: the model's dtype and each FP8 dtype (with JIT modules of its own).
KV_CACHES = (None, "float8_e4m3fn", "float8_e5m2")
FP8_SCALES = dict(k_scale=0.5, v_scale=2.0)  # any: run-time arguments, not module variants
SLOW_LOAD_S = 15.0  # a phase-2 probe slower than this compiled a module


@dataclass(frozen=True)
class Probe:
    """A small run that needs exactly one module: through an adapter, or a direct library call."""

    label: str
    backend: str | None = None
    case: Case | None = None
    call: str | None = None  # "merge_state" or "segment_packbits"

    @property
    def users(self) -> tuple[str, ...]:
        """The backends that load this probe's module (its kind: the label's head)."""
        return MODULE_USERS[self.label.split("[")[0]]


# The backends of each kind of module: the fa2 prefill module also runs tensor-core decode and
# cross-attention; merge_state is ragged's cascade; plan() packs a custom (tree) mask with packbits.
MODULE_USERS = {
    "prefill": ("flashinfer_paged", "flashinfer_ragged", "flashinfer_dec_tc", "flashinfer_enc"),
    "decode_cc": ("flashinfer_dec_cc",),
    "sink": ("flashinfer_paged",),
    "cascade": ("flashinfer_ragged",),
    "packbits": ("flashinfer_paged", "flashinfer_enc"),
}


def _case(
    mode: str,
    req: Request,
    dtype: str,
    head_dim: int,
    window: int,
    cap: float,
    sinks: bool,
    kv_dtype: str | None = None,
) -> Case:
    return Case(
        mode=mode,
        requests=(req,),
        dtype=dtype,
        head_dim=head_dim,
        window_left=window,
        soft_cap=cap,
        sinks=sinks,
        **GPU_SHAPE,
        **({"kv_dtype": kv_dtype, **FP8_SCALES} if kv_dtype else {}),
    )


def variant_probes(
    dtype: str,
    head_dim: int,
    windows: set[int],
    caps: set[float],
    decode: bool,
    sinks: bool,
    kv_dtype: str | None = None,
) -> list[Probe]:
    """Probes for the fa2 prefill module of each window x cap, the CUDA-core decode module of each
    (if `decode`) and the AttentionSink module (if `sinks`), over a `kv_dtype` cache (None: the model's)."""
    out = []
    tag = f"{dtype},{head_dim}" + (f",kv={kv_dtype}" if kv_dtype else "")
    for w in sorted(windows):
        for cap in sorted(caps):
            name = f"{tag},swa={w >= 0},cap={cap > 0}"
            out.append(
                Probe(
                    f"prefill[{name}]",
                    "flashinfer_paged",
                    _case("EXTEND", Request(0, 20), dtype, head_dim, w, cap, False, kv_dtype),
                )
            )
            if decode:
                case = _case("DECODE", Request(20, 1), dtype, head_dim, w, cap, False, kv_dtype)
                out.append(Probe(f"decode_cc[{name}]", "flashinfer_dec_cc", case))
        if sinks:
            case = _case("EXTEND", Request(0, 20), dtype, head_dim, w, 0.0, True, kv_dtype)
            out.append(Probe(f"sink[{tag},swa={w >= 0}]", "flashinfer_paged", case))
    return out


def flashinfer_backends() -> list[str]:
    from harness import backends

    return [n for n in backends.names() if n.startswith("flashinfer")]


def pinned_cases() -> list[tuple[str, Case]]:
    """(backend, case) of every pinned case a FlashInfer adapter runs (in every profile, at its own
    dtype and head_dim)."""
    from harness import backends
    from harness.core.modes import FAMILIES
    from harness.run.suite import pinned_examples

    out = []
    for family in FAMILIES:
        for case in pinned_examples(family):
            out += [(n, case) for n in flashinfer_backends() if backends.load(n).supports(case) is None]
    return out


def profile_variants(profile: str) -> list[tuple[str, int]]:
    """(dtype, head_dim) of every FlashInfer module variant a profile draws."""
    from harness import backends
    from harness.search.profiles import SIZES

    sizes, caps = SIZES[profile], backends.load("flashinfer_paged").capabilities
    return [(t, d) for t in sizes.dtypes for d in sizes.head_dims if t in caps.dtypes and d in caps.head_dims]


def module_probes(profile: str = "gpu") -> list[Probe]:
    """Every variant the profile draws (each KV cache dtype), the variants the pinned cases need,
    and the two helper modules."""
    out = []
    for (dtype, head_dim), kv_dtype in itertools.product(profile_variants(profile), KV_CACHES):
        out += variant_probes(dtype, head_dim, {-1, 8}, {0.0, 30.0}, True, True, kv_dtype)
    for _, c in pinned_cases():
        windows = {-1, 8} if c.window_left >= 0 else {-1}
        decode = c.mode == "DECODE"
        out += variant_probes(c.dtype, c.head_dim, windows, {c.soft_cap}, decode, c.sinks, c.kv_dtype)
    out += [Probe("cascade", call="merge_state"), Probe("packbits", call="segment_packbits")]
    return list({p.label: p for p in out}.values())


def _call(name: str) -> None:
    import flashinfer
    import torch

    if name == "merge_state":
        v = torch.zeros(4, 8, 128, dtype=torch.bfloat16, device="cuda")
        s = torch.zeros(4, 8, dtype=torch.float32, device="cuda")
        flashinfer.merge_state(v, s, v, s)
    else:
        bits = torch.ones(24, dtype=torch.bool, device="cuda")
        flashinfer.segment_packbits(bits, torch.tensor([0, 9, 24], device="cuda"), bitorder="little")


class _Recorded(Exception):
    """Raised in place of a module build: the probe has shown which module it needs."""


def discover_specs(probes: list[Probe]) -> dict:
    """Module name -> FlashInfer JitSpec, found by running each probe up to its first module load."""
    from flashinfer.jit import core

    from harness import backends
    from harness.checks.numeric import check_case

    found: dict = {}

    def record(spec) -> None:  # noqa: ANN001 - a flashinfer JitSpec
        found.setdefault(spec.name, spec)
        raise _Recorded(spec.name)

    original = core.JitSpec.build_and_load
    core.JitSpec.build_and_load = record
    try:
        for p in probes:
            try:
                if p.call:
                    _call(p.call)
                else:  # check_case reports the raise as a CRASH; the spec is recorded
                    check_case(backends.load(p.backend), p.case, "cuda")
            except _Recorded:
                pass
    finally:
        core.JitSpec.build_and_load = original
    return found


def coverage_cases() -> list[tuple[str, Case]]:
    """(backend, case) for every mode x window x cap x sinks x determinism x KV dtype an adapter
    supports in the gpu profile, and the pinned cases."""
    from harness import backends

    shapes = {
        "EXTEND": [Request(0, 24), Request(40, 24)],
        "DECODE": [Request(40, 1)],
        "DRAFT_EXTEND_V2": [Request(40, 4)],
        "TARGET_VERIFY": [Request(40, 4, tree=(-1, 0, 0, 1)), Request(40, 4, tree=(-1, 0, 1, 2))],
        "CROSS": [Request(0, 12, 30), Request(5, 1, 30)],
        "ENCODER_ONLY": [Request(0, 24)],
    }
    dtype, head_dim = GPU_VARIANT
    out = []
    for name in flashinfer_backends():
        backend = backends.load(name)
        for mode in sorted(str(m) for m in backend.capabilities.modes):
            for req in shapes[mode]:
                for window in (-1,) if mode == "CROSS" else (-1, 8):
                    for cap, sinks, det, kv in itertools.product(
                        (0.0, 30.0), (False, True), (False, True), KV_CACHES
                    ):
                        case = _case(mode, req, dtype, head_dim, window, cap, sinks, kv)
                        case = case.replace(deterministic=det)
                        if backend.supports(case) is None:
                            out.append((name, case))
    return out + pinned_cases()


def list_modules() -> list[str]:
    """Names of the compiled FlashInfer modules: JIT-cached and restored prebuilt ones."""
    from flashinfer.jit import env

    names = set()
    for root in (env.FLASHINFER_JIT_DIR, env.FLASHINFER_AOT_DIR):
        if root.is_dir():
            names |= {d.name for d in root.iterdir() if d.is_dir() and any(d.glob("*.so"))}
    return sorted(names)


def ninja_plan(probes: list[Probe]) -> ninja.Plan:
    """Write each probe module's build.ninja, for `ninja.build` to build in one run. Modules FlashInfer
    has prebuilt (an AOT package) are left to it; one ninja does not build (none today) is an error."""
    from flashinfer.jit import env as jit_env

    modules, prebuilt = [], []
    for name, spec in sorted(discover_specs(probes).items()):
        if not hasattr(spec, "write_ninja"):
            raise TypeError(f"module {name} is a {type(spec).__name__}, not built by ninja")
        if spec.is_aot:
            prebuilt.append(name)
            continue
        spec.write_ninja()
        paths = (spec.ninja_path, spec.build_dir, spec.jit_library_path)  # resolved, as the outputs are
        modules.append(ninja.Module(name, *(str(Path(x).resolve()) for x in paths)))
    return ninja.Plan(str(jit_env.FLASHINFER_JIT_DIR.resolve()), tuple(modules), tuple(prebuilt))


def build(jobs: int) -> bool:
    """Phase 1: find every module, then build them in one ninja run. True if it succeeded."""
    plan = ninja_plan(module_probes())
    print(f"phase 1: {len(plan.modules)} modules to build or load ({len(plan.prebuilt)} prebuilt):")
    for m in plan.modules:
        print(f"  {m.name}")
    result = ninja.build(plan, jobs, print)
    print(f"phase 1: {len(result.compiled)} modules compiled, {len(result.cached)} cached")
    for line in result.failed:
        print(f"  FAILED {line}")
    return not result.failed


def check_coverage() -> int:
    """Phase 2: every adapter over its feature combinations; how many probes still compiled."""
    from harness import backends
    from harness.checks.numeric import check_case

    slow = 0
    for name, case in coverage_cases():
        t = time.perf_counter()
        try:
            res = check_case(backends.load(name), case, "cuda")
            outcome = f"{res.status}: {res.reason[:110]}"
        except Exception as e:  # noqa: BLE001 - reported, and the next probe still runs
            outcome = f"error: {type(e).__name__}: {e}"[:140]
        dt = time.perf_counter() - t
        slow += dt > SLOW_LOAD_S
        flag = "  <- compiled here" if dt > SLOW_LOAD_S else ""
        feats = f"{case.mode} P={case.requests[0].prefix_len} w={case.window_left} cap={case.soft_cap:g}"
        feats += f" sinks={int(case.sinks)} det={int(case.deterministic)} d={case.head_dim}"
        feats += f" kv={case.kv_dtype or case.dtype}"
        print(f"cover  {name:<18} {feats:<76} {dt:5.1f}s  {outcome}{flag}")
    return slow


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m harness.run.speed.warmup.flashinfer", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 8, help="nvcc jobs at a time (each takes GBs)"
    )
    args = p.parse_args(argv)
    from harness.run import cache_dir

    cache_dir.apply()  # FlashInfer's JIT modules under the cache directory, as `python -m harness warmup`
    start = time.perf_counter()
    built = build(args.jobs)
    t_build = time.perf_counter() - start
    slow = check_coverage()
    modules = list_modules()
    print(f"modules ({len(modules)}):")
    for m in modules:
        print(f"  {m}")
    total = time.perf_counter() - start
    print(f"warm-up: build {t_build:.0f}s, total {total:.0f}s; {slow} coverage probe(s) compiled late")
    return 0 if built and not slow else 1


if __name__ == "__main__":
    sys.exit(main())
