"""The package map of the documentation, drawn from the import-linter layers contract.

``pyproject.toml``'s ``[tool.importlinter]`` layers contract is the one source of truth for how the
package is layered: ``lint-imports`` holds the code to it, and this page is made from it, top layer
first, each module with the first paragraph of its docstring. :mod:`tfbuilder.cli.reference` writes it
beside the other generated pages (``docs/reference/packages.md``) and ``--check`` fails while it is
stale.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

from tfbuilder.cli.markdown import first_paragraph, prose

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PACKAGE = Path(__file__).resolve().parent.parent  # tfbuilder/
PYPROJECT = PACKAGE.parent / "pyproject.toml"


def layers(pyproject: Path = PYPROJECT) -> list[list[str]]:
    """The layers contract's layers, top first, each a list of dotted module names."""
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    contract = next(c for c in contracts if c["type"] == "layers")
    return [[name.strip() for name in layer.replace(":", "|").split("|")] for layer in contract["layers"]]


def _summary(path: Path) -> str:
    """The first paragraph of a module's docstring, as Markdown on one line ("" if it has none)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    return prose(first_paragraph(doc)).replace("|", "\\|")


def _source(dotted: str) -> Path:
    """The file of a dotted module name: a package's ``__init__.py`` or a module's ``.py``."""
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _modules(dotted: str) -> Iterator[tuple[str, str]]:
    """``(name, summary)`` of a layer's module, and of each module in it if it is a package."""
    source = _source(dotted)
    yield dotted, _summary(source)
    if source.name == "__init__.py":
        for path in sorted(source.parent.rglob("*.py")):
            if path.name != "__init__.py" or path.parent != source.parent:
                parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
                name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
                yield name, _summary(path)


def page(header: str) -> str:
    """The markdown page: a table per layer, top layer first."""
    out = [
        header,
        "# Package map\n\n",
        "The layers of `tfbuilder`, top first, as the import-linter contract in `pyproject.toml` names them. "
        "A module imports only from layers below its own (modules within one layer do not import each "
        "other unless they share a package); `lint-imports` checks it, and `tests/test_layers.py` finds "
        "no import cycle. How a recipe goes through them: [Architecture](../architecture.md).\n",
    ]
    for number, layer in enumerate(layers(), start=1):
        out.append(
            f"\n## {number}. {' · '.join(f'`{name}`' for name in layer)}\n\n| module | what it is |\n|---|---|\n"
        )
        for dotted in layer:
            for name, summary in _modules(dotted):
                out.append(f"| `{name}` | {summary} |\n")
    return "".join(out)
