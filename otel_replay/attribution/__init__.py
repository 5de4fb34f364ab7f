"""Attribution layer: rollout jobs, estimators with intervals, repair search, aggregation."""

from otel_replay.attribution.job import AttributionError, Job, JobParams
from otel_replay.attribution.result import AttributionResult
from otel_replay.attribution.verifiers import VerifierError

__all__ = ["AttributionError", "AttributionResult", "Job", "JobParams", "VerifierError"]
