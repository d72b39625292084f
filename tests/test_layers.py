"""The package's layers (pyproject.toml, [tool.importlinter]): every module in a layer, imports
pointing down only, and not one import cycle, counting imports inside functions and under
``TYPE_CHECKING`` (grimp sees them all; a cycle held together by a deferred import is still a cycle)."""

from __future__ import annotations

import sys
from pathlib import Path

import grimp
import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
TOP = {"tfbuilder", "tfbuilder.__main__"}  # the public API and `python -m tfbuilder`: may import anything


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("tfbuilder", include_external_packages=False)


def layers() -> list[list[str]]:
    """The layers contract's layers, top first, each a list of its sibling packages or modules."""
    contract = next(c for c in CONFIG["contracts"] if c["type"] == "layers")
    return [[name.strip() for name in layer.split("|")] for layer in contract["layers"]]


def layer_of(module: str) -> int | None:
    for index, layer in enumerate(layers()):
        if any(module == name or module.startswith(name + ".") for name in layer):
            return index
    return None


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_a_cycle_is_found_where_there_is_one():
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.c", imported="p.a")
    assert cycles(graph) == [["p.a", "p.b"]]


def test_every_module_belongs_to_a_layer(graph):
    homeless = sorted(m for m in graph.modules if m not in TOP and layer_of(m) is None)
    assert homeless == [], "add these to the layers contract in pyproject.toml"


def test_imports_point_down(graph):
    """What import-linter's layers contract checks, here with the details of each import (also the
    imports of siblings of one layer: those must not import each other either)."""
    wrong = []
    for importer in sorted(graph.modules - TOP):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if imported in TOP:
                wrong.append(f"{importer} imports the top-level {imported}")
                continue
            low, high = layer_of(imported), layer_of(importer)
            top_package = lambda m: ".".join(m.split(".")[:2])  # noqa: E731
            if low < high or (low == high and top_package(importer) != top_package(imported)):
                for detail in graph.get_import_details(importer=importer, imported=imported):
                    wrong.append(f"{importer}:{detail['line_number']}: {detail['line_contents']}")
    assert wrong == []
