"""Hostile recipe files that cannot live in tests/broken_recipes/ (devices, FIFOs, symlink loops, long
chains, large files, foreign files): each is refused with exit 2 and a position, no traceback, in
bounded time and memory. Small hostile recipes are in tests/broken_recipes/ with their expected lines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tfbuilder
from conftest import ROOT
from hostile import assert_refused, run_cli, run_limited
from tfbuilder.spec.sources import MAX_EXTENDS, MAX_RECIPE_BYTES, load_source
from tfbuilder.spec.yaml_source import MAX_LINE, MAX_NODES

VANILLA = ROOT / "recipes" / "vanilla.yaml"
BOMB = ROOT / "tests" / "broken_recipes" / "yaml_alias_bomb.yaml"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- 1. resource exhaustion from small files ---------------------------------------------------


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom"])
def test_a_device_is_not_read(tmp_path, capsys, target):
    assert_refused(run_cli(["validate", target], capsys), f"{target}:1:1: ", "not a regular file (a character device)")
    child = write(tmp_path / "child.yaml", f"extends: {target}\n")
    assert_refused(run_cli(["validate", str(child)], capsys), "child.yaml:1:10: extends: ", "not a regular file")


def test_a_fifo_is_not_waited_on(tmp_path, capsys):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    assert_refused(run_cli(["validate", str(fifo)], capsys), "pipe.yaml:1:1: ", "not a regular file (a FIFO)")
    child = write(tmp_path / "child.yaml", "extends: pipe.yaml\n")
    assert_refused(run_cli(["validate", str(child)], capsys), "child.yaml:1:10: extends: ", "not a regular file")


def test_a_directory_is_not_a_recipe(tmp_path, capsys):
    assert_refused(run_cli(["validate", str(tmp_path)], capsys), ":1:1: ", "a directory")


def test_a_recipe_is_at_most_256_kib(tmp_path, capsys):
    assert MAX_RECIPE_BYTES == 256 * 1024
    big = write(tmp_path / "big.yaml", "model: {vocab_size: 10}\n" + "# padding\n" * (MAX_RECIPE_BYTES // 10 + 1))
    assert_refused(run_cli(["validate", str(big)], capsys), "big.yaml:1:1: ", f"a recipe is at most {MAX_RECIPE_BYTES:,}")


def test_a_long_line_is_refused_before_it_is_scanned(tmp_path, capsys):
    """One line of flow YAML is parsed as slowly as many: a 200 KB line is refused where it is."""
    line = "data: {lengths: [" + ", ".join(["1"] * 60_000) + "]}"
    long = write(tmp_path / "long.yaml", "name: x\n" + line + "\n")
    outcome = run_cli(["validate", str(long)], capsys)
    assert_refused(outcome, "long.yaml:2:1: ", f"a line of {len(line):,} characters", f"at most {MAX_LINE:,}")
    short = write(tmp_path / "short.yaml", "name: x\n" + "# " + "x" * (MAX_LINE - 2) + "\n" + "model: {vocab_size: 10}\n")
    assert "a line of" not in run_cli(["validate", str(short)], capsys).err  # a line of exactly MAX_LINE is read
    assert_refused(run_cli(["validate", "recipes/quickstart.yaml", "--set", f"name={'x' * (MAX_LINE + 1)}"], capsys,
                           cwd=ROOT), "--set name=", "recipe lines are at most")


def test_values_written_are_bounded_while_composing(tmp_path, capsys):
    """Values written one per line (no alias) are counted as PyYAML composes them: refused at the
    first value past MAX_NODES, within the time bound, not after composing all of them."""
    many = write(tmp_path / "many.yaml", "data:\n  lengths: [1,\n" + "    1,\n" * 30_000 + "  1]\n")
    outcome = run_cli(["validate", str(many)], capsys)
    assert_refused(outcome, "many.yaml:", f"more than {MAX_NODES:,} values written")
    line = int(outcome.err.split("many.yaml:")[1].split(":")[0])
    assert MAX_NODES - 10 < line <= MAX_NODES, outcome.err  # where the count ran out, not at the end


def test_resource_cases_stay_within_a_gibibyte(tmp_path):
    """The cases that used to take gigabytes, in one subprocess whose address space is capped:
    `validate` goes on to the next file after refusing one, so each case is refused in turn under the
    same limit (one import of torch instead of three)."""
    deep = write(tmp_path / "deep.yaml", "model: " + "[\n" * 60_000 + "]\n" * 60_000)  # lines within MAX_LINE
    zero = write(tmp_path / "z.yaml", "extends: /dev/zero\n")
    cases = {BOMB: "YAML aliases expand this recipe to more than", zero: "not a regular file", deep: "nested deeper than"}
    outcome = run_limited(["validate", *map(str, cases)], cwd=tmp_path)
    assert_refused(outcome, *cases.values(), seconds=30)  # of CPU time: the subprocess also imports torch
    lines = outcome.err.splitlines()
    for path, expected in cases.items():  # each message is about its own file
        assert any(path.name in line and expected in line for line in lines), (path.name, outcome.err)
    assert ": OK" not in outcome.out


# --- 2. recursion --------------------------------------------------------------------------------


def test_an_extends_chain_is_bounded_and_never_recurses(tmp_path, capsys):
    n = 2000  # far beyond Python's recursion limit: the chain is followed in a loop
    for i in range(n):
        write(tmp_path / f"r{i}.yaml", f"extends: r{i + 1}.yaml\n")
    write(tmp_path / f"r{n}.yaml", "model: {vocab_size: 10}\n")
    outcome = run_cli(["validate", str(tmp_path / "r0.yaml")], capsys)
    assert_refused(outcome, f"r{MAX_EXTENDS - 1}.yaml:1:10: extends: extends chain longer than {MAX_EXTENDS} files")


def test_a_chain_within_the_bound_merges(tmp_path):
    for i in range(MAX_EXTENDS - 1):
        write(tmp_path / f"r{i}.yaml", f"extends: r{i + 1}.yaml\nmodel: {{d_model: {8 * (i + 1)}}}\n")
    write(tmp_path / f"r{MAX_EXTENDS - 1}.yaml", "model: {vocab_size: 10, d_model: 4}\n")
    assert load_source(tmp_path / "r0.yaml").data["model"] == {"vocab_size": 10, "d_model": 8}


def test_a_symlink_loop_is_named(tmp_path, capsys):
    os.symlink(tmp_path / "b.yaml", tmp_path / "a.yaml")
    os.symlink(tmp_path / "a.yaml", tmp_path / "b.yaml")
    assert_refused(run_cli(["validate", str(tmp_path / "a.yaml")], capsys), "a.yaml:1:1: ", "symlink loop")
    child = write(tmp_path / "child.yaml", "extends: a.yaml\n")
    assert_refused(run_cli(["validate", str(child)], capsys), "child.yaml:1:10: extends: ", "symlink loop")


def test_overrides_have_the_same_bounds_as_files(capsys):
    cases = {
        "model.x=&a [*a]": "recursive YAML alias",
        "model.x=" + "[" * 200 + "]" * 200: "nested deeper than",
        "model.x=!!python/object/apply:os.system [ls]": "is not allowed",
        "model.vocab_size=" + "9" * 5000: "a number too large to read",
    }
    for override, message in cases.items():
        outcome = run_cli(["validate", str(VANILLA), "--set", override], capsys)
        assert_refused(outcome, f"--set {override}:1:", message)


# --- 8. what gets echoed -------------------------------------------------------------------------


def test_a_foreign_file_is_not_echoed(tmp_path, capsys):
    secret = write(tmp_path / "shadow", "operator: $6$hash-that-must-not-be-printed\ndaemon: '*'\n")
    child = write(tmp_path / "child.yaml", f"extends: {secret}\n")
    outcome = run_cli(["validate", str(child)], capsys)
    assert_refused(outcome, "child.yaml:1:10: extends: ", "which is not a recipe")
    assert "hash-that-must-not-be-printed" not in outcome.err and "operator" not in outcome.err
    assert_refused(run_cli(["validate", str(secret)], capsys), "shadow:1:1: ", "not a recipe")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    outcome = run_cli(["validate", str(write(tmp_path / "c2.yaml", f"extends: {binary}\n"))], capsys)
    assert_refused(outcome, "c2.yaml:1:10: extends: ", "cannot be read: not UTF-8")


def test_terminal_escapes_are_never_printed_raw(tmp_path, capsys):
    recipe = write(tmp_path / "esc.yaml", 'extends: "\\e]0;pwned\\a\\e[2J"\nmodel: {"\\e[31m": 1}\n')
    outcome = run_cli(["validate", str(recipe)], capsys)
    assert outcome.rc == 2
    assert "\x1b" not in outcome.err and "\x07" not in outcome.err, outcome.err
    assert "\\x1b" in outcome.err
    outcome = run_cli(["validate", str(VANILLA), "--set", "model.\x1b[2J=1"], capsys)
    assert_refused(outcome, "model.\\x1b[2J: unknown key")
    assert "\x1b" not in outcome.err


# --- 11. YAML as YAML ---------------------------------------------------------------------------


def test_a_merge_key_used_through_an_alias_is_not_a_duplicate(tmp_path):
    recipe = write(
        tmp_path / "m.yaml",
        "extends: " + str(VANILLA) + "\n"
        "model:\n"
        "  encoder: &enc {<<: {layers: 6}, layers: 2}\n"
        "  decoder: *enc\n",
    )
    loaded = tfbuilder.load_recipe(recipe)
    assert loaded.model.encoder.layers == 2 and loaded.model.decoder.layers == 2


def test_merge_keys_follow_yaml_precedence(tmp_path):
    recipe = write(
        tmp_path / "m.yaml",
        "a: &a {x: 1, y: 1}\nb: &b {x: 2, z: 2}\nc: {<<: [*a, *b], y: 3}\nmodel: {}\n",
    )
    data = load_source(recipe).data
    assert data["c"] == {"x": 1, "y": 3, "z": 2}  # the first merged mapping wins; own keys win over all


def test_a_yaml_reader_error_is_reported_once_where_it_is(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_bytes(b"model:\n  vocab_size: 10\n  d_model: \x01\n")
    outcome = run_cli(["validate", str(recipe)], capsys)
    assert_refused(outcome, "r.yaml:3:12: ", "special character #x0001")
    assert len(outcome.err.strip().splitlines()) == 1, outcome.err


# --- integers beyond what torch and numpy hold ------------------------------------------------------


def _errors_at(cls, field: str, value) -> list[str]:
    """The error types ``cls`` gives for ``field`` set to ``value`` (other fields' errors ignored)."""
    from pydantic import ValidationError

    data = {field: value}
    if "type" in cls.model_fields and field != "type":
        data["type"] = cls.model_fields["type"].default
    try:
        cls.model_validate(data)
    except ValidationError as exc:
        return [e["type"] for e in exc.errors() if e["loc"][:1] == (field,)]
    return []


def _int_fields() -> list[tuple[type, str]]:
    """Every field of every section and registered component that takes an integer."""
    from tfbuilder import registry
    from tfbuilder.spec import recipe  # noqa: F401  (defines every section)
    from tfbuilder.spec.base import Section

    registry.load()
    classes, stack = [], list(Section.__subclasses__())
    while stack:
        cls = stack.pop()
        classes.append(cls)
        stack.extend(cls.__subclasses__())
    classes += [entry.params for family in registry.FAMILIES for entry in registry.entries(family)]
    return [(cls, name) for cls in dict.fromkeys(classes) for name in cls.model_fields
            if name != "type" and not _errors_at(cls, name, 5) and _errors_at(cls, name, 5.5)]  # ints, not floats


def test_every_integer_of_a_recipe_is_bounded():
    """An integer past 2^32 - 1 anywhere in a recipe (a component's size, a window, a count) is a
    validation error at that key, never an overflow inside torch or numpy later."""
    fields = _int_fields()
    assert len(fields) > 40, fields  # the walk found the recipe's integers
    refused = {"int_bound", "less_than_equal", "less_than"}  # the common bound, or the field's own
    unbounded = [f"{cls.__name__}.{name}" for cls, name in fields if not refused & set(_errors_at(cls, name, 10**20))]
    assert not unbounded, unbounded
    assert all("int_bound" not in _errors_at(cls, name, 2**32 - 1) for cls, name in fields)


def test_an_overflowing_integer_is_refused_where_it_was_written(capsys):
    outcome = run_cli(["validate", "recipes/quickstart.yaml", "--set", "model.attention.window=100000000000000000000"],
                      capsys, cwd=ROOT)
    assert_refused(outcome, "model.attention.window: integers here are at most 4,294,967,295")
