"""Policies for the example support agent: `--policies otel_replay.testing.support_policies`.

Importing starts the simulated model on 127.0.0.1 (for this process) and registers the llm
policy that calls it plus the two real tool functions.
"""

from __future__ import annotations

from otel_replay.testing.server import SimulatedModelServer
from otel_replay.testing.support_agent import register_policies, support_model

server = SimulatedModelServer(support_model()).start()
register_policies(server.base_url)
