"""Options shared by the commands that store content (`import`, `collect`, `attribute`): redaction and payloads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from otel_replay.normalize.redact import BUILTINS, RedactionConfigError, Redactor
from otel_replay.normalize.step import STEP_KINDS

F = TypeVar("F", bound=Callable[..., Any])


def redaction_options(fn: F) -> F:
    """Add --redact-rules and --no-redact; the command gets `redact_rules` and `no_redact`."""
    fn = click.option("--no-redact", is_flag=True,
                      help="Store content as it came: turn off the built-in detectors (on by default).")(fn)
    fn = click.option("--redact-rules", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
                      help="YAML or JSON redaction rules: patterns, attribute names, functions, built-ins to "
                           f"disable. Built-ins on by default: {', '.join(BUILTINS)}.")(fn)
    return fn


def privacy_options(fn: F) -> F:
    """Add --redact-rules, --no-redact and --payloads; the command gets `privacy=(redact, capture_payloads)`."""
    fn = click.option("--payloads", "payloads", default="all", show_default=True, metavar="all|none|KIND,...",
                      help=f"Step kinds whose payloads (messages, tool arguments and results) are stored: all, "
                           f"none, or a list of {', '.join(STEP_KINDS)}. Other steps are stored observation-only.",
                      )(fn)
    return redaction_options(fn)


def parse_payloads(value: str) -> bool | dict[str, bool]:
    """`all`, `none` or `llm,tool` as the `capture_payloads` argument."""
    if value == "all":
        return True
    if value == "none":
        return False
    kinds = {k.strip() for k in value.split(",") if k.strip()}
    unknown = kinds - set(STEP_KINDS)
    if unknown or not kinds:
        raise click.BadParameter(f"{value!r}: use all, none, or step kinds among {', '.join(STEP_KINDS)}",
                                 param_hint="--payloads")
    return {kind: kind in kinds for kind in STEP_KINDS}


def redactor_from(redact_rules: Path | None, no_redact: bool) -> Redactor | bool:
    """The `redact` argument the options ask for; bad rules are a usage error."""
    if redact_rules is not None and no_redact:
        raise click.UsageError("give --redact-rules or --no-redact, not both")
    if redact_rules is None:
        return not no_redact
    try:
        return Redactor.from_file(redact_rules)
    except RedactionConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--redact-rules") from None


def privacy_from(redact_rules: Path | None, no_redact: bool, payloads: str) -> tuple[Redactor | bool, bool | dict[str, bool]]:
    """The `redact` and `capture_payloads` arguments the options ask for; bad rules are a usage error."""
    return redactor_from(redact_rules, no_redact), parse_payloads(payloads)
