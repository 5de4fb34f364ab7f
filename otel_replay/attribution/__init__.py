"""Attribution layer: rollout jobs, estimators with intervals, repair search, aggregation."""

from otel_replay.attribution.job import AttributionError, Job, JobParams
from otel_replay.attribution.model import Culprit, Repair, ShapleyValue, StepBlame
from otel_replay.attribution.result import AttributionResult
from otel_replay.attribution.verifiers import VerifierError

__all__ = ["AttributionError", "AttributionResult", "Culprit", "Job", "JobParams", "Repair", "ShapleyValue", "StepBlame",
           "VerifierError"]
