"""Blame back into the original trace, as real OpenTelemetry spans.

One `otel_replay.attribution` span under the trace's root span (same trace id), with the
numbers as attributes, an `otel_replay.step_blame` event per step and a link to each scored
step's span; under each scored step's own span a child `otel_replay.blame <step name>` span; the
repair as an event on the culprit's blame span. Spans carry the current time (Tempo indexes by
ingestion time); the span tree ties them to the steps.

Payloads only with `payloads=True`: by default no exported span, event or link carries recorded
or replayed content. The report's explanation quotes outputs (the final answer, the culprit's
output, the repair), so without payloads the exported explanation is rebuilt from the report's
numbers and step names only; the repair's output travels only with payloads.

Each blame span and the attribution span also carry a `gen_ai.evaluation.result` event (the
GenAI semantic conventions' evaluation result: name, score value, score label = the verdict,
explanation), so backends that know the GenAI conventions show the blame as an evaluation.
"""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as _genai
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

from otel_replay._version import __version__
from otel_replay.attribution.model import StepBlame
from otel_replay.attribution.result import Report, as_result

# The package's constants where it has them (opentelemetry-semantic-conventions >= 0.60b0, SDK 1.39);
# the same names spelled out for the older versions this package supports (CI tests the oldest).
GEN_AI_EVALUATION_EXPLANATION: str = getattr(_genai, "GEN_AI_EVALUATION_EXPLANATION", "gen_ai.evaluation.explanation")
GEN_AI_EVALUATION_NAME: str = getattr(_genai, "GEN_AI_EVALUATION_NAME", "gen_ai.evaluation.name")
GEN_AI_EVALUATION_SCORE_LABEL: str = getattr(_genai, "GEN_AI_EVALUATION_SCORE_LABEL", "gen_ai.evaluation.score.label")
GEN_AI_EVALUATION_SCORE_VALUE: str = getattr(_genai, "GEN_AI_EVALUATION_SCORE_VALUE", "gen_ai.evaluation.score.value")

DEFAULT_SERVICE = "otel-replay"
EVALUATION_EVENT = "gen_ai.evaluation.result"  # the GenAI semantic conventions' event (no constant in the package)
STEP_EVALUATION = "otel_replay.blame"
RUN_EVALUATION = "otel_replay.attribution"
SCORED = ("decisive", "contributing", "locked-in", "no effect", "protective", "undecided")


def blamed_steps(report: Report) -> list[StepBlame]:
    """The report's steps as blame sees them: the contrastive steps, or, for a Shapley-only report, the
    Shapley values (their value as the score) that name their step's span."""
    result = as_result(report)
    if result.steps or not result.shapley:
        return result.steps
    return [StepBlame(index=s.index, span_id=s.span_id, name=s.name or "", kind=s.kind or "", estimate=s.value,
                      ci_low=s.ci_low, ci_high=s.ci_high, verdict=s.verdict, culprit=s.culprit, rank=s.rank)
            for s in result.shapley if s.span_id is not None]


def _context(trace_id: str, span_id: str) -> SpanContext:
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _blame(step: StepBlame) -> dict[str, Any]:
    values = {"otel_replay.blame.score": step.estimate, "otel_replay.blame.ci_low": step.ci_low,
              "otel_replay.blame.ci_high": step.ci_high, "otel_replay.blame.verdict": step.verdict,
              "otel_replay.blame.culprit": step.culprit, "otel_replay.blame.rank": step.rank}
    return {k: v for k, v in values.items() if v is not None}


def _step(step: StepBlame) -> dict[str, Any]:
    return {"otel_replay.step.index": step.index, "otel_replay.step.name": step.name,
            "otel_replay.step.span_id": step.span_id}


def evaluation(name: str, label: str, value: float | None, explanation: str) -> dict[str, Any]:
    """A `gen_ai.evaluation.result` event's attributes, as GenAI-aware backends read them."""
    out: dict[str, Any] = {GEN_AI_EVALUATION_NAME: name, GEN_AI_EVALUATION_SCORE_LABEL: label,
                           GEN_AI_EVALUATION_EXPLANATION: explanation}
    if value is not None:
        out[GEN_AI_EVALUATION_SCORE_VALUE] = float(value)
    return out


def step_explanation(step: StepBlame) -> str:
    """One sentence on a (scored) step's blame, from numbers only (no payload)."""
    return (f"Step {step.index} ({step.name}): re-deciding it changes the failure rate by "
            f"{step.estimate:+.2f} (95% interval [{step.ci_low:+.2f}, {step.ci_high:+.2f}]); "
            f"verdict {step.verdict}.")


def explanation_text(report: Report, payloads: bool = False) -> str:
    """The report's explanation as one attribute value; without payloads, nothing a run said or did."""
    result = as_result(report)
    explanation: dict[str, str] = result.explanation
    if not payloads:
        culprit, repair = result.culprit, result.repair
        outcome = "succeeded" if result.credit else "failed"
        explanation = {
            "what": f"The run {outcome} (verifier score {result.recorded_score:.2f}).",
            "where": (f"Step {culprit.index} ({culprit.kind} {culprit.name}"
                      f"{', agent ' + culprit.agent if culprit.agent else ''})." if culprit
                      else explanation.get("where", "")),
            "why": explanation.get("why", ""),
            "fix": (f"A repair of step {repair.step_index} (its output is a payload: export with payloads to "
                    f"include it) fails {100 * repair.fail_rate:.0f}% of {repair.rollouts} rollouts, drift "
                    f"{repair.drift:.2f}." if repair and repair.valid else explanation.get("fix", "")),
            "causal_trace": explanation.get("causal_trace", ""),
        }
    return "\n".join(f"{k.upper()} {v}" for k, v in explanation.items() if v)


def blame_spans(report: Report, root_span_id: str, service_name: str = DEFAULT_SERVICE,
                payloads: bool = False) -> list[ReadableSpan]:
    """The blame spans for one attribution report (a result, or its report document), built by the
    OpenTelemetry SDK.

    :param payloads: include content (the repaired output, the outputs the explanation quotes);
        False, the default, exports numbers, verdicts, step names and span links only.
    """
    result = as_result(report)
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("otel-replay", __version__)
    trace_id = result.trace_id
    steps = blamed_steps(result)
    scored = [s for s in steps if s.verdict in SCORED and s.estimate is not None]
    culprit = result.culprit
    attributes: dict[str, Any] = {
        "otel_replay.attribution.job_id": result.job_id, "otel_replay.attribution.method": result.method,
        "otel_replay.attribution.verdict": result.verdict, "otel_replay.attribution.rollouts": result.rollouts,
        "otel_replay.attribution.policy_calls": result.policy_calls,
        "otel_replay.attribution.recorded_failure_rate": round(1 - result.recorded_score, 6),
        "otel_replay.attribution.threshold": result.threshold,
        "otel_replay.attribution.explanation": explanation_text(result, payloads),
    }
    if result.candidates and not culprit:
        attributes["otel_replay.attribution.candidates"] = list(result.candidates)
    if culprit:
        attributes |= {"otel_replay.attribution.culprit.span_id": culprit.span_id,
                       "otel_replay.attribution.culprit.step_index": culprit.index,
                       "otel_replay.attribution.culprit.name": culprit.name,
                       "otel_replay.attribution.culprit.estimate": culprit.estimate,
                       "otel_replay.attribution.culprit.ci_low": culprit.ci_low,
                       "otel_replay.attribution.culprit.ci_high": culprit.ci_high}
    links = [Link(_context(trace_id, s.span_id), {**_step(s), **_blame(s)}) for s in scored]
    parent = set_span_in_context(NonRecordingSpan(_context(trace_id, root_span_id)))
    with tracer.start_as_current_span("otel_replay.attribution", context=parent, attributes=attributes,
                                      links=links) as span:
        for step in steps:
            span.add_event("otel_replay.step_blame", {**_step(step), **_blame(step)})
        span.add_event(EVALUATION_EVENT, evaluation(RUN_EVALUATION, result.verdict,
                                                    culprit.estimate if culprit else None,
                                                    attributes["otel_replay.attribution.explanation"]))
    repair = result.repair
    for step in scored:
        context = set_span_in_context(NonRecordingSpan(_context(trace_id, step.span_id)))
        with tracer.start_as_current_span(f"otel_replay.blame {step.name}", context=context,
                                          attributes=_blame(step)) as blame:
            blame.add_event(EVALUATION_EVENT, evaluation(STEP_EVALUATION, step.verdict, step.estimate,
                                                         step_explanation(step)))
            if step.culprit and repair:
                event: dict[str, Any] = {"otel_replay.repair.fail_rate": repair.fail_rate, "otel_replay.repair.drift": repair.drift,
                         "otel_replay.repair.valid": repair.valid}
                if payloads:
                    event["otel_replay.repair.output"] = json.dumps(repair.output, ensure_ascii=False)
                blame.add_event("otel_replay.repair", event)
    provider.shutdown()
    return list(memory.get_finished_spans())
