"""The format stamp of each benchmark's table: which version of the printing code made it.

A benchmark page shows the table `otel-replay bench NAME` printed, followed by a line

    Table format `NAME:0123456789ab`: the stamp of the code that printed this table (...).

The stamp is a hash of the code that prints the table: the bench's `format_*_table` function and
every function, class and constant of the `benchmarks` package (the repository's benchmarks/
directory) it reaches (its helpers, the notes under the table, the constants in its headers), read
from the source with `ast`, keyed by module name within that package, so comments, docstrings
and layout do not count and nothing is imported or run. tests/test_docs.py recomputes the stamps:
when the printing code changes, the page's stamp no longer matches and the test names the bench
to rerun. Changes to what a bench measures but not to how it prints are not caught (that would
make every change to the measured code fail the docs until the long benchmarks ran again).

    python docs/bench_format.py            # every bench: name and stamp
    python docs/bench_format.py capture    # one stamp
"""

from __future__ import annotations

import ast
import copy
import hashlib
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "benchmarks"


def benchmarks() -> dict[str, tuple[str, str]]:
    """Bench name -> (module, table function), read from `otel_replay/cli/bench.py`'s BENCHMARKS."""
    tree = ast.parse((REPO / "otel_replay" / "cli" / "bench.py").read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "BENCHMARKS":
            table = ast.literal_eval(ast.Dict(node.value.keys, [ast.Tuple(v.elts[:3], ast.Load())
                                                                for v in node.value.values]))
            return {name: (module, fmt) for name, (module, _run, fmt) in table.items()}
    raise LookupError("otel_replay/cli/bench.py has no BENCHMARKS")


class _Module:
    """One bench module's top-level definitions and the names it imports from other bench modules."""

    def __init__(self, source: str) -> None:
        self.defs: dict[str, ast.AST] = {}
        self.imports: dict[str, tuple[str, str]] = {}
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.defs[node.name] = node
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.defs[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                self.defs[node.target.id] = node.value
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE + "."):
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (node.module[len(PACKAGE) + 1:], alias.name)


def _without_docstrings(node: ast.AST) -> ast.AST:
    node = copy.deepcopy(node)
    for each in ast.walk(node):
        body = getattr(each, "body", None)
        if (isinstance(each, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            each.body = body[1:] or [ast.Pass()]
    return node


def _canonical(node: object) -> str:
    """`node` as text that is the same on every Python this project supports: `ast.dump` is not
    (3.13 leaves out empty fields; 3.12 added `type_params`), so empty fields are left out here
    and positions never counted."""
    if isinstance(node, ast.AST):
        fields = [(name, getattr(node, name, None)) for name in node._fields]
        shown = [f"{name}={_canonical(value)}" for name, value in fields if value is not None and value != []]
        return f"{type(node).__name__}({', '.join(shown)})"
    if isinstance(node, list):
        return f"[{', '.join(_canonical(item) for item in node)}]"
    return repr(node)


def stamp(name: str, read: Callable[[str], str] | None = None) -> str:
    """The 12-hex-digit stamp of bench `name`'s table code; `read(path)` gives a file's text (default:
    this checkout; pass one that reads `git show COMMIT:path` to stamp another version)."""
    read = read or (lambda path: (REPO / path).read_text())
    module, function = benchmarks()[name]
    modules: dict[str, _Module] = {}
    seen: set[tuple[str, str]] = set()
    parts: list[str] = []
    todo = [(module, function)]
    while todo:
        key = todo.pop()
        if key in seen:
            continue
        seen.add(key)
        mod_name, symbol = key
        if mod_name not in modules:
            modules[mod_name] = _Module(read(f"benchmarks/{mod_name}.py"))
        mod = modules[mod_name]
        if symbol in mod.imports:
            todo.append(mod.imports[symbol])
            continue
        node = mod.defs.get(symbol)
        if node is None:
            continue  # a builtin, a parameter, or a name from outside the bench package
        parts.append(f"{mod_name}.{symbol}={_canonical(_without_docstrings(node))}")
        todo += [(mod_name, n.id) for n in ast.walk(node) if isinstance(n, ast.Name)]
    return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()[:12]


def stamp_line(name: str) -> str:
    """The line a bench page carries under its table."""
    return (f"Table format `{name}:{stamp(name)}`: the stamp of the code that printed this table "
            f"(`python docs/bench_format.py {name}` gives the current code's).")


def main(argv: list[str]) -> None:
    names = argv or list(benchmarks())
    for name in names:
        print(f"{name}:{stamp(name)}")


if __name__ == "__main__":
    main(sys.argv[1:])
