"""A self-contained HTML attribution report: no network, works from a file.

The trajectory as a timeline with blame badges, each step's inputs and output, the interval
chart (inline SVG), the repair and the explanation.
"""

from __future__ import annotations

import html
import json
from typing import Any

from otel_replay.trajectory import Trajectory

COLOURS = {"decisive": "#c62828", "contributing": "#ef6c00", "locked-in": "#6d6d6d", "no effect": "#2e7d32",
           "protective": "#00838f", "undecided": "#f9a825", "observation-only": "#5c6bc0", "unreplayable": "#8e24aa",
           "no policy": "#5c6bc0", "not scored": "#9e9e9e"}
CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:0;background:#fafafa;color:#1d1d1d}
header{background:#1d2733;color:#fff;padding:18px 28px}header h1{margin:0;font-size:20px}
header .sub{opacity:.8;font-size:13px;margin-top:4px}main{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,2fr);gap:20px;padding:20px 28px}
section{background:#fff;border:1px solid #e3e3e3;border-radius:8px;padding:16px 18px;margin-bottom:18px}
h2{font-size:15px;margin:0 0 10px}.step{border-left:4px solid #ccc;padding:8px 12px;margin:8px 0;background:#fcfcfc;border-radius:4px}
.badge{display:inline-block;color:#fff;border-radius:10px;padding:1px 9px;font-size:12px;margin-left:6px}
.kind{font-family:ui-monospace,monospace;font-size:12px;color:#555}.culprit{box-shadow:0 0 0 2px #c62828 inset}
pre{white-space:pre-wrap;word-break:break-word;background:#f4f4f4;padding:8px;border-radius:4px;font-size:12px;max-height:320px;overflow:auto}
details summary{cursor:pointer;color:#1a5fb4;font-size:13px}dl{margin:0}dt{font-weight:600;margin-top:8px}dd{margin:2px 0 0}
table{border-collapse:collapse;width:100%;font-size:13px}td,th{border-bottom:1px solid #eee;padding:4px 6px;text-align:left}
.ok{color:#2e7d32}.bad{color:#c62828}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:+.2f}"


def interval_chart(steps: list[dict[str, Any]], epsilon: float | None = None) -> str:
    """One row per scored step: the estimate and its interval on a -1..1 axis, the band ±epsilon shaded."""
    rows = [s for s in steps if s.get("estimate") is not None]
    width, row_h, left = 460, 26, 150
    height = row_h * len(rows) + 30

    def x(v: float) -> float:
        return left + (v + 1) / 2 * (width - left - 10)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="effect of each step with its interval">']
    if epsilon:
        parts.append(f'<rect x="{x(-epsilon)}" y="0" width="{x(epsilon) - x(-epsilon)}" height="{height - 20}" '
                     f'fill="#e8f5e9"><title>no effect: inside ±{epsilon:g}</title></rect>')
    parts.append(f'<line x1="{x(0)}" y1="0" x2="{x(0)}" y2="{height - 20}" stroke="#999" stroke-dasharray="3,3"/>')
    for tick in (-1, -0.5, 0, 0.5, 1):
        parts.append(f'<text x="{x(tick)}" y="{height - 5}" font-size="10" text-anchor="middle">{tick}</text>')
    for n, s in enumerate(rows):
        y = n * row_h + 14
        colour = COLOURS.get(s["verdict"], "#555")
        low = s["estimate"] if s.get("ci_low") is None else s["ci_low"]
        high = s["estimate"] if s.get("ci_high") is None else s["ci_high"]
        parts.append(f'<text x="4" y="{y + 4}" font-size="11">#{s["index"]} {_e(s["name"])[:18]}</text>')
        parts.append(f'<line x1="{x(low)}" y1="{y}" x2="{x(high)}" y2="{y}" stroke="{colour}" stroke-width="3"/>')
        parts.append(f'<circle cx="{x(s["estimate"])}" cy="{y}" r="5" fill="{colour}"><title>{_e(s["verdict"])}: '
                     f'{s["estimate"]:+.2f} [{low:+.2f}, {high:+.2f}]</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def _messages(messages: Any) -> str:
    return f"<pre>{_e(json.dumps(list(messages), indent=2, ensure_ascii=False))}</pre>"


def render_html(report: dict[str, Any], trajectory: Trajectory) -> str:
    """The report document (AttributionResult.report(), or as stored) as one HTML page."""
    steps_by_index = {s["index"]: s for s in report["steps"]}
    timeline = []
    for step in trajectory.steps:
        info = steps_by_index.get(step.index, {"verdict": "not scored", "estimate": None, "ci_low": None, "ci_high": None,
                                                 "culprit": False})
        colour = COLOURS.get(info["verdict"], "#555")
        interval = (f" [{_num(info['ci_low'])}, {_num(info['ci_high'])}]" if info.get("ci_low") is not None else "")
        timeline.append(
            f'<div class="step{" culprit" if info.get("culprit") else ""}" style="border-left-color:{colour}">'
            f'<b>#{step.index}</b> <span class="kind">{_e(step.kind)}</span> {_e(step.name)}'
            f'<span class="badge" style="background:{colour}">{_e(info["verdict"])}</span>'
            f' effect {_num(info.get("estimate"))}{interval}'
            f'<div class="kind">span {_e(step.span_id)} · agent {_e(step.agent)} · {_e(step.status)}</div>'
            f'<details><summary>inputs ({len(step.inputs)} messages)</summary>{_messages(step.inputs)}</details>'
            f'<details open><summary>output</summary>{_messages(step.outputs)}</details></div>')
    explanation = report["explanation"]
    repair = report["repair"]
    state = {"valid": "Valid", "invalid": "Not a fix", "undecided": "Undecided"}
    repair_html = "<p>No repair was searched (use --repair).</p>" if repair is None else (
        f'<p class="{"ok" if repair["valid"] else "bad"}">'
        f'{state.get(repair.get("verdict", "valid" if repair["valid"] else "invalid"), "")}: step '
        f'{repair["step_index"]} → failure rate {100 * repair["fail_rate"]:.0f}% '
        f'[{100 * repair["ci_low"]:.0f}%, {100 * repair["ci_high"]:.0f}%] over {repair["rollouts"]} rollouts, '
        f'drift {repair["drift"]:.2f}</p>{_messages(repair["output"])}')
    culprit = report["culprit"]
    if culprit:
        headline = (f"Culprit: step {culprit['index']} ({_e(culprit['name'])}), effect {culprit['estimate']:+.2f} "
                    f"[{culprit['ci_low']:+.2f}, {culprit['ci_high']:+.2f}]")
    elif report.get("candidates"):
        headline = "Undecided between steps " + ", ".join(str(i) for i in report["candidates"])
    else:
        headline = f"Verdict: {_e(report['verdict'])}"
    level = f"{100 * (1 - report.get('alpha', 0.05)):.0f}%"
    charts = ""
    if report["steps"]:
        charts += (f"<section><h2>Effect of each step ({level} interval)</h2>"
                   f"{interval_chart(report['steps'], report.get('epsilon'))}"
                   f"<p class=\"kind\">effect = P(fail | step held) − P(fail | step re-decided); intervals hold "
                   f"simultaneously over the {report.get('tests', len(report['steps']))} step(s) the search could test; "
                   f"shaded: ±{report.get('epsilon', 0.1):g}, no effect</p></section>")
    if report.get("shapley"):
        shapley = [{**v, "estimate": v["value"], "name": v.get("name", "")} for v in report["shapley"]]
        charts += (f"<section><h2>Shapley values ({level} interval)</h2>"
                   f"{interval_chart(sorted(shapley, key=lambda v: v['index']), report.get('epsilon'))}"
                   f"<table><tr><th>#</th><th>value</th><th>interval</th><th>pairs</th><th>verdict</th></tr>"
                   + "".join(f"<tr><td>{v['index']}</td><td>{v['value']:+.2f}</td><td>[{v['ci_low']:+.2f}, "
                             f"{v['ci_high']:+.2f}]</td><td>{v['samples']}</td><td>{_e(v['verdict'])}</td></tr>"
                             for v in sorted(shapley, key=lambda v: v["index"]))
                   + "</table></section>")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>otel-replay · {_e(report['trace_id'])}</title>
<style>{CSS}</style></head><body>
<header><h1>{headline}</h1><div class="sub">trace {_e(report['trace_id'])} · job {_e(report['job_id'])} ·
method {_e(report['method'])} · {report['rollouts']} rollouts · {report['policy_calls']} policy calls ·
recorded score {report['recorded_score']:.2f} (threshold {report['threshold']})</div></header>
<main><div><section><h2>Timeline</h2>{''.join(timeline)}</section></div>
<div><section><h2>Explanation</h2><dl>
<dt>What</dt><dd>{_e(explanation['what'])}</dd><dt>Where</dt><dd>{_e(explanation['where'])}</dd>
<dt>Why</dt><dd>{_e(explanation['why'])}</dd><dt>Fix</dt><dd>{_e(explanation['fix'])}</dd>
<dt>Causal trace</dt><dd>{_e(explanation['causal_trace']) or '—'}</dd></dl></section>
{charts}
<section><h2>Repair</h2>{repair_html}</section>
<section><h2>Report data</h2><details><summary>JSON</summary><pre>{_e(json.dumps(report, indent=2, ensure_ascii=False))}</pre></details></section>
</div></main></body></html>
"""
