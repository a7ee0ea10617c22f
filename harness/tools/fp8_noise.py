"""Measure the noise of attention over an FP8 KV cache: the numbers behind its tolerance rule.

    python -m harness.tools.fp8_noise [--cases N] [--profile ci] [--json FILE]

Over N cases drawn by the suite's strategies (every family, windowed or not) with an FP8 cache
forced on, on the CPU, against the exact reference over the cache's values (code * scale):
- the noise terms: `native` (the same-precision reference over those values), `rounded_kv` (the
  exact reference over them rounded into the case dtype: what dequantizing into it alone does),
  `native_rounded` (native over the rounded values: a fallback's whole computation) and
  `quantization` (the exact output over the unquantized K/V: the error the rule must not count);
- each CPU backend's error over the budget of three candidate rules (`budgets` in `measure`:
  `rule` is the harness's own verdict). torch_native and flex_eager dequantize into the case dtype
  as an SDPA fallback does; torch_split reads the codes as they are, k_scale folded into the
  softmax scale and v_scale on the output, as FlashInfer does.
The same cases without the FP8 cache follow, for comparison. docs/design.md quotes the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from harness import backends
from harness.core.batch import Inputs, build_batch, make_inputs
from harness.core.case import Case
from harness.core.compare import compare, noise
from harness.core.modes import FAMILIES, FAMILY_MODE, Mode
from harness.core.vocab import KV_DTYPES, TORCH_DTYPES
from harness.search import profiles
from harness.search.strategies import ALL_CAPS, KV_SCALES, cases
from references.torch_ref import references

BACKENDS = ("torch_native", "torch_split", "flex_eager")
RULES = ("rule", "native_rounded", "native_only")
TERMS = ("rounded_kv", "native_rounded", "quantization")


def fp8_cases(n: int, profile: str) -> list[Case]:
    """n cases (fewer if hypothesis repeats itself) of every family, windowed or not, each with an
    FP8 cache and its scales drawn like the strategies draw them; derandomized, so a run replays."""
    sizes = profiles.SIZES[profile]

    def family_cases(family: str) -> st.SearchStrategy[Case]:
        windowed = st.just(False) if FAMILY_MODE[family] == Mode.CROSS else st.booleans()
        return windowed.flatmap(lambda w: cases(family, w, ALL_CAPS, sizes))

    drawn = st.sampled_from(FAMILIES).flatmap(family_cases)
    scale = st.sampled_from(KV_SCALES)
    found: list[Case] = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.tuples(drawn, st.sampled_from(KV_DTYPES), scale, scale))
    def collect(drawn_case: tuple) -> None:
        case, kv_dtype, k_scale, v_scale = drawn_case
        fp8 = {"kv_dtype": kv_dtype, "k_scale": k_scale, "v_scale": v_scale}
        found.append(case.replace(**fp8, logits="plain", logit_offset=0.0))  # a pattern holds no FP8 cache

    collect()
    return list({c.to_json(): c for c in found}.values())[:n]


def _max_abs(x: torch.Tensor) -> float:
    return float(x.double().abs().max()) if x.numel() else 0.0


def measure(case: Case, names: tuple[str, ...]) -> dict:
    """One case's noise terms and, per backend, its error over each rule's budget."""
    inputs = make_inputs(case)
    fp8 = case.kv_dtype is not None
    exact, native, *rounded = references(case, inputs, ("exact", "native", "rounded_kv")[: 2 + fp8])
    plain = case.replace(kv_dtype=None, k_scale=1.0, v_scale=1.0)
    held = Inputs(
        q_all=inputs.q_all,
        kv_all=inputs.kv_all.to(TORCH_DTYPES[case.dtype]),
        q_lens=inputs.q_lens,
        kv_lens=inputs.kv_lens,
        sinks=inputs.sinks,
    )
    (native_rounded,) = references(plain, held, ("native",))
    (unquantized,) = references(plain, make_inputs(plain), ("exact",))
    terms = {
        "native": _max_abs(native.out - exact.out),
        "rounded_kv": _max_abs(rounded[0].out - exact.out) if fp8 else 0.0,
        "native_rounded": _max_abs(native_rounded.out - exact.out),
        "quantization": _max_abs(unquantized.out - exact.out),
    }
    mult, floor = (3.0 if case.soft_cap > 0 else 2.0), noise(exact.out, case.dtype)
    budgets = {
        "rule": mult * (terms["native"] + terms["rounded_kv"]) + floor,
        "native_rounded": mult * terms["native_rounded"] + floor,
        "native_only": mult * terms["native"] + floor,
    }
    row = {"case": case.to_dict(), **terms, "backends": {}}
    for name in names:
        backend = backends.load(name)
        if backend.supports(case) or backend.available("cpu"):
            continue
        out = backend.run(build_batch(case, inputs, "cpu", backend.capabilities.whole_page_loads)).out
        extra = {"ref_rounded_kv": rounded[0].out} if fp8 else {}
        verdict = compare(case, out, exact.out, native.out, **extra)  # the harness's own: the rule
        ratios = {rule: verdict.err / b for rule, b in budgets.items()}
        row["backends"][name] = {"err": verdict.err, "passed": verdict.passed, **ratios}
    return row


def _quantiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    t = torch.tensor(values, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.5, 0.99], dtype=torch.float64)).tolist()
    return {"n": len(values), "median": q[0], "p99": q[1], "max": float(t.max())}


def summarise(rows: list[dict]) -> dict:
    """Per backend and rule: err / budget (median, p99, max) and the cases over budget; each noise
    term over native."""
    out: dict = {"cases": len(rows), "terms": {}, "backends": {}}
    for term in TERMS:
        out["terms"][term] = _quantiles([r[term] / r["native"] for r in rows if r["native"] > 0])
    for name in sorted({n for r in rows for n in r["backends"]}):
        runs = [r["backends"][name] for r in rows if name in r["backends"]]
        out["backends"][name] = {
            rule: {**_quantiles([b[rule] for b in runs]), "over": sum(b[rule] > 1 for b in runs)}
            for rule in RULES
        }
    return out


def table(summary: dict, title: str) -> str:
    lines = [f"{title}: {summary['cases']} cases; err / budget: median, p99, max (cases over budget)"]
    lines.append(f"{'':14}" + "".join(f"{rule:>30}" for rule in RULES))
    for name, by_rule in summary["backends"].items():
        cells = [f"{s['median']:.3f} {s['p99']:.3f} {s['max']:.3f} ({s['over']})" for s in by_rule.values()]
        lines.append(f"{name:14}" + "".join(f"{c:>30}" for c in cells))
    for term, q in summary["terms"].items():
        if q.get("n"):
            lines.append(f"{term} / native: median {q['median']:.2f}, p99 {q['p99']:.2f}, max {q['max']:.3g}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.tools.fp8_noise", description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--profile", default="ci", choices=profiles.PROFILES)
    p.add_argument("--backend", action="append", help=f"default: {', '.join(BACKENDS)}")
    p.add_argument("--json", help="write every case's numbers and the summaries here")
    args = p.parse_args(argv)
    names = tuple(args.backend or BACKENDS)
    found = fp8_cases(args.cases, args.profile)
    fp8_rows = [measure(c, names) for c in found]
    plain_rows = [measure(c.replace(kv_dtype=None, k_scale=1.0, v_scale=1.0), names) for c in found]
    fp8, plain = summarise(fp8_rows), summarise(plain_rows)
    print(table(fp8, "FP8 KV cache"))
    print(table(plain, "the same cases without it"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"fp8": fp8, "plain": plain, "rows": fp8_rows, "plain_rows": plain_rows}, f, indent=1)
    failed = any(not b["passed"] for r in fp8_rows + plain_rows for b in r["backends"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
