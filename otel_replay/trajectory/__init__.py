"""Trajectory layer: stored rows as ordered steps with dataflow between them."""

from otel_replay.trajectory.model import Edge, Step, Trajectory
from otel_replay.trajectory.store import Store

__all__ = ["Edge", "Step", "Store", "Trajectory"]
