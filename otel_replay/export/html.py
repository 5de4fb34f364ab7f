"""A self-contained HTML attribution report: no network, no script, works from a file.

The verdict first (the culprit and its repair as a diff, or what it would take to decide), the
trajectory as a conversation (the culprit's step open, the others folded), each step's effect and
interval on one shared axis with a legend, the explanation and the report's data. Every stored
string is escaped, and the page carries a Content-Security-Policy that forbids script, so a missed
escape still cannot run any. `report_fragment` is the same report without the page around it
(for a notebook's `_repr_html_`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from otel_replay.attribution.model import StepBlame
from otel_replay.attribution.result import AttributionResult, Report, as_result
from otel_replay.export.html_conversation import (
    conversation_html,
    diff_html,
    escape,
    folded,
    message_html,
    messages_text,
    preview_text,
    shorten,
)
from otel_replay.trajectory import Step, Trajectory

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
VERDICTS = {  # colour, what the verdict means (README: Verdicts, from intervals)
    "decisive": ("#c62828", "the culprit: its interval is above +ε and every later re-decidable step was decided"),
    "contributing": ("#ef6c00", "its interval is above +ε, but it is not the point of commitment"),
    "locked-in": ("#6d6d6d", "after the culprit, interval inside ±ε: re-deciding it no longer changes the outcome"),
    "no effect": ("#2e7d32", "interval inside ±ε"),
    "protective": ("#00838f", "interval below 0: the recorded decision made failure less likely"),
    "undecided": ("#d4a017", "the interval holds both an effect that counts and one that does not: more rollouts "
                             "could tell"),
    "observation-only": ("#5c6bc0", "its content was not captured, so it cannot be re-decided"),
    "no policy": ("#7e57c2", "no policy is registered that could re-decide it"),
    "unreplayable": ("#8e24aa", "it never produced a scored rollout"),
    "not scored": ("#9e9e9e", "not tested"),
}
COLOURS = {verdict: colour for verdict, (colour, _) in VERDICTS.items()}
CSS = """
.orr{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;color:#1d1d1d;background:#fafafa}
.orr *{box-sizing:border-box}.orr header{background:#1d2733;color:#fff;padding:14px 24px}
.orr header h1{margin:0;font-size:20px}.orr header .sub{opacity:.85;font-size:13px;margin-top:4px}
.orr header a{color:#9ecbff}.orr main{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,2fr);gap:18px;padding:16px 24px}
.orr section{background:#fff;border:1px solid #e3e3e3;border-radius:8px;padding:14px 16px;margin-bottom:16px}
.orr h2{font-size:16px;margin:0 0 8px}.orr h3{font-size:13px;margin:12px 0 4px;color:#444}
.orr .verdict-card{border-width:2px}.orr #culprit{border-color:#c62828}.orr #undecided{border-color:#d4a017;border-style:dashed}
.orr .badge{display:inline-block;color:#fff;border-radius:10px;padding:0 8px;font-size:12px;margin:0 4px;font-weight:600}
.orr .badge.undecided{color:#3d2c00;background:repeating-linear-gradient(135deg,#f5c542 0 6px,#ffe08a 6px 12px)!important;border:1px dashed #8d6e00}
.orr .kind,.orr .muted{color:#666;font-size:12px}.orr .kind{font-family:ui-monospace,monospace}
.orr details.step{border-left:4px solid #ccc;margin:6px 0;background:#fcfcfc;border-radius:4px;padding:4px 10px}
.orr details.step.culprit{box-shadow:0 0 0 2px #c62828 inset;background:#fff}
.orr details.step>summary{cursor:pointer;list-style-position:outside;padding:2px 0}
.orr .preview{color:#555;font-size:12px;margin-left:6px}.orr .meta{color:#666;font-size:12px;margin:2px 0 6px}
.orr .msg{display:grid;grid-template-columns:82px minmax(0,1fr);gap:8px;margin:6px 0;padding:6px 8px;border-radius:6px;background:#f6f6f6}
.orr .msg.user{background:#eef4ff}.orr .msg.assistant{background:#f1f8ee}.orr .msg.tool{background:#fff7e6}.orr .msg.system{background:#f3f0f7}
.orr .role{font-weight:600;font-size:12px;color:#444;text-transform:uppercase;letter-spacing:.03em}
.orr .text,.orr .code{white-space:pre-wrap;word-break:break-word;overflow-wrap:anywhere}
.orr .code{font-family:ui-monospace,monospace;font-size:12px;background:#f4f4f4;padding:6px 8px;border-radius:4px;max-height:360px;overflow:auto}
.orr .call .code,.orr .result .code{display:inline-block;vertical-align:top;max-width:100%}.orr .thought{color:#555;font-style:italic}
.orr details summary{cursor:pointer}.orr details.long>summary,.orr details.context>summary{color:#1a5fb4;font-size:12px}
.orr del{background:#ffd7d5;color:#82071e;text-decoration:line-through}.orr ins{background:#ccffd8;color:#055d20;text-decoration:none}
.orr .error{color:#b71c1c;font-weight:600}.orr .todo{background:#fff8e1;border-left:3px dashed #d4a017;padding:4px 8px;margin:6px 0;font-size:13px}
.orr dl{margin:0}.orr dt{font-weight:600;margin-top:8px}.orr dd{margin:2px 0 0}
.orr table{border-collapse:collapse;width:100%;font-size:13px}.orr td,.orr th{border-bottom:1px solid #eee;padding:4px 6px;text-align:left}
.orr ul.legend{list-style:none;padding:0;margin:8px 0 0;font-size:12px}.orr ul.legend li{margin:3px 0}
.orr .sw{display:inline-block;width:12px;height:12px;border-radius:3px;vertical-align:-2px;margin-right:6px}
.orr .ok{color:#2e7d32}.orr .bad{color:#c62828}.orr svg{max-width:100%;height:auto}
@media (max-width:900px){.orr main{grid-template-columns:1fr}}
"""


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:+.2f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def _interval(estimate: float | None, low: float | None, high: float | None) -> str:
    if low is None:
        return f"effect {_num(estimate)}"
    return f"effect {_num(estimate)} [{_num(low)}, {_num(high)}]"


def _row_interval(row: StepBlame) -> str:
    return _interval(row.estimate, row.ci_low, row.ci_high)


def badge(verdict: str) -> str:
    cls = " undecided" if verdict == "undecided" else ""
    return f'<span class="badge{cls}" style="background:{COLOURS.get(verdict, "#555")}">{escape(verdict)}</span>'


def trace_href(trace_url: str | None, trace_id: str) -> str | None:
    """`trace_url` with `{trace_id}` filled in (appended when absent); None unless http(s)."""
    if not trace_url or urlsplit(trace_url).scheme not in ("http", "https"):
        return None
    tid = quote(str(trace_id), safe="")
    return trace_url.replace("{trace_id}", tid) if "{trace_id}" in trace_url else trace_url + tid


def interval_chart(steps: list[StepBlame], epsilon: float | None = None) -> str:
    """One row per scored step: the estimate and its interval on one shared -1..1 axis, ±epsilon shaded."""
    rows = [s for s in steps if s.estimate is not None]
    width, left = 460, 150
    row_h = 26 if len(rows) <= 24 else 16
    height = row_h * len(rows) + 30

    def x(v: float) -> float:
        return round(left + (max(-1.0, min(1.0, v)) + 1) / 2 * (width - left - 10), 1)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'role="img" aria-label="effect of each step with its interval">']
    if epsilon:
        parts.append(f'<rect x="{x(-epsilon)}" y="0" width="{x(epsilon) - x(-epsilon)}" height="{height - 20}" '
                     f'fill="#e8f5e9"><title>no effect: inside ±{epsilon:g}</title></rect>')
    parts.append(f'<line x1="{x(0)}" y1="0" x2="{x(0)}" y2="{height - 20}" stroke="#999" stroke-dasharray="3,3"/>')
    for tick in (-1, -0.5, 0, 0.5, 1):
        parts.append(f'<text x="{x(tick)}" y="{height - 5}" font-size="10" text-anchor="middle">{tick}</text>')
    for n, s in enumerate(rows):
        y = n * row_h + row_h // 2 + 1
        estimate = s.estimate or 0.0  # scored: never None
        colour, open_ = COLOURS.get(s.verdict, "#555"), s.verdict == "undecided"
        low = estimate if s.ci_low is None else s.ci_low
        high = estimate if s.ci_high is None else s.ci_high
        label = escape(shorten(f"#{s.index} {s.name}", 24))
        weight = ' font-weight="700"' if s.culprit else ""
        parts.append(f'<text x="4" y="{y + 4}" font-size="11"{weight}>{label}</text>')
        dash = ' stroke-dasharray="5,3"' if open_ else ""
        parts.append(f'<line x1="{x(low)}" y1="{y}" x2="{x(high)}" y2="{y}" stroke="{colour}" stroke-width="3"{dash}/>')
        fill = "#fff" if open_ else colour
        parts.append(f'<circle cx="{x(estimate)}" cy="{y}" r="{5 if row_h > 20 else 4}" fill="{fill}" '
                     f'stroke="{colour}" stroke-width="2"><title>{escape(s.verdict)}: '
                     f'{estimate:+.2f} [{low:+.2f}, {high:+.2f}]</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def legend(verdicts: set[str], epsilon: float | None) -> str:
    """The colours of the verdicts present, each with what it means."""
    items = [f'<li><span class="sw{" badge undecided" if v == "undecided" else ""}" style="background:{colour}">'
             f'</span><b>{escape(v)}</b>: {escape(meaning)}{" (dashed, a hollow dot)" if v == "undecided" else ""}</li>'
             for v, (colour, meaning) in VERDICTS.items() if v in verdicts]
    if epsilon:
        items.append(f'<li><span class="sw" style="background:#e8f5e9;border:1px solid #cfe8d1"></span>'
                     f'shaded band: ±{epsilon:g}, no effect (ε)</li>')
    return f'<ul class="legend">{"".join(items)}</ul>'


def to_decide(row: StepBlame, result: AttributionResult, budget: bool = True) -> str:
    """What it would take to decide an undecided (or untested) step, from the numbers the report carries."""
    eps = result.epsilon
    if row.to_decide:
        more = max(0, row.to_decide - (row.n_held or 0))
        calls = f", about {more * row.calls_per_rollout:,.0f} more policy calls" if row.calls_per_rollout else ""
        text = (f"About {row.to_decide} rollouts per plan would decide it ({more} more than the "
                f"{row.n_held or 0} run{calls}).")
    elif row.ci_low is not None:
        text = (f"Its effect is too close to ±{eps:g} to settle with any practical number of rollouts: "
                f"a wider --epsilon would decide it.")
    else:
        text = "It was not tested, so it has no interval."
    if budget and result.budget_exhausted:
        text += " " + _budget(result)
    return text


def _budget(result: AttributionResult) -> str:
    return (f"The budget of {result.max_policy_calls} policy calls ran out: raise --max-policy-calls and "
            f"continue with --resume {result.job_id}.")


def _ranges(indices: list[int]) -> str:
    """0, 1, 2, 3, 7 -> "0–3, 7"."""
    out: list[tuple[int, int]] = []
    for i in sorted(indices):
        if out and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in out)


def _headline(result: AttributionResult) -> str:
    culprit = result.culprit
    if culprit:
        return (f"Culprit: step {escape(culprit.index)} ({escape(culprit.name)}), "
                f"{_interval(culprit.estimate, culprit.ci_low, culprit.ci_high)}")
    candidates = result.candidates
    if len(candidates) == 1:
        return f"Undecided: step {escape(candidates[0])} could not be decided"
    if candidates:
        return "Undecided between steps " + ", ".join(escape(i) for i in sorted(candidates))
    return f"Verdict: {escape(result.verdict)}"


def _row(result: AttributionResult, index: int) -> StepBlame | None:
    return next((r for r in result.steps if r.index == index), None)


def _repair(result: AttributionResult, trajectory: Trajectory | None) -> str:
    repair = result.repair
    if repair is None:
        return "<h3>Repair</h3><p class=\"muted\">No repair was searched (use --repair).</p>"
    label = {"valid": "A validated fix", "invalid": "Not a fix",
             "undecided": "Undecided whether it fixes"}.get(repair.verdict, "")
    index = repair.step_index
    step = _step(trajectory, index)
    if step is not None:
        before, after = messages_text(step.outputs), messages_text(repair.output)
    else:
        row = _row(result, index)
        before, after = (row.output if row else "") or "", preview_text(repair.output)
    return (f'<h3>Repair: step {escape(index)}\'s output replaced</h3>'
            f'<p class="{"ok" if repair.valid else "bad"}"><b>{label}</b>: the run then fails '
            f'{_pct(repair.fail_rate)} [{_pct(repair.ci_low)}, {_pct(repair.ci_high)}] over '
            f'{escape(repair.rollouts)} rollouts, drift {repair.drift:.2f}.</p>'
            f'<div class="muted">recorded → repair (<del>removed</del> <ins>added</ins>)</div>{diff_html(before, after)}'
            f'<details class="context"><summary>the repaired output as messages</summary>'
            f'{conversation_html(repair.output)}</details>')


def _step(trajectory: Trajectory | None, index: Any) -> Step | None:
    if trajectory is None or not isinstance(index, int) or not 0 <= index < len(trajectory.steps):
        return None
    return trajectory.steps[index]


def _verdict_card(result: AttributionResult, trajectory: Trajectory | None) -> str:
    explanation, culprit = result.explanation, result.culprit
    if culprit:
        step, verb = _step(trajectory, culprit.index), "succeeds" if result.credit else "fails"
        row = _row(result, culprit.index)  # None: a Shapley-only culprit
        pairs = f", over {escape(row.n_held)} paired rollouts" if row and row.n_held else ""
        if step is not None:
            seen = [message_html(step.inputs[-1])] if step.inputs else []
            output = (f'<h3>What it saw last</h3>{"".join(seen)}' if seen else "") + \
                f"<h3>What it decided</h3>{conversation_html(step.outputs)}"
        else:
            output = f'<h3>What it decided</h3><div class="code">{escape((row.output if row else "") or "")}</div>'
        level = f"{100 * (1 - result.alpha):.0f}%"
        interval = ("" if culprit.ci_low is None else
                    f", {level} interval [{_num(culprit.ci_low)}, {_num(culprit.ci_high)}]")
        return (f'<section id="culprit" class="verdict-card"><h2>Culprit: step {escape(culprit.index)} · '
                f'<span class="kind">{escape(culprit.kind)}</span> {escape(culprit.name)}{badge("decisive")}</h2>'
                f'<p>With the steps up to {escape(culprit.index)} as recorded, the run {verb} '
                f'{_pct(culprit.fail_held)} of the time; re-deciding step {escape(culprit.index)} brings that '
                f'to {_pct(culprit.fail_resampled)}: effect {_num(culprit.estimate)}{interval}{pairs}. '
                f'<a href="#step-{escape(culprit.index)}">In the timeline ↓</a></p>'
                f'{output}{_repair(result, trajectory)}</section>')
    if result.verdict in ("undecided", "partial"):
        rows = {r.index: r for r in result.steps}
        items = "".join(f'<li><b>step {escape(i)}</b> <span class="kind">{escape(rows[i].kind)}</span> '
                        f'{escape(rows[i].name)}{badge(rows[i].verdict)} {_row_interval(rows[i])}. '
                        f'{escape(to_decide(rows[i], result, budget=False))}</li>'
                        for i in sorted(result.candidates) if i in rows)
        untested = [i for i in result.untested if isinstance(i, int)]
        parts = [f"<ul>{items}</ul>" if items else f'<p>{escape(explanation["where"])}</p>']
        if untested:
            parts.append(f"<p>Not tested: step{'s' if len(untested) > 1 else ''} {_ranges(untested)}.</p>")
        if result.budget_exhausted:
            parts.append(f"<p>{escape(_budget(result))}</p>")
        return (f'<section id="undecided" class="verdict-card"><h2>{_headline(result)}{badge("undecided")}</h2>'
                f'{"".join(parts)}<p><b>To decide:</b> {escape(explanation["fix"])}</p></section>')
    return (f'<section id="verdict" class="verdict-card"><h2>{_headline(result)}</h2><p>{escape(explanation["where"])}'
            f'</p><p><b>Next:</b> {escape(explanation["fix"])}</p>{_repair(result, trajectory)}</section>')


def _step_body(step: Step, seen: set[str]) -> str:
    """A step's messages: the inputs the conversation has not shown yet, the rest folded, then its output."""
    def key(m: Mapping[str, Any]) -> str:
        return json.dumps(m, sort_keys=True, default=str)

    inputs = ([{"role": "system", "parts": list(step.system)}] if step.system else []) + list(step.inputs)
    new = inputs if step.kind == "tool" else [m for m in inputs if key(m) not in seen]
    seen.update(key(m) for m in (*inputs, *step.outputs))
    meta = " · ".join(escape(x) for x in (f"span {step.span_id}", step.agent and f"agent {step.agent}", step.model,
                                          f"status {step.status}", step.duration_ms is not None
                                          and f"{step.duration_ms:.0f} ms") if x)
    parts = [f'<div class="meta">{meta}</div>']
    if len(new) < len(inputs):
        parts.append(f'<details class="context"><summary>all {len(inputs)} input messages (the conversation so far)'
                     f'</summary>{conversation_html(inputs)}</details>')
    parts.append(conversation_html(new) + conversation_html(step.outputs))
    if step.observation_only:
        parts.append('<div class="muted">content not captured (observation-only)</div>')
    if step.status == "error":
        parts.append(f'<div class="error">✗ {escape(step.error_type or "error")}: {escape(step.error_message or "")}</div>')
    return "".join(parts)


def _timeline(result: AttributionResult, trajectory: Trajectory | None) -> str:
    rows = {r.index: r for r in result.steps}
    seen: set[str] = set()
    out = []
    steps: list[Step] = list(trajectory.steps) if trajectory is not None else []
    indices = [s.position for s in steps] if steps else sorted(rows)
    for n, index in enumerate(indices):
        row = rows.get(index) or StepBlame(index=index, span_id="", name="", kind="")  # not scored
        step = steps[n] if steps else None
        name, kind = (step.name, step.kind) if step is not None else (row.name, row.kind)
        if step is not None:
            body, preview = _step_body(step, seen), messages_text(step.outputs)
        else:
            preview = row.output or ""
            body = f'<div class="code">{escape(preview)}</div>'
        verdict = row.verdict
        todo = (f'<div class="todo">{escape(to_decide(row, result))}</div>'
                if verdict == "undecided" or index in result.untested else "")
        culprit = row.culprit
        effect = f' <span class="muted">{_row_interval(row)}</span>' if row.estimate is not None else ""
        out.append(f'<details class="step{" culprit" if culprit else ""}" id="step-{escape(index)}"'
                   f'{" open" if culprit else ""} style="border-left-color:{COLOURS.get(verdict, "#555")}">'
                   f'<summary><b>#{escape(index)}</b> <span class="kind">{escape(kind)}</span> {escape(name)}'
                   f'{badge(verdict)}{effect}<span class="preview">{escape(shorten(preview, 90))}</span></summary>'
                   f'{todo}{body}</details>')
    return "".join(out)


def _charts(result: AttributionResult) -> str:
    level, eps = f"{100 * (1 - result.alpha):.0f}%", result.epsilon
    out = ""
    if result.steps:
        verdicts: set[str] = {s.verdict for s in result.steps}
        out += (f"<section><h2>Effect of each step ({level} interval)</h2>{interval_chart(result.steps, eps)}"
                f"{legend(verdicts, eps)}<p class=\"muted\">effect = P(fail | step held) − P(fail | step re-decided); "
                f"intervals hold simultaneously over the {escape(result.tests)} step(s) "
                f"the search could test.</p></section>")
    if result.shapley:
        names = {s.index: s.name for s in result.steps}
        shapley = sorted(result.shapley, key=lambda v: v.index)
        chart = [StepBlame(index=v.index, span_id=v.span_id or "", name=v.name or names.get(v.index, ""),
                           kind=v.kind or "", estimate=v.value, ci_low=v.ci_low, ci_high=v.ci_high,
                           verdict=v.verdict, culprit=v.culprit, rank=v.rank) for v in shapley]
        out += (f"<section><h2>Shapley values ({level} interval)</h2>{interval_chart(chart, eps)}"
                f"{legend({v.verdict for v in shapley}, eps)}"
                "<table><tr><th>#</th><th>value</th><th>interval</th><th>pairs</th><th>verdict</th></tr>"
                + "".join(f"<tr><td>{escape(v.index)}</td><td>{v.value:+.2f}</td><td>[{v.ci_low:+.2f}, "
                          f"{v.ci_high:+.2f}]</td><td>{escape(v.samples)}</td><td>{badge(v.verdict)}</td></tr>"
                          for v in shapley) + "</table></section>")
    return out


def report_fragment(report: Report, trajectory: Trajectory | None = None, trace_url: str | None = None) -> str:
    """The report (a result, or its report document) as an HTML fragment (no <html> around it;
    styles scoped to `.orr`).

    Without `trajectory`, each step shows the one-line output the report stores instead of its
    messages. `trace_url` (`http://tempo/.../{trace_id}`) adds a link to the trace.
    """
    result = as_result(report)
    href = trace_href(trace_url, result.trace_id)
    link = (f' · <a href="{escape(href)}" target="_blank" rel="noopener noreferrer">open the trace ↗</a>'
            if href else "")
    explanation = result.explanation
    return f"""<div class="orr"><style>{CSS}</style>
<header><h1>{_headline(result)}</h1><div class="sub">trace {escape(result.trace_id)}{link} ·
job {escape(result.job_id)} · method {escape(result.method)} · {escape(result.rollouts)} rollouts ·
{escape(result.policy_calls)} policy calls · recorded score {result.recorded_score:.2f}
(threshold {escape(result.threshold)})</div></header>
<main><div>{_verdict_card(result, trajectory)}<section><h2>Timeline</h2>{_timeline(result, trajectory)}</section></div>
<div><section><h2>Explanation</h2><dl>
<dt>What</dt><dd>{escape(explanation['what'])}</dd><dt>Where</dt><dd>{escape(explanation['where'])}</dd>
<dt>Why</dt><dd>{escape(explanation['why'])}</dd><dt>Fix</dt><dd>{escape(explanation['fix'])}</dd>
<dt>Causal trace</dt><dd>{folded(explanation.get('causal_trace') or '—')}</dd></dl></section>
{_charts(result)}
<section><h2>Report data</h2><details><summary>JSON</summary><div class="code">{escape(result.to_json())}</div></details></section>
</div></main></div>"""


def render_html(report: Report, trajectory: Trajectory | None = None, trace_url: str | None = None) -> str:
    """The result, or its report document (`AttributionResult.report()`, or as stored), as one HTML page."""
    result = as_result(report)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="referrer" content="no-referrer"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>otel-replay · {escape(result.trace_id)}</title>
<style>body{{margin:0;background:#fafafa}}</style></head><body>
{report_fragment(result, trajectory, trace_url)}
</body></html>
"""


render_report = render_html
