"""The generated reference pages (docs/reference/): committed as generated, complete, and checkable.

The check must be able to fail: registering a component, changing a description or adding a command
makes the page that shows it stale, and ``python -m tfbuilder.cli.reference --check`` says which.
"""

from __future__ import annotations

import argparse
import re
from typing import Literal

import pytest
from pydantic import Field
from torch import nn

import tfbuilder
from conftest import ROOT
from tfbuilder.cli import commands as cli, reference
from tfbuilder import registry
from tfbuilder.spec.recipe import Recipe
from tfbuilder.spec.sections import TrainerSection

PAGES = ROOT / "docs" / "reference"


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return reference.pages()


def check(capsys) -> tuple[int, str]:
    """``python -m tfbuilder.cli.reference --check`` on the committed pages: (exit status, stderr)."""
    status = reference.main(["--check", "--out", str(PAGES)])
    return status, capsys.readouterr().err


def test_committed_pages_are_the_generated_ones(generated, capsys):
    for name, text in generated.items():
        committed = (PAGES / name).read_text(encoding="utf-8")
        assert committed == text, f"docs/reference/{name} is stale: run `{reference.COMMAND}`"
    assert check(capsys) == (0, "")


def test_pages_are_deterministic_and_say_they_are_generated(generated):
    assert reference.pages() == generated
    for name, text in generated.items():
        assert text.startswith("<!-- Generated ") and reference.COMMAND in text.splitlines()[0], name
        assert not re.search(r"0x[0-9a-f]{6,}", text), f"{name} shows a memory address"
        assert str(ROOT) not in text, f"{name} shows an absolute path"


def test_every_component_type_is_documented(generated):
    page = generated["components.md"]
    for family in registry.FAMILIES:
        assert f"## {family} " in page
        for entry in registry.entries(family):
            assert f"### {family}: {entry.name} " in page
            for param in entry.params.model_fields:
                assert param == "type" or f"| `{param}` |" in page


def test_every_command_and_option_is_documented(generated):
    page = generated["cli.md"]
    for name, _, sub in reference._subcommands(cli.parser()):
        assert f"## tfbuilder {name} " in page
        for action in sub._actions:
            for flag in action.option_strings:
                assert flag in ("-h", "--help") or f"`{flag}`" in page, f"{name} {flag}"


def test_every_recipe_key_is_documented(generated):
    page = generated["recipe.md"]
    for path, section in reference.sections(Recipe):
        assert f"{{ #{reference.anchor(path)} }}" in page
        for key in section.model_fields:
            assert f"| `{key}` |" in page


def test_a_new_component_makes_the_components_page_stale(capsys):
    @tfbuilder.register("norm", "reference_test_norm")
    class ReferenceTestNorm(nn.Module):
        """A test-only norm (Nobody 2024)."""

        class Params(tfbuilder.ComponentParams):
            type: Literal["reference_test_norm"] = "reference_test_norm"
            eps: float = Field(1e-6, gt=0, description="added for stability")

        def __init__(self, params, ctx):
            super().__init__()

        def forward(self, x):
            return x

    try:
        status, err = check(capsys)
        assert "### norm: reference_test_norm " in reference.components_page()
    finally:
        registry.unregister("norm", "reference_test_norm")
    assert status == 1
    assert "components.md" in err and "recipe.md" not in err and "cli.md" not in err
    assert check(capsys) == (0, "")  # unregistered: current again


def test_a_changed_description_makes_the_recipe_page_stale(capsys, monkeypatch):
    monkeypatch.setattr(TrainerSection.model_fields["seed"], "description", "a changed description")
    status, err = check(capsys)
    assert status == 1 and "recipe.md" in err and "components.md" not in err


def test_a_new_command_makes_the_cli_page_stale(capsys, monkeypatch):
    original = cli.parser

    def with_another_command() -> argparse.ArgumentParser:
        p = original()
        subparsers = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        subparsers.add_parser("reference-test", help="a test-only command")
        return p

    monkeypatch.setattr(cli, "parser", with_another_command)
    status, err = check(capsys)
    assert status == 1 and "cli.md" in err and "recipe.md" not in err


def test_missing_pages_are_stale_and_writing_makes_them_current(tmp_path, capsys):
    out = tmp_path / "reference"
    assert reference.main(["--check", "--out", str(out)]) == 1
    assert "cli.md" in capsys.readouterr().err
    assert reference.main(["--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["cli.md", "components.md", "packages.md", "recipe.md"]
    assert reference.main(["--check", "--out", str(out)]) == 0


def test_the_package_map_follows_the_layers_contract(tmp_path):
    """The package map's sections are the contract's layers, in its order: a layer added to (or moved
    in) pyproject.toml changes the page."""
    from tfbuilder.cli import package_map

    layers = package_map.layers()
    page = package_map.page("")
    headings = [line for line in page.splitlines() if line.startswith("## ")]
    assert len(headings) == len(layers) and all(f"`{layer[0]}`" in h for h, layer in zip(headings, layers, strict=True))
    moved = tmp_path / "pyproject.toml"
    text = package_map.PYPROJECT.read_text(encoding="utf-8")
    moved.write_text(text.replace('"tfbuilder.cli",\n    "tfbuilder.interop",', '"tfbuilder.interop",\n    "tfbuilder.cli",'))
    assert package_map.layers(moved)[:2] == [["tfbuilder.interop"], ["tfbuilder.cli"]]
