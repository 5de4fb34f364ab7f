"""mkdocs hooks: the reference pages that are read from the repository's declarations at build time.

A page holds a marker line and the build puts the generated text in its place:

    <!-- generated: store-schema -->        every table and column of schemas/store.sql
    <!-- generated: attribute-registry -->  every attribute of schemas/registry.yaml

Nothing is copied by hand, so the pages cannot drift from the files the code and tests read.
tests/test_docs.py calls `render` on the same markers.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)

_CREATE = re.compile(r"CREATE TABLE (\w+) \($")
_COLUMN = re.compile(r"(\w+)\s+([A-Z]+(?:\[\])?)(\s+NOT NULL)?,?\s*(?:--\s*(.*))?")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").strip()


def store_tables(text: str) -> list[dict[str, Any]]:
    """The tables of `schemas/store.sql`: name, the comment above it, and its columns
    (name, type, nullable, comment). Raises ValueError on a line it cannot read."""
    tables: list[dict[str, Any]] = []
    comment: list[str] = []
    current: dict[str, Any] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if current is None:
            if line.startswith("--"):
                comment.append(line[2:].strip())
            elif (found := _CREATE.fullmatch(line)) is not None:
                current = {"name": found.group(1), "about": " ".join(comment), "columns": []}
            elif not line:
                comment = []
            else:
                raise ValueError(f"schemas/store.sql:{number}: cannot read {line!r}")
            continue
        if line == ");":
            tables.append(current)
            current, comment = None, []
            continue
        found = _COLUMN.fullmatch(line)
        if found is None:
            raise ValueError(f"schemas/store.sql:{number}: cannot read column {line!r}")
        name, kind, not_null, about = found.groups()
        current["columns"].append({"name": name, "type": kind, "nullable": not not_null, "about": about or ""})
    if current is not None:
        raise ValueError(f"schemas/store.sql: table {current['name']} is not closed")
    return tables


def render_store_schema() -> str:
    lines: list[str] = []
    for table in store_tables((REPO / "schemas" / "store.sql").read_text(encoding="utf-8")):
        lines += [f"## `{table['name']}`", "", table["about"], "",
                  "| column | type | null | meaning |", "|---|---|---|---|"]
        lines += [f"| `{c['name']}` | {c['type']} | {'yes' if c['nullable'] else 'no'} | {_cell(c['about'])} |"
                  for c in table["columns"]]
        lines.append("")
    return "\n".join(lines)


def registry_groups() -> list[dict[str, Any]]:
    import yaml  # comes with mkdocs

    return yaml.safe_load((REPO / "schemas" / "registry.yaml").read_text(encoding="utf-8"))["groups"]


def render_attribute_registry() -> str:
    lines: list[str] = []
    for group in registry_groups():
        title = group["id"].removeprefix("registry.")
        lines += [f"## {title}", "", " ".join(str(group.get("brief", "")).split()), "",
                  "| attribute | type | meaning | example |", "|---|---|---|---|"]
        for attribute in group["attributes"]:
            examples = attribute.get("examples") or []
            example = f"`{examples[0]}`" if examples else ""
            brief = " ".join(str(attribute.get("brief", "")).split())
            lines.append(f"| `{attribute['id']}` | {attribute['type']} | {_cell(brief)} | {_cell(example)} |")
        lines.append("")
    return "\n".join(lines)


GENERATORS = {"store-schema": render_store_schema, "attribute-registry": render_attribute_registry}


def render(markdown: str) -> str:
    """`markdown` with each marker replaced by its generated text; an unknown marker is an error."""
    def replace(found: re.Match[str]) -> str:
        if found.group(1) not in GENERATORS:
            raise ValueError(f"unknown generated section {found.group(1)!r}: one of {sorted(GENERATORS)}")
        return GENERATORS[found.group(1)]()
    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return render(markdown)
