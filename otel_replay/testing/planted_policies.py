"""The planted agents' policies as importable specs, for processes that rebuild them by name
(Ray workers, subprocesses): `--policies otel_replay.testing.planted_policies:single-late`.

Each `module:topology` hook registers `planted_registry` for that topology, served by a
`SimulatedModelServer` started in this process (once per topology, left running). The simulated
model answers from a request's content and seed alone, so every process gets the same answers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from otel_replay.testing.planted import TOPOLOGIES, planted_registry, replay_model
from otel_replay.testing.server import SimulatedModelServer

_servers: dict[str, SimulatedModelServer] = {}
_lock = threading.Lock()


def base_url(topology: str) -> str:
    """The replay model of `topology`, served in this process."""
    with _lock:
        if topology not in _servers:
            _servers[topology] = SimulatedModelServer(replay_model(TOPOLOGIES[topology])).start()
        return _servers[topology].base_url


def __getattr__(name: str) -> Callable[[Any], Any]:
    """`planted_policies.<topology>`: a hook taking the registry (module:function policy spec)."""
    if name not in TOPOLOGIES:
        raise AttributeError(f"no planted topology {name!r}; one of {', '.join(TOPOLOGIES)}")

    def register(registry: Any) -> Any:
        return planted_registry(TOPOLOGIES[name], base_url(name), registry)

    return register
