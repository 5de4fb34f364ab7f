"""The JSON attribution report: validation against `schemas/attribution-report.schema.json`."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any


@cache
def report_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(
        resources.files("otel_replay").joinpath("schemas/attribution-report.schema.json").read_text())
    return schema


def validate(report: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when the report does not match the schema."""
    import jsonschema

    jsonschema.validate(report, report_schema())


def report_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False)
