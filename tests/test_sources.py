"""Recipe files: extends (deep merge, several levels), overrides, positions."""

from __future__ import annotations

import pytest

import tfbuilder
from conftest import ROOT
from tfbuilder.spec.sources import apply_overrides, load_source, parse_yaml


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_extends_merges_mappings_replaces_lists_and_follows_several_levels(tmp_path):
    write(tmp_path, "a.yaml", "name: a\nmodel: {vocab_size: 10, d_model: 8, attention: {type: multihead, heads: 2}}\noptim: {betas: [0.5, 0.6]}\n")
    write(tmp_path, "sub/b.yaml", "extends: ../a.yaml\nmodel: {attention: {heads: 4}}\n")
    c = write(tmp_path, "sub/c.yaml", "extends: b.yaml\nmodel: {d_model: 16}\noptim: {betas: [0.7, 0.8]}\n")
    data = load_source(c).data
    assert data["model"] == {"vocab_size": 10, "d_model": 16, "attention": {"type": "multihead", "heads": 4}}
    assert data["optim"]["betas"] == [0.7, 0.8]
    assert "extends" not in data and "name" not in data  # a child does not inherit its parent's name
    assert tfbuilder.load_recipe(c, overrides=["model.encoder.layers=1", "model.decoder.layers=1"]).name == "c"


def test_a_component_whose_type_changes_is_replaced_not_merged(tmp_path):
    write(tmp_path, "a.yaml", "model: {position: {type: sinusoidal, base: 500}}\n")
    b = write(tmp_path, "b.yaml", "extends: a.yaml\nmodel: {position: {type: learned, max_len: 64}}\n")
    assert load_source(b).data["model"]["position"] == {"type": "learned", "max_len": 64}
    src = apply_overrides(load_source(tmp_path / "a.yaml"), ["model.position.type=none"])
    assert src.data["model"]["position"] == {"type": "none"}


def test_positions_point_into_the_file_that_wrote_the_value(tmp_path):
    write(tmp_path, "a.yaml", "model:\n  vocab_size: 10\n  d_model: 8\n")
    b = write(tmp_path, "b.yaml", "extends: a.yaml\nmodel:\n\n  d_model: 12\n")
    src = load_source(b)
    assert src.values[("model", "d_model")].line == 4
    assert src.values[("model", "d_model")].file.endswith("b.yaml")
    assert src.values[("model", "vocab_size")].file.endswith("a.yaml")
    assert src.values[("model", "vocab_size")].line == 2


def test_overrides_parse_yaml_values_and_create_keys():
    src = load_source(ROOT / "recipes" / "vanilla.yaml")
    apply_overrides(
        src,
        ["model.encoder.layers=2", "model.dropout=0.25", "model.placement=pre", "optim.betas=[0.8, 0.9]", "trainer.new.deep=1"],
    )
    assert src.data["model"]["encoder"]["layers"] == 2
    assert src.data["model"]["dropout"] == 0.25
    assert src.data["optim"]["betas"] == [0.8, 0.9]
    assert src.data["trainer"]["new"] == {"deep": 1}
    assert src.values[("model", "dropout")].file == "--set model.dropout=0.25"


def test_overrides_reach_the_validated_recipe():
    recipe = tfbuilder.load_recipe(ROOT / "recipes" / "vanilla.yaml", overrides=["model.encoder.layers=2"])
    assert recipe.model.encoder.layers == 2 and recipe.model.decoder.layers == 6


@pytest.mark.parametrize(
    "override, message",
    [
        ("novalue", "must look like dotted.key=value"),
        ("model..x=1", "empty key"),
        ("model.d_model.x=1", "is not a mapping"),
        ("optim.betas.5=1", "out of range"),
        ("model.d_model=[1", "cannot parse value"),
    ],
)
def test_bad_overrides_are_reported(override, message):
    with pytest.raises(tfbuilder.RecipeError, match=message) as info:
        tfbuilder.load_recipe(ROOT / "recipes" / "vanilla.yaml", overrides=[override])
    assert info.value.problems[0].file == f"--set {override}"


def test_shorthand_component_type():
    recipe = tfbuilder.load_recipe(ROOT / "recipes" / "vanilla.yaml", overrides=["model.position=learned"])
    assert recipe.model.position.type == "learned" and recipe.model.position.max_len == 1024


def test_unknown_yaml_tags_are_refused():
    with pytest.raises(tfbuilder.RecipeError, match="not allowed"):
        parse_yaml("model: !!python/object/apply:os.system ['true']\n", "x.yaml")
