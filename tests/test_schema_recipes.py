"""The JSON Schema editors use: every shipped recipe validates against it, and it rejects the broken
corpus wherever one file, read alone, can show the problem (the rest is listed here, with why)."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from conftest import RECIPES, ROOT
from tfbuilder.spec.recipe import json_schema
from tfbuilder.spec.sources import Loader

CORPUS = sorted((ROOT / "tests" / "broken_recipes").glob("*.yaml"))

# Broken recipes the schema accepts, by reason. A new corpus case must be rejected by the schema,
# fail to parse as YAML, or be added here under its reason.
SCHEMA_CANNOT = {
    # the problem lies in, or depends on, another file (a schema sees one file)
    "other file": {
        "broken_grandparent", "broken_parent_schema", "broken_parent_yaml", "extends_cycle", "extends_directory",
        "extends_empty", "extends_missing", "extends_self", "decoder_from_parent_for_encoder_kind",
        "component_without_type",  # in a recipe that extends, `type` may come from the parent
    },
    # YAML that a JSON Schema only sees after parsing (duplicates are already dropped by then)
    "yaml": {"duplicate_key", "duplicate_section", "yaml_recursive_merge"},
    # rules between fields
    "cross-field": {
        "betas_out_of_range", "decoder_for_encoder_kind", "heads_not_dividing", "heads_not_dividing_key_dim_only",
        "missing_encoder", "missing_vocab_size", "monolingual_without_path", "pad_id_not_the_datas", "pad_id_too_large",
        "parallel_without_path", "hub_with_path", "parquet_without_target_column",
        "src_vocab_for_decoder_kind", "src_vocab_mismatch", "synthetic_lengths_absurd", "synthetic_without_task",
        "val_bleu_on_decoder",
    },
    # the pre-flight: building and stepping the model, this machine
    "pre-flight": {
        "learned_max_len_shorter_than_data", "learned_max_len_shorter_than_text", "model_too_large",
        "num_nodes_without_launcher", "rotary_odd_key_dim",
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def read(path: Path):
    # YAML 1.2 numbers (1e-3), as editors' language servers read them
    return yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)  # noqa: S506 (a safe loader)


def test_there_are_shipped_recipes():
    assert len(RECIPES) >= 50


@pytest.mark.parametrize("recipe", RECIPES, ids=[str(r.relative_to(ROOT)) for r in RECIPES])
def test_every_shipped_recipe_validates_against_the_schema(validator, recipe):
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in validator.iter_errors(read(recipe))]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("case", CORPUS, ids=[c.stem for c in CORPUS])
def test_the_schema_rejects_the_broken_corpus_where_it_can(validator, case):
    try:
        data = read(case)
    except (yaml.YAMLError, ValueError):
        return  # not YAML at all: an editor flags it without a schema
    cannot = {name for names in SCHEMA_CANNOT.values() for name in names}
    if case.stem in cannot:
        assert validator.is_valid(data), f"{case.stem} is now rejected by the schema: take it out of SCHEMA_CANNOT"
    else:
        assert not validator.is_valid(data), f"the schema accepts {case.name}: reject it, or list it in SCHEMA_CANNOT with why"


def test_model_is_required_only_without_extends(validator):
    assert validator.is_valid({"extends": "vanilla.yaml", "trainer": {"seed": 1}})
    assert not validator.is_valid({"trainer": {"seed": 1}})
    assert validator.is_valid({"model": {"vocab_size": 10, "position": "rotary", "attention": {"heads": 2}}})
