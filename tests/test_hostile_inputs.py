"""Hostile command lines and inputs outside recipes and stores: counts that would run for ever, long
lines, files that are not files. Each is refused with exit 2 naming the argument, file or line, or
done within the bounds of tests/hostile.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import test_faults
from conftest import ROOT
from hostile import assert_refused, run_cli

from tfbuilder.cli.arguments import MAX_ARGUMENT, MAX_BEAM, MAX_SEEDS
from tfbuilder.cli.commands import main


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A tiny finished run of the quick-start recipe (test_faults.py's: seconds, checkpoints kept)."""
    out = tmp_path_factory.mktemp("tiny")
    args = sum((["--set", o] for o in [f"trainer.output={out / 'runs'}", *test_faults.TINY]), [])
    assert main(["fit", str(ROOT / "recipes" / "quickstart.yaml"), *args]) == 0
    return out / "runs" / "quickstart" / "version_0"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["sweep", "recipes/quickstart.yaml", "--seeds", "1000000000", "--dry-run"], f"between 1 and {MAX_SEEDS:,}"),
        (["sweep", "recipes/quickstart.yaml", "--seeds", str(MAX_SEEDS + 1), "--dry-run"], "argument --seeds"),
        (["translate", "runs/none", "--beam", str(MAX_BEAM + 1)], "argument --beam"),
        (["translate", "runs/none", "--nbest", "1000000000"], "argument --nbest"),
        (["translate", "runs/none", "--max-tokens", str(MAX_ARGUMENT + 1)], "argument --max-tokens"),
        (["compare", "runs/none", "--beam", "100000000000000000000"], "argument --beam"),
    ],
)
def test_counts_on_the_command_line_are_bounded(args, expected, capsys):
    assert_refused(run_cli(args, capsys, cwd=ROOT), expected)


def test_a_long_line_is_translated_from_its_beginning(tiny_run, tmp_path, capsys):
    """A 90,000-character line (the quick-start model reads one token a character) is translated from
    its first DEFAULT_MAX_SOURCE tokens, said on stderr with its line number; only that line."""
    from tfbuilder.inference.translate import DEFAULT_MAX_SOURCE

    lines = tmp_path / "in.txt"
    lines.write_text("abc\n" + "abcd" * 22_500 + "\nba\n", encoding="utf-8")
    outcome = run_cli(["translate", str(tiny_run), "--input", str(lines), "--beam", "1"], capsys)
    assert outcome.rc == 0, outcome.err
    assert f"line 1: 90,000 tokens; translating its first {DEFAULT_MAX_SOURCE:,}" in outcome.err
    assert "line 0" not in outcome.err and "line 2" not in outcome.err
    assert len(outcome.out.split("\n")) == 4  # one line out for each line in
    assert outcome.seconds < 60  # of CPU time: at most a thousand greedy steps of a tiny model


def test_a_cut_line_is_translated_as_its_beginning(tiny_run):
    import tfbuilder
    from tfbuilder.inference.translate import Search, translate_batch

    loaded = tfbuilder.load_checkpoint(str(tiny_run))
    told: list[tuple[int, int]] = []
    search = Search(beam=2)
    cut = translate_batch(loaded.model, loaded.vocab, ["ab", "abcdbca"], search=search, max_source=5,
                          cut=lambda i, n: told.append((i, n)))
    assert told == [(1, 7)]
    assert cut == translate_batch(loaded.model, loaded.vocab, ["ab", "abcdb"], search=search)
    assert cut != translate_batch(loaded.model, loaded.vocab, ["ab", "abcdbca"], search=search)  # it was cut


def test_a_learned_position_table_bounds_what_a_line_reads():
    from types import SimpleNamespace

    from tfbuilder.inference.translate import DEFAULT_MAX_SOURCE, source_limit
    from tfbuilder.spec.recipe import load_recipe

    recipe = load_recipe(ROOT / "recipes" / "quickstart.yaml")
    assert source_limit(SimpleNamespace(recipe=recipe)) == DEFAULT_MAX_SOURCE  # sinusoidal: no end
    learned = load_recipe(ROOT / "recipes" / "quickstart.yaml", ["model.position={type: learned, max_len: 100}"])
    assert source_limit(SimpleNamespace(recipe=learned)) == 99  # and the end token


def test_attention_maps_are_drawn_for_sentences(tiny_run, tmp_path, capsys):
    from tfbuilder.use.attention_maps import MAX_MAP_TOKENS

    out = tmp_path / "maps"
    long = "ab" * 1050
    outcome = run_cli(["attention", str(tiny_run), "--src", long, "--out", str(out)], capsys)
    assert_refused(outcome, "the source is 2,101 tokens", f"at most {MAX_MAP_TOKENS}")
    outcome = run_cli(["attention", str(tiny_run), "--src", "ab", "--tgt", long, "--out", str(out)], capsys)
    assert_refused(outcome, "--tgt is 2,101 tokens")
    assert not out.exists()


def test_an_attention_map_of_the_bound_is_drawn():
    from tfbuilder.use.attention_maps import MAX_MAP_TOKENS, AttentionMapError, _check_length

    _check_length("the source", MAX_MAP_TOKENS)  # drawing it takes half a minute: the bound alone is checked
    with pytest.raises(AttentionMapError, match=f"the source is {MAX_MAP_TOKENS + 1} tokens"):
        _check_length("the source", MAX_MAP_TOKENS + 1)


def _outputs(run: str, where: str) -> list[list[str]]:
    """Every command that writes a file or folder the user names, writing at ``where``."""
    ckpt = f"{run}/checkpoints/last.ckpt"
    return [
        ["schema", "-o", f"{where}/schema.json"],
        ["translate", run, "--input", "recipes/quickstart.yaml", "--output", f"{where}/out.txt"],
        ["average", run, "--last", "1", "--out", f"{where}/avg.ckpt"],
        ["export", ckpt, "--format", "safetensors", "--out", f"{where}/exported"],
        ["import-hf", run, "--out", f"{where}/imported"],
    ]


def test_an_output_under_a_file_is_refused_before_any_work(tiny_run, tmp_path, capsys):
    afile = tmp_path / "notes.txt"
    afile.write_text("mine\n", encoding="utf-8")
    for args in _outputs(str(tiny_run), str(afile)):
        outcome = run_cli(args, capsys, cwd=ROOT)
        assert_refused(outcome, f"{afile}", "is a file, not a directory")
    assert afile.read_text(encoding="utf-8") == "mine\n"


def test_an_output_in_a_folder_that_cannot_be_written_is_refused(tiny_run, tmp_path, capsys, monkeypatch):
    """A read-only file system (os.access says so even to root): refused before any work, naming
    the folder, never a traceback from the temporary file's clean-up."""
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == frozen else real(p, mode, **kw))
    for args in _outputs(str(tiny_run), str(frozen)):
        assert_refused(run_cli(args, capsys, cwd=ROOT), f"{frozen} is not writable")
    assert list(frozen.iterdir()) == []


def test_what_a_path_is_is_said_in_words(tmp_path):
    import socket

    from tfbuilder.streams import describe

    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        assert describe(tmp_path / "sock") == "a socket"
    assert describe(tmp_path / "file") == "a regular file"
    assert describe(tmp_path) == "a folder"
    assert describe(tmp_path / "fifo") == "a FIFO"
    assert describe("/dev/null") == "a character device"
    assert describe(tmp_path / "loop1") == "a loop of symbolic links"
    assert describe(tmp_path / "dangling") == f"a symbolic link to {tmp_path / 'nowhere'}, which does not exist"
    assert describe(tmp_path / "nowhere") == "missing"
    assert describe(tmp_path / "file" / "below") == "missing"


def test_inputs_that_are_not_files_are_named(tiny_run, tmp_path, capsys):
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    run = str(tiny_run)
    for name, words in (("loop1", "is a loop of symbolic links"), ("dangling", "which does not exist")):
        for verb in ("translate", "predict"):
            assert_refused(run_cli([verb, run, "--input", str(tmp_path / name)], capsys), f"--input {tmp_path / name} ", words)
    if Path("/proc/self/mem").exists():  # readable, yet every read fails
        assert_refused(run_cli(["translate", run, "--input", "/proc/self/mem"], capsys), "cannot read /proc/self/mem: ")


def test_a_translation_that_fails_before_its_first_line_leaves_no_output_file(tiny_run, tmp_path, capsys):
    bad = tmp_path / "in.txt"
    bad.write_bytes(b"ab\n\xff\n")
    out = tmp_path / "out.txt"
    assert_refused(run_cli(["translate", str(tiny_run), "--input", str(bad), "--output", str(out)], capsys),
                   "not UTF-8 text")
    assert not out.exists()
