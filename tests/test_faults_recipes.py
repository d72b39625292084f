"""Recipe reading costs and paths: an extends chain merges in linear time, thousands of unknown keys
and a --set path of thousands of parts are refused quickly, and a NUL byte or a newline in a path is
a clear error with the path echoed escaped."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conftest import QUICKSTART
from hostile import assert_refused, run_cli, run_limited
from tfbuilder.spec.sources import Mark, Source, merge, parse_yaml

KEYS = 40_000  # merged: more than a file may hold (a chain of files, a checkpoint's recipe and overrides)
FILE_KEYS = 4_900  # in one file: within its 10,000 values (a key and its value are two)


def _many_keys(value: int, keys: int = FILE_KEYS) -> str:
    return "model:\n" + "".join(f"  k{i}: {value}\n" for i in range(keys))


def _many_keys_source(value: int, file: str) -> Source:
    """What parse_yaml makes of KEYS keys of ``model`` (beyond what it reads from one file)."""
    src = Source({"model": {f"k{i}": value for i in range(KEYS)}})
    src.values = {(): Mark(file, 1, 1), ("model",): Mark(file, 2, 3)}
    src.values.update({("model", f"k{i}"): Mark(file, i + 2, 7) for i in range(KEYS)})
    src.keys = {("model", f"k{i}"): Mark(file, i + 2, 3) for i in range(KEYS)}
    return src


def test_merging_an_extends_chain_is_linear_in_its_keys():
    small = parse_yaml(_many_keys(1, keys=3), "base.yaml")  # the hand-made sources hold what parse_yaml records
    assert set(small.values) == {(), ("model",), ("model", "k0"), ("model", "k1"), ("model", "k2")}
    base, top = _many_keys_source(1, "base.yaml"), _many_keys_source(2, "top.yaml")
    start = time.process_time()
    merged = merge(base, top)
    assert time.process_time() - start < 10  # a hang guard: linear takes well under a second, quadratic minutes
    assert merged.data["model"]["k7"] == 2 and merged.values[("model", "k7")].file == "top.yaml"
    assert len(merged.values) == KEYS + 2  # the root, model, and each key


def test_merge_keeps_the_places_of_what_it_keeps():
    base = parse_yaml("model:\n  a: {x: 1, y: 2}\n  b: [1, 2]\n  c: 3\n", "base.yaml")
    top = parse_yaml("model:\n  a: {y: 5}\n  b: {z: 1}\n", "top.yaml")
    merged = merge(base, top)
    assert merged.data == {"model": {"a": {"x": 1, "y": 5}, "b": {"z": 1}, "c": 3}}
    where = {k: (m.file, m.line) for k, m in merged.values.items()}
    assert where[("model", "a", "x")] == ("base.yaml", 2) and where[("model", "a", "y")] == ("top.yaml", 2)
    assert where[("model", "b", "z")] == ("top.yaml", 3) and ("model", "b", 0) not in where
    assert where[("model", "c")] == ("base.yaml", 4) and where[("model",)] == ("top.yaml", 2)


def test_thousands_of_unknown_keys_are_reported_quickly(tmp_path, capsys):
    recipe = tmp_path / "wide.yaml"
    recipe.write_text(f"name: wide\nextends: {QUICKSTART}\n" + _many_keys(1).replace("model:\n", "trainer:\n"))
    outcome = run_cli(["validate", str(recipe)], capsys)
    # The most keys a recipe file holds; the "did you mean" search stays out of it.
    assert_refused(outcome, "wide.yaml:4:3: trainer.k0: unknown key 'k0'", f"trainer.k{FILE_KEYS - 1}: unknown key")


def test_a_set_path_of_thousands_of_parts_is_refused_in_bounded_memory(tmp_path):
    key = ".".join(["a"] * 20_000)
    outcome = run_limited(["validate", str(QUICKSTART), "--set", f"model.{key}=1"], cwd=tmp_path)
    assert_refused(outcome, "the key path has 20,001 parts; a recipe is nested at most 64 levels", seconds=30)


def test_a_nul_byte_in_extends_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "nul.yaml").write_text('extends: "base\\0.yaml"\nmodel: {d_model: 8}\n')
    assert_refused(run_cli(["validate", str(tmp_path / "nul.yaml")], capsys), "nul.yaml:1:10: extends: a path cannot hold a NUL byte")


@pytest.mark.parametrize("key", ["trainer.output", "data.path"])
def test_a_nul_byte_in_a_recipe_path_is_a_clear_error(tmp_path, capsys, key):
    outcome = run_cli(["fit", str(QUICKSTART), "--set", f'{key}="runs\\0x"'], capsys)
    assert_refused(outcome, f"{key}: a path cannot hold a NUL byte (got 'runs\\x00x')")
    assert not Path("runs\0x".split("\0")[0] + "x").exists()


def test_a_recipe_file_named_with_a_newline_is_named_escaped(tmp_path, capsys):
    recipe = tmp_path / "new\nline.yaml"
    recipe.write_text(f"extends: {QUICKSTART}\n")
    outcome = run_cli(["validate", str(recipe)], capsys)
    assert_refused(outcome, "new\\nline.yaml:1:1: name: the recipe has no name, and its file name 'new\\nline' is not one")
    assert outcome.err.count("\n") == 1  # one line: the newline is shown escaped
