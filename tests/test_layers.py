"""The import rule of docs/architecture.md, checked by reading the imports of every module in
fbnas/ (at the top and inside functions; imports of other packages, optional or not, are not
looked at): each module imports only from its own floor or the floors below, and no import
cycle exists among fbnas modules (importing `fbnas.a.b` also runs the package `fbnas.a`, so
that counts as an import of it), nor among the packages taken as wholes. The floor table is
the one in docs/architecture.md (the ```floors block), read here, so the picture and the check
cannot drift apart."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fbnas"
DOC = ROOT / "docs" / "architecture.md"


def doc_floors() -> dict[str, int]:
    """Top-level name under fbnas/ (`name` a module, `name/` a package, `__init__` the package
    itself) -> its floor, from the ```floors block of docs/architecture.md."""
    block = re.search(r"^```floors\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)
    assert block, f"{DOC}: no ```floors block"
    floors: dict[str, int] = {}
    for line in block.group(1).splitlines():
        m = re.match(r"\s*(\d+)\s+(.*)$", line)
        if not m:
            continue
        for name in m.group(2).split():
            assert name not in floors, f"{DOC}: {name} is on two floors"
            floors[name] = int(m.group(1))
    return floors


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def unit(module: str, floors: dict[str, int]) -> str:
    """The floor table's name for a module: `pkg/mod` where the table places a package's module
    on a floor of its own (the search/, fit/ packages span floors), else its top-level module or
    package under fbnas (`pkg/` also places the package's `__init__`)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    if len(parts) >= 3 and f"{parts[1]}/{parts[2]}" in floors:
        return f"{parts[1]}/{parts[2]}"
    top = PACKAGE / parts[1]
    return f"{parts[1]}/" if top.is_dir() else parts[1]


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The fbnas modules `module` imports (the modules named, or holding the names imported),
    and the packages that importing them runs first."""
    is_pkg = path.name == "__init__.py"
    here = module.split(".") if is_pkg else module.split(".")[:-1]

    def owner(name: str) -> str:
        while name not in known:
            name = name.rpartition(".")[0]
        return name

    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            named |= {owner(a.name) for a in node.names if a.name.split(".")[0] == "fbnas"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "fbnas":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                named.add(sub if sub in known else owner(base))
    out = set(named)
    for target in named:  # and the packages on the way that `module` is not inside of
        parts = target.split(".")
        out |= {p for p in (".".join(parts[:i]) for i in range(2, len(parts)))
                if not module.startswith(p + ".")}
    return out - {module}


@functools.cache
def _parsed_graph() -> dict[str, frozenset[str]]:
    known = modules()
    return {m: frozenset(imports(m, p, known)) for m, p in known.items()}


def graph() -> dict[str, set[str]]:
    """Module -> the fbnas modules it imports (every module parsed once per process; each call
    a fresh copy, which a test may edit)."""
    return {m: set(i) for m, i in _parsed_graph().items()}


def test_every_module_is_on_one_floor_of_the_doc():
    floors = doc_floors()
    units = {unit(m, floors) for m in modules()}
    assert sorted(units - set(floors)) == [], f"modules missing from {DOC}'s floor table"
    assert sorted(set(floors) - units) == [], f"names in {DOC}'s floor table with no module"


def upward_imports(g: dict[str, set[str]], floors: dict[str, int]) -> list[str]:
    def floor(m: str) -> int:
        return floors[unit(m, floors)]

    return [f"{m} (floor {floor(m)}) imports {t} (floor {floor(t)})"
            for m, targets in sorted(g.items()) for t in sorted(targets) if floor(t) > floor(m)]


def cycles(g: dict[str, set[str]]) -> list[str]:
    """One `a -> b -> ... -> a` line per cycle a depth-first walk meets."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    found: list[str] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        path.append(m)
        for t in sorted(g.get(m, ())):
            if state.get(t) == 1:
                found.append(" -> ".join(path[path.index(t):] + [t]))
            elif t not in state:
                visit(t, path)
        path.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [])
    return found


def test_no_module_imports_from_a_floor_above_its_own():
    assert upward_imports(graph(), doc_floors()) == []


def test_no_import_cycle():
    assert cycles(graph()) == []


def packages(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph of fbnas's top-level names (a package with all its modules, or a module):
    `a -> b` where a module of `a` imports one of `b`. `fbnas/__init__.py` is left out (it
    names the public API, imported lazily from every package)."""
    def top(m: str) -> str | None:
        parts = m.split(".")
        return parts[1] if len(parts) > 1 else None

    out: dict[str, set[str]] = {}
    for m, targets in g.items():
        a = top(m)
        if a is None:
            continue
        out.setdefault(a, set())
        out[a] |= {b for t in targets if (b := top(t)) is not None and b != a}
    return out


def test_no_package_level_cycle():
    """Each package is one concern below or above another, never both: no two top-level
    packages (or modules) import each other, however indirectly."""
    assert cycles(packages(graph())) == []


@pytest.mark.parametrize("source, expect", [
    ("from fbnas.loss import LOSSES\n", {"fbnas.loss"}),
    ("from fbnas.backends import cpu\n", {"fbnas.backends", "fbnas.backends.cpu"}),
    ("def f():\n    import fbnas.latency.table\n", {"fbnas.latency", "fbnas.latency.table"}),
    ("import torch\nfrom fbnas import __version__\n", {"fbnas"}),
    ("from . import common\nfrom .. import train\n", {"fbnas._cli.latency.common",
                                                      "fbnas._cli.train"}),
])
def test_the_reader_sees_top_level_function_level_relative_and_package_imports(
        tmp_path, source, expect):
    f = tmp_path / "m.py"
    f.write_text(source)
    assert imports("fbnas._cli.latency.m", f, modules()) == expect


def test_the_checks_catch_an_upward_import_and_a_cycle():
    g, floors = graph(), doc_floors()
    g["fbnas.errors"] = g["fbnas.errors"] | {"fbnas._cli.train"}
    assert upward_imports(g, floors) == [f"fbnas.errors (floor {floors['errors']}) imports "
                                         f"fbnas._cli.train (floor {floors['_cli/']})"]
    found = cycles(g)
    assert found and all("fbnas.errors -> fbnas._cli.train -> " in c for c in found)


def test_the_package_check_catches_a_cycle_between_packages():
    g = graph()
    g["fbnas.runs.files"] = g["fbnas.runs.files"] | {"fbnas.fit.select"}  # runs <-> fit
    found = cycles(packages(g))
    assert found and any("runs -> fit" in c or "fit -> runs" in c for c in found)
