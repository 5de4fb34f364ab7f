"""Record a failing run of the example support agent into the store.

    python examples/support_agent.py [--store DIR]

The agent uses the real `openai` SDK against otel-replay's simulated model (on 127.0.0.1), is
traced by the real OpenTelemetry GenAI instrumentation, and is captured by ReplayProcessor. A
fault is planted at step 0 (the model copies the order id wrong), so the customer is refused a
refund they were owed. Then: `otel-replay show <trace id>`.
"""

from __future__ import annotations

import argparse

from otel_replay.store import default_root
from otel_replay.testing.support_agent import record_support_run, refunded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=str(default_root()), help="store directory (default: $OTEL_REPLAY_STORE or ./otel-replay-store)")
    parser.add_argument("--no-fault", action="store_true", help="record a run without the planted fault")
    args = parser.parse_args()
    trace_id, answer = record_support_run(args.store, fault=not args.no_fault)
    print(f"trace {trace_id} recorded into {args.store}")
    print(f"final answer: {answer}")
    print(f"verdict: {'passed' if refunded(answer) else 'FAILED (the customer was owed a refund)'}")
    print(f"next: otel-replay --store {args.store} show {trace_id}")


if __name__ == "__main__":
    main()
