"""Write N small agent traces into a store from one process (for the shared-store test).

    python -m tests.agents.burst STORE_DIR N TAG
"""

from __future__ import annotations

import sys

from otel_replay import ReplayProcessor
from tests.helpers import chat_attributes, provider_with


def main() -> None:
    store, count, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    processor = ReplayProcessor(store, flush_interval_s=0.05)
    provider = provider_with(processor, service=f"burst-{tag}")
    tracer = provider.get_tracer("burst")
    for i in range(count):
        with tracer.start_as_current_span(f"invoke_agent {tag}", attributes={"gen_ai.operation.name": "invoke_agent"}):
            with tracer.start_as_current_span("chat m", attributes=chat_attributes(f"{tag} question {i}", f"answer {i}")):
                pass
    provider.shutdown()


if __name__ == "__main__":
    main()
