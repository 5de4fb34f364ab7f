"""Attribute a failure in a trace imported from LangSmith: which step gave the wrong answer?

    python examples/import_langsmith.py [--store DIR] [--runs FILE] [--rollouts N]

The trace (`tests/fixtures/langsmith/trace_wrong_answer.runs.json`, a LangGraph ReAct agent
exported with the LangSmith SDK) answers "What's the dollar discount on a $2,340 jacket that is
17% off?". The calculator first rejects "2,340 * 17%", the model retries with "2340 * 0.17", the
tool returns 397.8, and the final answer says "$39.78": wrong, though every run is `success`.

The script imports the export into a store (as `otel-replay import langsmith` does), registers
policies for the agent's steps, and runs an attribution job:

- `calculator`: a real, safe arithmetic evaluator (digits, + - * / and parentheses only; anything
  else fails the way LangGraph's ToolNode reports a tool error back to the model);
- `get_exchange_rate`: a fixed-rate table;
- the llm: a small scripted stand-in for the model, seeded by the rollout's rng: it calls the
  calculator (or the rate tool) as the agent did, and re-decides the final answer from the
  tool's result, correctly most of the time and with the recorded decimal slip 10% of the time.

The verifier passes an answer that contains 397.8 (or $397.80). Expected: the culprit is the
final llm step (step 4), whose re-decided answers are almost always right.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import random
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from otel_replay import Store
from otel_replay.attribution import Job, JobParams
from otel_replay.normalize.sources.files import read
from otel_replay.replay.policies import Registry
from otel_replay.store.ingest import ingest

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "langsmith" / "trace_wrong_answer.runs.json"
SLIP_RATE = 0.1  # how often the stand-in model misplaces the decimal point in its final answer
RATES = {("EUR", "USD"): 1.0842, ("USD", "EUR"): 0.9223, ("GBP", "USD"): 1.2731, ("USD", "GBP"): 0.7855}
ALLOWED = re.compile(r"^[\d\s.+\-*/()]+$")
OPERATORS: dict[type, Any] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                              ast.Div: operator.truediv, ast.USub: operator.neg, ast.UAdd: operator.pos}


# -- tools --------------------------------------------------------------------------------------
def evaluate(expression: str) -> float:
    """Safe arithmetic: numbers, + - * /, unary signs and parentheses; ValueError otherwise."""
    if not ALLOWED.match(expression):
        raise ValueError(f"Unsupported characters in expression: {expression!r}")

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.operand))
        raise ValueError(f"Unsupported expression: {expression!r}")

    try:
        return value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ZeroDivisionError) as exc:
        raise ValueError(f"Cannot evaluate {expression!r}: {exc}") from exc


def calculator(arguments: dict[str, Any], rng: random.Random) -> str:
    """The calculator tool; an error comes back as LangGraph's ToolNode(handle_tool_errors=True) words it."""
    try:
        result = evaluate(str(arguments.get("expression", "")))
    except ValueError as exc:
        return f"Error: {exc!r}\n Please fix your mistakes."
    return repr(round(result, 10))  # 2340 * 0.17 -> "397.8", as the recorded tool printed it


def get_exchange_rate(arguments: dict[str, Any], rng: random.Random) -> str:
    """The rate tool: a fixed table (the recorded run never called it; a re-decided one may)."""
    base, quote = str(arguments.get("base", "")).upper(), str(arguments.get("quote", "")).upper()
    rate = 1.0 if base == quote else RATES.get((base, quote))
    if rate is None:
        return f"Error: ValueError('No rate for {base}/{quote}')\n Please fix your mistakes."
    return json.dumps({"base": base, "quote": quote, "rate": rate, "as_of": "2026-11-30"})


# -- the model stand-in -------------------------------------------------------------------------
def _text(message: dict[str, Any]) -> str:
    return " ".join(str(p.get("content", "")) for p in message.get("parts", []) if p.get("type") == "text")


def _call(name: str, arguments: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    return {"role": "assistant", "parts": [{"type": "tool_call", "id": f"call_{rng.getrandbits(96):024x}",
                                            "name": name, "arguments": arguments}]}


def _money(amount: float) -> str:
    return f"${amount:,.2f}"


def shopping_model(step: Any, inputs: Any, rng: random.Random) -> Any:
    """A scripted stand-in for gpt-4o-mini in the shopping agent: reads the conversation, decides."""
    messages = inputs.messages
    question = " ".join(_text(m) for m in messages if m.get("role") == "user")
    results = [p for m in messages if m.get("role") == "tool" for p in m.get("parts", [])
               if p.get("type") == "tool_call_response"]
    last = str(results[-1].get("response", "")) if results else None
    discount = re.search(r"\$([\d,]+(?:\.\d+)?).*?(\d+(?:\.\d+)?)% off", question)
    convert = re.search(r"([\d.]+)\s*([A-Z]{3}) to ([A-Z]{3})", question)
    if discount:
        price, percent = float(discount.group(1).replace(",", "")), float(discount.group(2))
        if last is None:  # first turn: sometimes the sloppy expression the recorded model wrote
            sloppy = rng.random() < 0.5
            expression = f"{discount.group(1)} * {discount.group(2)}%" if sloppy else f"{price:g} * {percent / 100:g}"
            return _call("calculator", {"expression": expression}, rng)
        if last.startswith("Error"):
            return _call("calculator", {"expression": f"{price:g} * {percent / 100:g}"}, rng)
        amount = float(last)
        if rng.random() < SLIP_RATE:
            amount /= 10  # the recorded mistake: the decimal point one place off
        return f"The discount is {_money(amount)}, so you would pay {_money(price - amount)}."
    if convert:
        value, base, quote = float(convert.group(1)), convert.group(2), convert.group(3)
        if last is None:
            return _call("get_exchange_rate", {"base": base, "quote": quote}, rng)
        if last.startswith("{"):
            rate = json.loads(last)["rate"]
            return _call("calculator", {"expression": f"{value:g} * {rate}"}, rng)
        return f"{value:g} {base} is about {float(last):,.2f} {quote}."
    return "Sorry, I can only help with discounts and currency conversions."


def correct_discount(final_output: str, rollout: Any = None) -> float:
    """The verifier: the answer names the right discount, 397.8 (or $397.80)."""
    return 1.0 if "397.8" in final_output or "$397.80" in final_output else 0.0


def registry() -> Registry:
    """The policies for the imported shopping agent's steps."""
    policies = Registry()
    policies.register("llm", None, shopping_model)
    policies.register("tool", "calculator", calculator)
    policies.register("tool", "get_exchange_rate", get_exchange_rate)
    return policies


# -- the run ------------------------------------------------------------------------------------
def import_runs(store: Path, runs: Path) -> str:
    """Import a LangSmith runs export into `store`; returns the OTel trace id of its trace."""
    batch = read("langsmith", runs)
    store.mkdir(parents=True, exist_ok=True, mode=0o700)
    result = ingest(store, batch.spans, batch.logs, source="import:langsmith", skip_existing=True)
    print(f"imported {runs.name}: {result.spans} spans stored ({result.steps} steps), "
          f"{result.already_stored} already in the store")
    data = json.loads(runs.read_text())
    (trace_uuid,) = {r["trace_id"] for r in data}
    return trace_uuid.replace("-", "")  # LangSmith's trace UUID is the OTel trace id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, help="store directory (default: a fresh temporary directory)")
    parser.add_argument("--runs", type=Path, default=FIXTURE, help=f"the LangSmith export (default {FIXTURE})")
    parser.add_argument("--rollouts", type=int, help="a fixed number of rollouts per plan (default: until decided)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not args.runs.is_file():
        sys.exit(f"Error: the LangSmith export {args.runs} is missing; the recorded one lives in "
                 f"tests/fixtures/langsmith/ of a source checkout (or pass --runs FILE)")
    store_dir: Path = args.store or Path(tempfile.mkdtemp(prefix="otel-replay-langsmith-"))
    trace_id = import_runs(store_dir, args.runs)
    store = Store(store_dir)
    trajectory = store.trajectory(trace_id)
    print(f"trace {trace_id}: {len(trajectory.steps)} steps; final answer: {trajectory.final_output}")

    verifier = f"{__name__}:correct_discount"  # Job imports it by name ("__main__" when run as a script)
    params = JobParams([trace_id], verifier, rollouts=args.rollouts, repair=True, seed=args.seed)
    (result,) = Job(store, params, registry()).run()
    report = result.report()
    culprit = report["culprit"]
    if culprit is None:
        print(f"verdict: {report['verdict']}; no culprit")
    else:
        print(f"culprit: step {culprit['index']} ({culprit['kind']} {culprit['name']}), effect "
              f"{culprit['estimate']:+.2f}, 95% interval [{culprit['ci_low']:+.2f}, {culprit['ci_high']:+.2f}]")
    for key in ("what", "where", "why", "fix"):
        print(f"{key.upper():5} {report['explanation'][key]}")
    print(f"{report['rollouts']} rollouts, {report['policy_calls']} policy calls, job {report['job_id']}; "
          f"store: {store_dir}")


if __name__ == "__main__":
    main()
