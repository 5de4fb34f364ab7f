"""The documentation site (mkdocs.yml, docs/) covers the code and cannot drift from it.

- the CLI reference renders every command of `otel-replay` (the click group walked through
  `list_commands`/`get_command`; tests/test_cli.py checks that the guides name each one too);
- every name in `otel_replay.__all__` has a reference entry that resolves to that very object;
- the store schema and attribute registry pages are generated from `schemas/` by docs/hooks.py;
- each benchmark page carries the format stamp of the code that prints its table (docs/bench_format.py);
- the README stays a front door: short, its links resolve, its set-up commands are those CI runs.

The tests that build the site need the `docs` extra (`pip install -e '.[docs]'`); CI runs this file
again after installing it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import click
import pytest

import otel_replay
from otel_replay.cli import main as cli
from tests.helpers import REPO

DOCS = REPO / "docs"


def _docs_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"otel_replay_docs_{name}", DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def command_paths(group: click.Group = cli, prefix: str = "") -> list[tuple[str, click.Command]]:
    out = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the top group loads its commands lazily
        command = group.get_command(ctx, name)
        out.append((prefix + name, command))
        if isinstance(command, click.Group):
            out += command_paths(command, prefix + name + " ")
    return out


COMMANDS = command_paths()
PUBLIC = [name for name in otel_replay.__all__ if not name.startswith("__")]
BENCH = _docs_module("bench_format")


def _directives(page: str) -> list[str]:
    return re.findall(r"^::: (\S+)$", (DOCS / page).read_text(encoding="utf-8"), re.MULTILINE)


# --- the command line ----------------------------------------------------------------------------
def test_the_cli_reference_is_generated_from_the_click_group():
    text = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    block = re.search(r"^::: mkdocs-click\n((?:    :\w+: .*\n)+)", text, re.MULTILINE)
    assert block, "reference/cli.md must render the CLI with a `::: mkdocs-click` block"
    options = dict(re.findall(r":(\w+): (.*)", block.group(1)))
    module = importlib.import_module(options["module"])
    assert getattr(module, options["command"]) is cli
    assert options["prog_name"] == "otel-replay" and int(options["depth"]) >= 0
    assert {"bench capture", "import otlp", "attribute"} <= {name for name, _ in COMMANDS}  # the walk reached them


# --- the Python API ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_has_a_reference_entry_for_that_object(name):
    entries = [path for path in _directives("reference/python.md") if path.rsplit(".", 1)[-1] == name]
    assert entries, f"reference/python.md has no `::: ...{name}` entry for otel_replay.{name}"
    module, _, attribute = entries[0].rpartition(".")
    target = getattr(importlib.import_module(module), attribute, None)
    assert target is getattr(otel_replay, name), f"{entries[0]} is not otel_replay.{name}"


def test_the_version_is_named():
    assert "__version__" in otel_replay.__all__
    assert "otel_replay.__version__" in (DOCS / "reference" / "python.md").read_text(encoding="utf-8")


# --- pages generated from schemas/ -----------------------------------------------------------------
HOOKS = _docs_module("hooks")


def test_the_store_schema_page_lists_every_table_and_column():
    from otel_replay.store.schema import arrow_schemas

    page = (DOCS / "reference" / "store-schema.md").read_text(encoding="utf-8")
    assert "<!-- generated: store-schema -->" in page
    rendered = HOOKS.render(page)
    tables = {t["name"]: [c["name"] for c in t["columns"]] for t in
              HOOKS.store_tables((REPO / "schemas" / "store.sql").read_text(encoding="utf-8"))}
    assert tables == {name: schema.names for name, schema in arrow_schemas().items()}  # read as the code reads it
    for table, columns in tables.items():
        section = rendered.split(f"## `{table}`", 1)[1].split("\n## ", 1)[0]
        assert all(f"| `{column}` |" in section for column in columns), table


def test_the_attribute_registry_page_lists_every_attribute():
    page = (DOCS / "reference" / "attributes.md").read_text(encoding="utf-8")
    assert "<!-- generated: attribute-registry -->" in page
    rendered = HOOKS.render(page)
    declared = [a for group in HOOKS.registry_groups() for a in group["attributes"]]
    assert len(declared) > 20
    for attribute in declared:
        assert f"| `{attribute['id']}` | {attribute['type']} |" in rendered, attribute["id"]


def test_an_unknown_generated_section_is_an_error():
    with pytest.raises(ValueError, match="unknown generated section 'stores'"):
        HOOKS.render("<!-- generated: stores -->")


# --- benchmark pages -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(BENCH.benchmarks()))
def test_each_benchmark_page_shows_a_table_printed_by_the_current_bench_code(name):
    page = DOCS / "benchmarks" / f"{name}.md"
    assert page.exists(), f"no page for `otel-replay bench {name}`"
    text = page.read_text(encoding="utf-8")
    assert f"otel-replay bench {name}" in text, "the page says how to rerun it"
    assert re.search(r"(?im)^(- )?machine: |CPython 3\.\d+", text), "the page names the machine"
    stamps = re.findall(rf"Table format `{re.escape(name)}:([0-9a-f]{{12}})`", text)
    assert stamps, f"docs/benchmarks/{name}.md has no table format stamp"
    current = BENCH.stamp(name)
    assert set(stamps) == {current}, (
        f"the table on docs/benchmarks/{name}.md was printed by another version of the bench's table code "
        f"({stamps} != {current}): rerun `otel-replay bench {name}`, paste its table and its stamp line "
        f"(`python docs/bench_format.py {name}`)")


def test_the_stamp_follows_the_table_code_and_nothing_else():
    module, function = BENCH.benchmarks()["replay"]
    source = (REPO / "benchmarks" / f"{module}.py").read_text(encoding="utf-8")

    def read(changed: str):
        return lambda path: changed if path == f"benchmarks/{module}.py" else (REPO / path).read_text()

    assert BENCH.stamp("replay", read(source)) == BENCH.stamp("replay")
    commented = source.replace(f"def {function}(", f"# a comment\ndef {function}(", 1)
    assert BENCH.stamp("replay", read(commented)) == BENCH.stamp("replay")  # layout and comments do not count
    header = source.replace("otel-replay µs/step", "otel-replay ns/step", 1)
    assert header != source and BENCH.stamp("replay", read(header)) != BENCH.stamp("replay")
    sizes = source.replace("QUICK = Sizes(rounds=12", "QUICK = Sizes(rounds=13", 1)
    assert sizes != source and BENCH.stamp("replay", read(sizes)) == BENCH.stamp("replay")  # what it measures: not


# --- the README ----------------------------------------------------------------------------------
def test_the_readme_is_a_front_door():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    for target in re.findall(r"\]\((?!https?://|#)([^)\s]+)\)", readme):
        assert (REPO / target.split("#")[0]).exists(), f"README links to {target}, which does not exist"


def test_the_readme_set_up_commands_are_the_ones_ci_runs():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -e '.[demo]' && otel-replay demo" in readme
    assert "pip install -e '.[dev]' && python -m pytest" in readme
    assert "pip install -e '.[dev]'" in ci and "otel-replay demo" in ci and "python -m pytest" in ci
    # the linter, then the type checker, as the README's Development section lists them
    assert "\nruff check .\nmypy " in readme
    assert ci.index("\nruff check .\n") < ci.index("\nmypy\n")


# --- the built site (needs the docs extra) -------------------------------------------------------
@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocs_click")
    pytest.importorskip("mkdocstrings_handlers.python")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _ids(html: Path) -> set[str]:
    return set(re.findall(r'<h[1-6][^>]* id="([^"]+)"', html.read_text(encoding="utf-8")))


def test_the_built_cli_reference_has_every_command(site):
    ids = _ids(site / "reference" / "cli" / "index.html")
    missing = [name for name, _ in COMMANDS if "otel-replay-" + name.replace(" ", "-") not in ids]
    assert not missing, f"the CLI reference does not render: {missing}"


def test_the_built_python_reference_has_every_public_name(site):
    ids = _ids(site / "reference" / "python" / "index.html")
    missing = [name for name in PUBLIC if not any(i == name or i.endswith("." + name) for i in ids)]
    assert not missing, f"the Python reference does not render: {missing}"


def test_the_built_schema_pages_hold_the_generated_tables(site):
    schema = (site / "reference" / "store-schema" / "index.html").read_text(encoding="utf-8")
    attributes = (site / "reference" / "attributes" / "index.html").read_text(encoding="utf-8")
    assert "<!-- generated" not in schema + attributes
    assert "<code>rollout_rows</code>" in schema and "<code>input_hashes</code>" in schema
    assert "<code>otel_replay.blame.culprit</code>" in attributes
