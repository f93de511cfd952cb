"""``report.html``: one self-contained page (plots embedded as base64 PNG, inline CSS, no network).

A tiny inline script records, once the page has loaded, each plot's decoded width in a
``data-decoded-width`` attribute, so a headless browser's DOM dump proves the images really decoded.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence

from oomload.report.findings import describe
from oomload.report.metadata import run_metadata
from oomload.report.plots import plot_by_concurrency, plot_lengths, plot_timeline
from oomload.report.steptable import STEP_COLUMNS, STEP_LEGEND, step_row
from oomload.verdict import Verdict
from oomload.verdict.gate import GateResult, GateStatus
from oomload.verdict.recommend import Recommendation
from oomload.verdict.runview import RunView

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ddd;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}th.l,td code{white-space:nowrap}
.ok{color:#1a7f37}.info{color:#0969da}.warn{color:#9a6700}.bad{color:#cf222e;font-weight:bold}
.cut{background:#fff8c5;border:1px solid #d4a72c;padding:8px 12px;margin:12px 0}
pre.flags{background:#f6f8fa;padding:10px;border:1px solid #ddd;white-space:pre-wrap}
img{max-width:100%;border:1px solid #eee;margin:6px 0}
p.note{font-size:.85em;color:#555;margin:4px 0}
"""
DECODE_SCRIPT = """
window.addEventListener('load',function(){document.querySelectorAll('img.plot').forEach(function(i){
i.setAttribute('data-decoded-width',String(i.naturalWidth));});
document.body.setAttribute('data-plots-checked','1');});
"""
GATE_CLASS = {GateStatus.PASS: "ok", GateStatus.FAIL: "bad", GateStatus.NOT_EVALUATED: "warn"}


def render_html(
    view: RunView, verdict: Verdict, recommendation: Recommendation, gate_results: Sequence[GateResult] = ()
) -> str:
    e = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>oomload verdict — {e(verdict.run.model or 'run')}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>oomload verdict — {e(verdict.run.model or 'model ?')}</h1>",
        f"<p>run directory <code>{e(verdict.run.path)}</code> · "
        f"target <code>{e(verdict.run.url or '?')}</code>"
        + (" (simulated)" if verdict.run.simulated else "")
        + "</p>",
    ]
    if verdict.run.cut_short:
        out.append(
            f'<div class="cut"><b>This run was cut short:</b> {e(verdict.run.cut_short_detail or "")}</div>'
        )
    out.append("<table>")
    for f in describe(verdict, recommendation):
        if f.key != "recommendation":
            out.append(
                f'<tr><th class="l">{e(f.label)}</th>'
                f'<td class="l {f.severity}" data-key="{e(f.key)}">{e(f.text)}</td></tr>'
            )
    out.append("</table>")
    flag_line = e(recommendation.flag_line)
    out += ["<h2>Recommendation</h2>", f'<pre class="flags" id="flag-line">{flag_line}</pre>']
    out.append(f"<p>{e(recommendation.reasoning)}</p><table><tr>")
    out.append(
        "".join(f'<th class="l">{h}</th>' for h in ("flag", "recommended", "current", "why")) + "</tr>"
    )
    for setting in recommendation.settings:
        out.append(
            f'<tr><td class="l"><code>{e(setting.flag)}</code></td>'
            f"<td>{e(setting.shown)}</td>"
            f"<td>{'—' if setting.current is None else e(str(setting.current))}</td>"
            f'<td class="l">{e(setting.reason)}</td></tr>'
        )
    out.append("</table>")
    if gate_results:
        out.append(
            '<h2>Gate</h2><table><tr><th class="l">rule</th><th class="l">result</th>'
            '<th class="l">reason</th></tr>'
        )
        for r in gate_results:
            out.append(
                f'<tr><td class="l"><code>{e(r.gate.text)}</code></td>'
                f'<td class="l {GATE_CLASS[r.status]}">{r.status.value.replace("_", " ")}</td>'
                f'<td class="l">{e(r.reason)}</td></tr>'
            )
        out.append("</table>")
    out.append(f"<h2>Confidence: {e(verdict.confidence)}</h2>")
    if verdict.notes:
        out.append(
            "<ul>"
            + "".join(
                f'<li class="{"warn" if n.severity == "warning" else "info"}">{e(n.message)}</li>'
                for n in verdict.notes
            )
            + "</ul>"
        )
    else:
        out.append("<p>No caveats.</p>")
    out.append('<h2>Run</h2><table class="meta" id="run-metadata">')
    for label, text in run_metadata(view, verdict):
        out.append(f'<tr><th class="l">{e(label)}</th><td class="l">{e(text)}</td></tr>')
    out.append("</table>")
    plots = (
        (
            "timeline",
            "KV usage, preemptions, running/waiting and device memory over time",
            plot_timeline(view, verdict),
            "Steps are shaded by phase (ramp blue, refinement orange) and labelled with their concurrency "
            "(12r: a refinement step at 12). A hatched gap is the drain before a lower step: no step "
            "runs while the higher step's requests finish, until the requests in flight fall to the "
            "lower level; what is measured then belongs to the step before it.",
        ),
        (
            "by-concurrency",
            "Latency and throughput against concurrency, onsets marked",
            plot_by_concurrency(verdict),
            "P50 solid, P99 dashed; n = the ok requests behind each point. Throughput is what each "
            "step completed while it held its level, as in the per-step table.",
        ),
        (
            "lengths",
            "Trace length histograms with the recommended max_model_len",
            plot_lengths(view, verdict, recommendation),
            "",
        ),
    )
    for key, caption, png, note in plots:
        data = base64.b64encode(png).decode("ascii")
        out.append(f"<h2>{e(caption)}</h2>")
        if note:
            out.append(f'<p class="note">{e(note)}</p>')
        out.append(
            f'<img class="plot" id="plot-{key}" alt="{e(caption)}" src="data:image/png;base64,{data}">'
        )
    out.append(
        '<h2>Per step</h2><table id="per-step"><tr>'
        + "".join(f"<th>{e(c)}</th>" for c in STEP_COLUMNS)
        + "</tr>"
    )
    for s in verdict.steps:
        cells = "".join(f"<td{' class=l' if i == 2 else ''}>{e(c)}</td>" for i, c in enumerate(step_row(s)))
        out.append(f"<tr>{cells}</tr>")
    out.append(f"</table><p><small>{e(STEP_LEGEND)}</small></p>")
    out.append(f"<script>{DECODE_SCRIPT}</script></body></html>")
    return "\n".join(out) + "\n"
