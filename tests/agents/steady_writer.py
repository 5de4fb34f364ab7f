"""Write N GenAI spans into a store at a steady pace from one process, then print their ids.

    python -m tests.agents.steady_writer STORE N TAG [PAUSE_S [FLUSH_INTERVAL_S]]

Each span is its own trace; the processor flushes often, so the process leaves many small
segments. The last stdout line is a JSON list of "trace_id:span_id" for every span it ended.
"""

from __future__ import annotations

import json
import sys
import time

from otel_replay import ReplayProcessor
from tests.helpers import chat_attributes, provider_with


def main() -> None:
    store, count, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    pause = float(sys.argv[4]) if len(sys.argv) > 4 else 0.01
    interval = float(sys.argv[5]) if len(sys.argv) > 5 else 0.03
    processor = ReplayProcessor(store, flush_interval_s=interval, flush_rows=25)
    provider = provider_with(processor, service=f"writer-{tag}")
    tracer = provider.get_tracer("steady")
    ids = []
    for i in range(count):
        with tracer.start_as_current_span("chat m", attributes=chat_attributes(f"{tag} q {i}", f"{tag} a {i}")) as span:
            context = span.get_span_context()
            ids.append(f"{context.trace_id:032x}:{context.span_id:016x}")
        time.sleep(pause)
    provider.shutdown()
    print(json.dumps(ids))


if __name__ == "__main__":
    main()
