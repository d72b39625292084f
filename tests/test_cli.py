"""The CLI verbs: validate, show, components, schema."""

from __future__ import annotations

import json

import jsonschema
import pytest

from conftest import RECIPES, ROOT
from tfbuilder import registry
from tfbuilder.cli.commands import main


def test_validate_all_recipes_ok(capsys, monkeypatch):
    """Every shipped recipe validates, without reading its data (--no-data: most name a folder that is not
    here): recipes/wmt14 names a Hub dataset that validation must never download (nor open from the cache)."""
    import datasets

    from tfbuilder.data import arrow, readers

    def no_loading(*args, **kwargs):
        raise AssertionError("validation read data")

    for module, name in ((datasets, "load_dataset"), (datasets, "load_from_disk"), (arrow, "load_hub"), (readers, "split_sources")):
        monkeypatch.setattr(module, name, no_loading)
    assert main(["validate", "--no-data", *map(str, RECIPES)]) == 0
    assert capsys.readouterr().out.count(": OK") == len(RECIPES)


def test_validate_reports_every_bad_file_and_still_checks_the_good(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  vocab_size: 10\n  d_modle: 3\n")
    assert main(["validate", "--no-data", str(ROOT / "recipes" / "vanilla.yaml"), str(bad)]) == 2
    captured = capsys.readouterr()
    assert "vanilla.yaml: OK" in captured.out
    assert "bad.yaml:3:3: model.d_modle: unknown key 'd_modle'; did you mean 'd_model'?" in captured.err


def test_show_applies_overrides(capsys):
    assert main(["show", str(ROOT / "recipes" / "vanilla.yaml"), "--set", "model.encoder.layers=2"]) == 0
    out = capsys.readouterr().out
    assert "0..1 (x2, each): EncoderLayer" in out
    assert "0..5 (x6, each): DecoderLayer" in out


def test_components_lists_every_registered_type_with_params(capsys):
    assert main(["components"]) == 0
    out = capsys.readouterr().out
    for family in registry.FAMILIES:
        assert f"{family}:" in out
        for entry in registry.entries(family):
            assert f"  {entry.name}  (" in out
            for name, field in entry.params.model_fields.items():
                if name != "type":
                    assert f"{name}: " in out and field.description in out


def test_components_show_whole_first_paragraphs():
    """Each component's description is its docstring's first paragraph, whole: it ends a sentence."""
    for family in registry.FAMILIES:
        for entry in registry.entries(family):
            assert entry.doc.endswith((".", ")")), (entry.family, entry.name, entry.doc)
            first = entry.cls.__doc__.strip().split("\n\n")[0]
            assert entry.doc == " ".join(first.split())


def test_every_option_of_every_command_is_described():
    import argparse

    from tfbuilder.cli.commands import parser

    root = parser()
    commands = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction)).choices
    undescribed = [
        (name, action.option_strings or action.dest)
        for name, command in commands.items()
        for action in command._actions
        if not action.help and not isinstance(action, argparse._HelpAction)
    ]
    assert undescribed == []
    assert len(commands) >= 15


def test_version_names_tfbuilder_torch_and_lightning(capsys):
    import tfbuilder

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"tfbuilder {tfbuilder.__version__} (torch ")
    assert "lightning " in out and "Python " in out


def test_schema_is_valid_json_schema_that_accepts_recipes_and_rejects_typos(tmp_path):
    out = tmp_path / "schema.json"
    assert main(["schema", "--output", str(out)]) == 0
    schema = json.loads(out.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    good = {"model": {"vocab_size": 100, "encoder": {"layers": 2}, "decoder": {"layers": 2}}}
    jsonschema.validate(good, schema)
    for bad in (
        {"model": {"vocab_size": 100, "d_modle": 3}},
        {"model": {"vocab_size": 100, "attention": {"type": "multihed"}}},
        {"model": {"vocab_size": 100, "attention": {"type": "multihead", "hedas": 2}}},
        {"model": {"vocab_size": 100, "dropout": 1.5}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
