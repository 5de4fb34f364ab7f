"""Re-records `report_v0.json`: an attribution report as otel-replay wrote it before the verdict
`undecided` existed (verdict `partial`, `adaptive`, no `epsilon`), read by the tests to check that
old reports still load. Run it against that version of the code:

    git worktree add /tmp/v0 dcfb334 && PYTHONPATH=/tmp/v0 python tests/agents/record_report_v0.py > tests/agents/report_v0.json
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from otel_replay import Store
from otel_replay.attribution import Job, JobParams
from otel_replay.testing import SimulatedModelServer
from otel_replay.testing.planted import TOPOLOGIES, planted_registry, record_planted, replay_model

if __name__ == "__main__":
    root, topology = Path(tempfile.mkdtemp()), TOPOLOGIES["single-late"]
    trace_id = record_planted(root, topology)
    with SimulatedModelServer(replay_model(topology)) as server:
        params = JobParams([trace_id], "otel_replay.testing.planted:ok", rollouts=20, max_policy_calls=40,
                           method="both", shapley_permutations=1)
        (result,) = Job(Store(root), params, planted_registry(topology, server.base_url)).run()
    print(json.dumps(result.report(), indent=2))
