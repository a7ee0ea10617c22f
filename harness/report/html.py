"""index.html: one self-contained page (inline CSS, embedded PNGs, no scripts) from results.json.

Rendering is a pure function of the loaded results document: the same document gives the same
bytes, which is what lets `python -m harness report results.json` reproduce a run's page.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from html import escape

from harness.core.case import Case, CaseError
from harness.core.compare import where
from harness.core.vocab import PROBLEMS, STATUSES
from harness.report import matrix, pictures, verdict

HEATMAP_MAX_HEIGHT = 240  # display pixels
CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;border-bottom:1px solid #ccc;padding-bottom:2px}
h3{font-size:15px;margin:0 0 6px} h4{font-size:13px;margin:12px 0 4px}
.meta{color:#555} nav a{margin-right:14px}
table{border-collapse:collapse} td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}
th{background:#f3f3f3;text-align:left}
#summary-matrix td.cell{min-width:86px;font-size:12px;white-space:nowrap}
td.bad{background:#f4b6b0} td.close{background:#fde9a9} td.ok{background:#c5e5c5}
td.skipped{background:#e2e2e2;color:#555} td.empty{background:#fafafa;color:#aaa}
.n-fail,.n-error,.n-crash,.n-hang{font-weight:bold;color:#900} .n-refused{color:#8a5a00}
.n-xfail{color:#5a3a8a} .n-zero{color:#777}
tr.collapsed td{background:#f2f2f2;color:#555;font-size:12px}
section.failure{border:2px solid #c0392b;border-radius:6px;padding:10px 14px;margin:14px 0;background:#fffafa}
section.failure.crash,section.failure.hang,section.failure.error{border-color:#6c3483}
pre{background:#f6f6f6;padding:6px 8px;overflow-x:auto;white-space:pre-wrap;word-break:break-all;margin:0}
img.picture{image-rendering:pixelated;border:1px solid #999;display:block;margin:4px 0}
figure{margin:6px 0 10px} figcaption{color:#555;font-size:12px}
.swatch{display:inline-block;width:14px;height:14px;border:1px solid #999;vertical-align:middle;
  margin:0 3px 0 8px}
ul.probe-lines{font-family:ui-monospace,monospace;font-size:12px;margin:4px 0;padding-left:18px}
.legend{font-size:12px;color:#444}
div.axes{position:relative;display:inline-block;margin:4px 0 20px 30px;font-size:11px;color:#444}
div.axes img.picture{margin:0}
.ytick{position:absolute;right:100%;padding-right:4px;transform:translateY(-50%)}
.xtick{position:absolute;top:100%;transform:translateX(-50%)}
.worst-cell{position:absolute;box-sizing:border-box;outline:2px solid #00a0ff;outline-offset:1px}
"""


def _num(x: object, digits: int = 3) -> str:
    if x is None:
        return "-"
    v = float(x)  # type: ignore[arg-type]
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "∞" if v > 0 else "-∞"
    return f"{v:.{digits}g}"


def _header(data: dict) -> str:
    run = data["run"]
    tot = matrix.totals(data["results"])
    counts = ", ".join(f'<span class="{_count_class(s, tot[s])}">{tot[s]} {s}</span>' for s in STATUSES)
    problems = sum(tot[s] for s in PROBLEMS)
    checked = tot["checked"]
    return (
        f"<h1>attn-harness report: {escape(verdict.verdict(data))}</h1>\n{_interrupted(data)}{_split(run)}"
        f'<p class="meta">run <b>{escape(str(run.get("id", "?")))}</b> · attn-harness <span id="version">'
        f'{escape(str(data["environment"].get("attn-harness", "unknown")))}</span> · started '
        f"{escape(str(run.get('started', '?')))} · {_num(run.get('elapsed_s'), 4)} s · profile "
        f"{escape(str(run.get('profile', '?')))} · exit status "
        f"{escape(str(run.get('exit_status', '?')))}</p>\n"
        f'<p class="meta">command: <code>{escape(str(run.get("command", "")))}</code></p>\n'
        f'<p id="totals">{len(data["results"])} records: {counts}</p>\n'
        f'<p id="checked">cases checked: {checked}; drawn but refused by the backend: {tot["refused"]}'
        f"{_refused_share(checked, tot['refused'])}</p>\n"
        '<nav><a href="#summary">Summary matrix</a><a href="#failures">Failures '
        f'({problems})</a><a href="#refusals">Refusals ({tot["refused"]})</a>'
        f'<a href="#skips">Skips ({tot["skip"]})</a><a href="#environment">Environment</a></nav>\n'
    )


def _interrupted(data: dict) -> str:
    """An interrupted run's line: what it did not check."""
    if not data["run"].get("interrupted"):
        return ""
    lines = verdict.unchecked(data) or ["nothing is known to be left"]
    items = "".join(f"<li>{escape(line)}</li>" for line in lines)
    return f'<div id="interrupted"><p><b>Interrupted: not checked:</b></p><ul>{items}</ul></div>\n'


def _split(run: dict) -> str:
    """A merged check's lines (harness/report/merge.py): the verdict against the last run first,
    then the missing shares and each share's run and environment."""
    if "shares" not in run:
        return ""
    lines = []
    if run.get("trend"):
        lines.append(f'<p id="trend"><b>{escape(run["trend"]["line"])}</b></p>')
    count = run.get("shard", {}).get("count", "?")
    if run.get("incomplete"):
        missing = ", ".join(f"{i}/{count}" for i in run["incomplete"])
        lines.append(f'<p id="incomplete"><b>shares missing: {escape(missing)}</b></p>')
    for share in run["shares"]:
        env = share.get("environment", {})
        where = ", ".join(f"{k} {env[k]}" for k in ("gpu", "torch", "flashinfer") if k in env)
        lines.append(
            f'<p class="meta">share {share["index"]}/{count}: run {escape(str(share.get("id")))}, '
            f'{share.get("records")} records, exit status {escape(str(share.get("exit_status")))}'
            f"{escape('; ' + where if where else '')}</p>"
        )
    return "\n".join(lines) + "\n"


def _count_class(status: str, n: int) -> str:
    """A count's CSS class: its status colour (failures bold red) only when it is not zero."""
    return f"n-{status}" if n else "n-zero"


def _refused_share(checked: int, refused: int) -> str:
    return f" ({refused / (checked + refused):.0%} of the drawn cases)" if refused else ""


def _cell(c: matrix.Cell, failure: int | None) -> str:
    """A matrix cell; its failures, harness errors, crashes and hangs link to the first of them."""
    parts = [
        f'<a href="#failure-{failure}" class="n-{s}">{n} {s}</a>'
        if s in PROBLEMS and failure is not None
        else f'<span class="n-{s}">{n} {s}</span>'
        for s, n in c.counts.items()
        if n
    ]
    if c.worst is not None:
        parts.append(f"worst {_num(c.worst, 2)}")
    title = ", ".join(f"{n} {s}" for s, n in c.counts.items()) + f"; worst err/budget {_num(c.worst)}"
    if c.counts["refused"]:
        parts.append(f"{c.checked} checked / {c.counts['refused']} refused")
    body = "<br>".join(parts) or "-"
    return f'<td class="cell {c.state}" title="{escape(title)}">{body}</td>'


def _matrix(data: dict) -> str:
    rows = matrix.build(data["results"])
    out = ['<section id="summary"><h2>Summary matrix</h2>']
    if not rows:
        out.append("<p>No cases were checked.</p></section>")
        return "\n".join(out)
    head = "".join(f"<th>{escape(c)}</th>" for c in matrix.COLUMNS)
    out.append(
        f'<table id="summary-matrix"><tr><th>backend</th><th>device</th><th>family (mode)</th>{head}</tr>'
    )
    first = _first_failures(data)
    shown, collapsed = matrix.collapse_skipped(rows)
    for (backend, device, family), cells in shown.items():
        tds = "".join(_cell(cells[c], first.get((backend, device, family, c))) for c in matrix.COLUMNS)
        out.append(
            f"<tr><th>{escape(backend)}</th><td>{escape(device)}</td>"
            f"<td>{escape(matrix.family_label(family))}</td>{tds}</tr>"
        )
    for (device, reason), skipped in collapsed.items():
        backends = sorted({b for b, _, _ in skipped})
        out.append(
            f'<tr class="collapsed"><th colspan="3">{len(skipped)} rows on {escape(device)} skipped</th>'
            f'<td colspan="{len(matrix.COLUMNS)}">{escape(reason)} ({len(backends)} backends: '
            f"{escape(', '.join(backends))})</td></tr>"
        )
    out.append("</table>")
    out.append(
        '<p class="legend">Each cell counts checked cases (hypothesis examples), cases the backend '
        "refused (drawn, but turned down by its <code>supports()</code>), harness errors and skipped "
        "tests; a case counts under <i>all</i>, under each feature it uses, and under <i>none</i> if it "
        "uses none. <i>worst</i> is the largest error/budget ratio (a case passes at &le; 1). "
        '<span class="swatch" style="background:#f4b6b0"></span>failure, harness error, crash or hang'
        '<span class="swatch" style="background:#fde9a9"></span>passed, worst &gt; '
        f'{matrix.CLOSE}<span class="swatch" style="background:#c5e5c5"></span>passed'
        '<span class="swatch" style="background:#e2e2e2"></span>skipped only</p></section>'
    )
    return "\n".join(out)


def _first_failures(data: dict) -> dict[tuple[str, str, str, str], int]:
    """(backend, device, family, matrix column) -> the number of its first failure section."""
    first: dict[tuple[str, str, str, str], int] = {}
    for i, rec in enumerate(_problems(data), 1):
        for col in matrix.columns_of(rec):
            first.setdefault((rec["backend"], rec["device"], rec["family"], col), i)
    return first


def _problems(data: dict) -> list[dict]:
    """The records the Failures section shows, in its order."""
    return [r for r in data["results"] if r["status"] in PROBLEMS]


def _location(rec: dict) -> str:
    worst = (rec.get("verdict") or {}).get("worst")
    if worst is None:
        return "-"
    try:
        return where(Case.from_dict(rec["case"]), tuple(worst))
    except (CaseError, TypeError, IndexError, KeyError):
        return f"request {worst[0]}, token {worst[1]}, head {worst[2]}"


def _verdict_table(rec: dict) -> str:
    v = rec.get("verdict")
    if not v:
        return ""
    rows = [
        ("error (max |out - ref|)", _num(v.get("err"))),
        ("budget", _num(v.get("budget"))),
        ("error / budget", _num(v.get("ratio"))),
        ("worst location", escape(_location(rec))),
        ("fraction of elements over budget", f"{float(v.get('frac_over') or 0.0):.2%}"),
        ("NaN/Inf elements", str(v.get("nonfinite", 0))),
    ]
    if v.get("lse_err") is not None:
        rows.append(("LSE error / budget", f"{_num(v['lse_err'])} / {_num(v.get('lse_budget'))}"))
    body = "".join(f"<tr><th>{k}</th><td>{val}</td></tr>" for k, val in rows)
    return f'<table class="verdict">{body}</table>'


def _heatmap(rec: dict) -> str:
    em = rec.get("error_map")
    if not em or not em.get("values"):
        return "<h4>Error over (token, head)</h4><p>No error map was recorded for this failure.</p>"
    pixels = pictures.heatmap_pixels(em)
    cell = pictures.heatmap_cell(len(pixels[0]), len(pixels), HEATMAP_MAX_HEIGHT)
    img = pictures.img_tag(pixels, "error heatmap over token and head", "picture heatmap", cell=cell)
    wb, wh = pictures.worst_cell(em)
    worst = em["values"][wb][wh]
    ratio = math.inf if worst is None or not em["budget"] else worst / em["budget"]
    worst_text = "NaN/Inf" if worst is None else f"{_num(ratio)}× the budget"
    lo, hi = wb * int(em["token_bin"]), min(int(em["tokens"]), (wb + 1) * int(em["token_bin"])) - 1
    tokens = f"token {lo}" if lo == hi else f"tokens {lo}..{hi}"
    starts = ", ".join(map(str, em.get("request_starts", [])))
    legend = (
        "".join(
            f'<span class="swatch" style="background:rgb{pictures.ratio_colour(r)}"></span>{_num(r)}×'
            for r in pictures.LEGEND_RATIOS
        )
        + f'<span class="swatch" style="background:rgb{pictures.NAN_COLOUR}"></span>NaN/Inf'
    )
    return (
        f"<h4>Error over (token, head)</h4><figure>{_axes(em, img, cell, (wb, wh))}"
        f"<figcaption>x: token, {em['tokens']} in request order ({em['token_bin']} per column; "
        f"requests start at tokens {escape(starts)}, marked in the strip below); "
        f"y: query head 0 (top) to {em['heads'] - 1}. "
        f"Colour: {escape(em.get('quantity', 'error'))} divided by the budget {_num(em['budget'])}. "
        f"Outlined: the worst cell ({tokens}, head {wh}: {worst_text})."
        f'</figcaption><div class="legend">{legend}</div></figure>'
    )


def _axes(em: dict, img: str, cell: tuple[int, int], worst: tuple[int, int]) -> str:
    """The heatmap with its axis ticks (heads on the left; request starts and the last token below) and
    an outline on its worst cell, laid over the image in display pixels (the image has a 1px border)."""
    w, h = cell
    bin_ = int(em["token_bin"])
    heads = int(em["heads"])
    ys = range(heads) if h >= 12 else sorted({0, heads - 1})
    ticks = [f'<span class="ytick" style="top:{1 + y * h + h // 2}px">{y}</span>' for y in ys]
    last_x = -100
    for t in [*em.get("request_starts", [0]), int(em["tokens"]) - 1]:
        x = 1 + (int(t) // bin_) * w + w // 2
        if x - last_x >= 28:  # labels closer than this would overlap
            ticks.append(f'<span class="xtick" style="left:{x}px">{t}</span>')
            last_x = x
    b, hd = worst
    box = f"left:{1 + b * w}px;top:{1 + hd * h}px;width:{w}px;height:{h}px"
    mark = f'<span class="worst-cell" style="{box}"></span>'
    return f'<div class="axes">{img}{mark}{"".join(ticks)}</div>'


def _probe(rec: dict) -> str:
    pr = rec.get("probe")
    if not pr:
        return "<h4>Mask probe</h4><p>Not probed.</p>"
    out = ['<h4>Mask probe</h4><div class="probe">']
    if pr.get("error"):
        out.append(f"<p>The probe could not run: {escape(pr['error'])}</p></div>")
        return "".join(out)
    out.append(f'<p class="legend">{escape(pr.get("rule", ""))}; {pr.get("runs", "?")} backend runs.</p>')
    out.append('<ul class="probe-lines">' + "".join(f"<li>{escape(x)}</li>" for x in pr["lines"]) + "</ul>")
    for rp in pr.get("requests", []):
        if not rp["grid"] or not rp["grid"][0]:
            continue
        binning = (
            f" ({rp['row_bin']} queries x {rp['col_bin']} keys per cell)"
            if rp["row_bin"] * rp["col_bin"] > 1
            else ""
        )
        img = pictures.img_tag(
            pictures.probe_pixels(rp["grid"]), f"mask probe of request {rp['request']}", "picture probe", 320
        )
        out.append(
            f"<figure>{img}<figcaption>request {rp['request']}: rows = {rp['queries']} queries, "
            f"columns = {rp['keys']} keys{binning}. {escape(rp['summary'])}</figcaption></figure>"
        )
    legend = "".join(
        f'<span class="swatch" style="background:rgb{pictures.PROBE_COLOURS[c]}"></span>{escape(m)}'
        for c, m in pr.get("legend", {}).items()
        if c in pictures.PROBE_COLOURS
    )
    out.append(f'<div class="legend">{legend}</div></div>')
    return "".join(out)


def _traceback(rec: dict) -> str:
    tb = (rec.get("extra") or {}).get("traceback")
    return f'<h4>Traceback</h4><pre class="traceback">{escape(tb)}</pre>' if tb else ""


def _pictures(rec: dict) -> str:
    """The error heatmap (failures) and the mask probe of a case record; none for a whole test's."""
    if rec.get("case") is None:
        return ""
    return (_heatmap(rec) if rec["status"] == "fail" else "") + _probe(rec)


def _failure(i: int, rec: dict) -> str:
    status = rec["status"]
    feats = ", ".join(rec.get("features") or []) or "no features"
    case_json = json.dumps(rec["case"], indent=1) if rec.get("case") is not None else "(none)"
    return (
        f'<section class="failure {escape(status)}" id="failure-{i}">'
        f"<h3>{i}. {escape(status.upper())} · {escape(rec['backend'])} on {escape(rec['device'])} · "
        f"{escape(matrix.family_label(rec['family']))} · {escape(feats)}</h3>"
        f'<p class="meta">{escape(rec.get("test_id") or "")}</p>'
        f'<p class="reason">{escape(rec.get("reason") or "")}</p>'
        f"{_verdict_table(rec)}"
        f'<h4>Repro</h4><pre class="repro">{escape(rec.get("repro") or "(no case)")}</pre>'
        f"{_traceback(rec)}{_pictures(rec)}"
        f'<h4>Case</h4><pre class="case-json">{escape(case_json)}</pre></section>'
    )


def _failures(data: dict) -> str:
    bad = _problems(data)
    out = [f'<section id="failures"><h2>Failures ({len(bad)})</h2>']
    if not bad:
        out.append("<p>None.</p>")
    out += [_failure(i, rec) for i, rec in enumerate(bad, 1)]
    out.append("</section>")
    return "\n".join(out)


def _grouped(data: dict, status: str, section: str, table: str, title: str, note: str = "") -> str:
    """The records of one status counted by (backend, device, family, reason), as a section."""
    groups = Counter(
        (r["backend"], r["device"], r["family"], r.get("reason") or "(no reason given)")
        for r in data["results"]
        if r["status"] == status
    )
    out = [f'<section id="{section}"><h2>{title} ({sum(groups.values())})</h2>{note}']
    if not groups:
        out.append("<p>None.</p></section>")
        return "\n".join(out)
    head = "".join(f"<th>{h}</th>" for h in ("backend", "device", "family", "count", "reason"))
    out.append(f'<table id="{table}"><tr>{head}</tr>')
    for (b, d, f, why), n in sorted(groups.items()):
        cells = "".join(f"<td>{escape(str(x))}</td>" for x in (b, d, f, n, why))
        out.append(f"<tr>{cells}</tr>")
    out.append("</table></section>")
    return "\n".join(out)


def _refusals(data: dict) -> str:
    note = (
        '<p class="legend">Cases a search drew that the backend\'s <code>supports()</code> turned down: '
        "not checked. A search in which the backend refused most of its drawn cases fails.</p>"
    )
    return _grouped(data, "refused", "refusals", "refusal-table", "Refused cases", note)


def _environment(data: dict) -> str:
    rows = "".join(
        f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in data["environment"].items()
    )
    return (
        f'<section id="environment"><h2>Environment</h2><table id="environment-table">{rows}</table>'
        "</section>"
    )


def render(data: dict) -> str:
    """The page for a loaded results document (see results_json.load)."""
    title = f"attn-harness report {data['run'].get('id', '')}"
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{CSS}</style></head><body>\n"
        f"{_header(data)}{_matrix(data)}\n{_failures(data)}\n{_refusals(data)}\n"
        f"{_grouped(data, 'skip', 'skips', 'skip-table', 'Skips')}\n{_environment(data)}\n"
        "</body></html>\n"
    )
