"""The public surface held to a golden file: ``tfbuilder.__all__`` (each name present) and the
``--help`` of ``tfbuilder`` and of every command, at a fixed width.

``tests/golden/api_surface.txt`` was first generated from the package as it was before the layer packages
(commit d829d39), so a passing test shows the moves changed no public name, command or flag; each deliberate
change since (a new flag) is a commit of the golden with its reason.
Regenerate it only for a deliberate change: ``python tests/test_api_surface.py > tests/golden/api_surface.txt``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden" / "api_surface.txt"
WIDTH = "100"


def surface() -> str:
    """``tfbuilder.__all__`` sorted, then the top-level help and each command's help."""
    import tfbuilder
    from tfbuilder.cli import commands

    out = ["# tfbuilder.__all__", *sorted(tfbuilder.__all__), ""]
    parser = commands.parser()
    out += ["# tfbuilder --help", parser.format_help()]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sorted(sub.choices.items()):
        out += [f"# tfbuilder {name} --help", command.format_help()]
    return "\n".join(out)


def test_all_names_exist():
    import tfbuilder

    missing = [name for name in tfbuilder.__all__ if not hasattr(tfbuilder, name)]
    assert not missing


def test_entry_point_is_main():
    from tfbuilder.cli import main
    from tfbuilder.cli.commands import main as commands_main

    assert main is commands_main  # [project.scripts] tfbuilder = "tfbuilder.cli:main"


def test_surface_matches_golden(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COLUMNS", WIDTH)  # argparse wraps help text to the terminal's width
    assert surface() == GOLDEN.read_text()


if __name__ == "__main__":
    import os

    os.environ["COLUMNS"] = WIDTH
    sys.stdout.write(surface())
