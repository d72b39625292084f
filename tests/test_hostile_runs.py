"""Hostile data, checkpoints and arguments: exit 2 with the file or argument named, no traceback,
nothing overwritten; lines end at \\n only, so pairs never shift."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

import tfbuilder
from conftest import ROOT
from hostile import assert_refused, run_cli
from tfbuilder.model.builder import build_model
from tfbuilder.data import text
from tfbuilder.data.prepare import Vocab
from tfbuilder.data.synthetic import alphabet
from tfbuilder.data.tokenizers import CharTokenizer, DataError
from tfbuilder.runs.checkpoints import CheckpointError, load_checkpoint

QUICKSTART = ROOT / "recipes" / "quickstart.yaml"


# --- 3. parallel text: lines end at \n only ------------------------------------------------------


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085", "\f", "\v", "\x1c", "\r"])
def test_no_character_but_newline_splits_a_line(tmp_path, separator):
    src = [f"satz {i}" for i in range(300)]
    tgt = [f"sentence {i}" for i in range(300)]
    src[10] = f"ein{separator}satz"  # one such character on each side, at different lines
    tgt[200] = f"a{separator}sentence"
    (tmp_path / "train.de").write_text("\n".join(src) + "\n", encoding="utf-8", newline="")
    with gzip.open(tmp_path / "train.en.gz", "wt", encoding="utf-8", newline="") as f:
        f.write("\r\n".join(tgt) + "\r\n")  # Windows line ends are line ends
    got_src, got_tgt = text.read_parallel(tmp_path, "train", "de", "en")
    assert got_src == src and got_tgt == tgt  # every pair where it was


def test_a_corrupt_gzip_stream_names_the_file(tmp_path):
    good = gzip.compress(("ein satz\n" * 2000).encode())
    (tmp_path / "train.de.gz").write_bytes(good[:20] + b"\xff" * 40 + good[60:])
    with pytest.raises(DataError, match=r"train\.de\.gz: a damaged or truncated gzip stream"):
        text.read_lines(tmp_path / "train.de.gz")
    (tmp_path / "val.de.gz").write_bytes(good[: len(good) // 2])
    with pytest.raises(DataError, match=r"val\.de\.gz: a damaged or truncated gzip stream"):
        text.read_lines(tmp_path / "val.de.gz")


def test_text_that_is_not_utf8_names_the_line(tmp_path):
    (tmp_path / "train.de").write_bytes(b"ok\nok\n\xff\xfe bad\n")
    with pytest.raises(DataError, match=r"train\.de: line 3 is not UTF-8"):
        text.read_lines(tmp_path / "train.de")


def _parallel(tmp_path: Path, *, val_src: list[str]) -> list[str]:
    data = tmp_path / "data"
    data.mkdir()
    train = [f"ein kleiner satz {i}" for i in range(200)]
    for name, lines in {"train.de": train, "train.en": train, "val.de": val_src, "val.en": ["kurz"] * len(val_src)}.items():
        (data / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [
        "--set", f"data.path={data}", "--set", "data.src_lang=de", "--set", "data.tgt_lang=en",
        "--set", "data.tokenizer.type=char", "--set", "data.tokenizer.vocab_size=20", "--set", "data.max_len=40",
        "--set", "model.position={type: learned, max_len: 48}", "--set", "model.d_model=16",
        "--set", "model.attention={type: multihead, heads: 2}", "--set", "model.ffn={type: mlp, hidden: 16}",
        "--set", "model.encoder.layers=1", "--set", "model.decoder.layers=1", "--set", "data.max_tokens=null",
        "--set", "data.batch_size=8", "--set", f"trainer.output={tmp_path / 'runs'}", "--set", "trainer.progress=false",
    ]  # fmt: skip


def test_a_validation_line_longer_than_the_positions_is_reported_before_training(tmp_path, capsys):
    args = _parallel(tmp_path, val_src=["kurz", "ein " * 30, "kurz"])
    outcome = run_cli(["fit", str(ROOT / "recipes" / "vanilla.yaml"), *args], capsys)
    assert_refused(outcome, "the val split's example 2 has 120 source tokens", "model.position.max_len 48", seconds=60)
    assert not (tmp_path / "runs").exists()  # nothing was created, nothing trained


# --- 4. fit runs the same pre-flight as validate ---------------------------------------------------


def test_fit_refuses_what_validate_refuses_before_making_a_run_directory(tmp_path, capsys):
    args = ["--set", f"trainer.output={tmp_path / 'runs'}", "--set", "model.position=rotary"]
    args += ["--set", "model.attention={type: multihead, heads: 4, key_dim: 5, value_dim: 16}"]
    outcome = run_cli(["fit", str(QUICKSTART), *args], capsys)
    assert_refused(outcome, "rotary positions need an even key width per head", seconds=60)
    assert not (tmp_path / "runs").exists()


# --- 6. damaged checkpoints ----------------------------------------------------------------------


def _checkpoint(tmp_path: Path, **changes) -> Path:
    """A checkpoint of the quickstart model (untrained: only its metadata matters here)."""
    recipe = tfbuilder.load_recipe(QUICKSTART, ["data.test_size=4", "data.val_size=4"])
    vocab = Vocab(CharTokenizer(alphabet(10)), CharTokenizer(alphabet(10)))
    model = build_model(recipe)
    meta = {"recipe": recipe.to_dict(), "vocab": vocab.to_json()}
    meta.update(changes.pop("meta", {}))
    data = {"tfbuilder": meta, "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "global_step": 3}
    data.update(changes)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    path = run / "checkpoints" / "last.ckpt"
    torch.save(data, path)
    return path


def _recipe_with(**changes) -> dict:
    recipe = tfbuilder.load_recipe(QUICKSTART).to_dict()
    for dotted, value in changes.items():
        node = recipe
        *parents, last = dotted.split(".")
        for part in parents:
            node = node[part]
        if value is None:
            del node[last]
        else:
            node[last] = value
    return recipe


DAMAGE = {
    "recipe-missing": ({"meta": {"recipe": None}}, "its recipe or vocabulary is missing"),
    "recipe-key-missing": ({"meta": {"recipe": _recipe_with(**{"model.vocab_size": None, "data": None})}}, "vocab_size"),
    "recipe-key-unknown": ({"meta": {"recipe": {**_recipe_with(), "extra": 1}}}, "unknown key 'extra'"),
    "recipe-wrong-type": ({"meta": {"recipe": _recipe_with(**{"model.d_model": "wide"})}}, "model.d_model"),
    "vocab-not-json": ({"meta": {"vocab": "{not json"}}, "not a tfbuilder vocabulary"),
    "vocab-empty": ({"meta": {"vocab": ""}}, "not a tfbuilder vocabulary"),
    "vocab-wrong-size": ({"meta": {"vocab": Vocab(CharTokenizer("ab"), CharTokenizer("ab")).to_json()}}, "vocabulary has 7 tokens"),
    "vocab-bad-bpe": ({"meta": {"vocab": json.dumps({"shared": json.dumps({"type": "bpe", "tokenizer": "{}"})})}}, "not a tfbuilder vocabulary"),
    "weights-not-tensors": ({"state_dict": {"model.x": 1}}, "not a mapping of tensors"),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_damaged_checkpoint_metadata_is_a_clear_error(tmp_path, damage):
    changes, message = DAMAGE[damage]
    path = _checkpoint(tmp_path, **changes)
    with pytest.raises(CheckpointError, match="damaged checkpoint") as info:
        load_checkpoint(path)
    assert message in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("command", ["test", "translate", "attention"])
def test_every_checkpoint_command_reports_damage_with_exit_2(tmp_path, capsys, command):
    path = _checkpoint(tmp_path, meta={"recipe": _recipe_with(**{"model.d_model": "wide"})})
    args = {"test": [], "translate": [], "attention": ["--src", "abc", "--out", str(tmp_path / "maps")]}[command]
    assert_refused(run_cli([command, str(path), *args], capsys), "damaged checkpoint", str(path))


def test_an_empty_tokenizer_file_is_a_data_error():
    with pytest.raises(DataError, match="not a tfbuilder vocabulary"):
        Vocab.from_json("")


# --- 6, 7. arguments, and never overwriting ------------------------------------------------------


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    return _checkpoint(tmp_path)


def test_translate_arguments(tmp_path, capsys, checkpoint):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9\n".encode("latin-1"))
    cases = [
        (["--input", str(tmp_path / "missing.txt")], "--input", "no such file"),
        (["--input", str(tmp_path)], "--input", "is a directory"),
        (["--input", str(latin1)], str(latin1), "is not UTF-8 text"),
        (["--output", str(tmp_path / "no" / "such" / "dir.txt")], "--output", "does not exist"),
        (["--output", str(tmp_path)], "--output", "a directory"),
        (["--beam", "0"], "--beam", "must be between 1 and 1,000, got 0"),
        (["--alpha", "nan"], "--alpha", "finite"),
    ]
    for args, named, message in cases:
        assert_refused(run_cli(["translate", str(checkpoint), *args], capsys), named, message)


def test_translate_keeps_each_line_whole(tmp_path, capsys, checkpoint):
    lines = ["abc", "a\u2028b", "c\fd", "e\x85f", "ab"]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8", newline="")
    out = tmp_path / "out.txt"
    outcome = run_cli(["translate", str(checkpoint), "--beam", "1", "--input", str(source), "--output", str(out)], capsys)
    assert outcome.rc == 0, outcome.err
    assert len(out.read_text(encoding="utf-8").split("\n")) == len(lines) + 1  # one line out per line in


def test_generate_arguments(capsys, checkpoint):
    for args, named in (
        (["--top-k", "0"], "--top-k"),
        (["--top-p", "0"], "--top-p"),
        (["--top-p", "1.5"], "--top-p"),
        (["--temperature", "nan"], "--temperature"),
        (["--temperature", "-1"], "--temperature"),
        (["--max-new", "-5"], "--max-new"),
    ):
        assert_refused(run_cli(["generate", str(checkpoint), "--prompt", "a", *args], capsys), f"argument {named}")


def test_schema_output_never_replaces_anything(tmp_path, capsys):
    existing = tmp_path / "schema.json"
    existing.write_text("mine", encoding="utf-8")
    assert_refused(run_cli(["schema", "-o", str(existing)], capsys), "--output", "not overwriting")
    assert existing.read_text(encoding="utf-8") == "mine"
    assert_refused(run_cli(["schema", "-o", str(tmp_path)], capsys), "--output", "a directory")
    assert_refused(run_cli(["schema", "-o", str(tmp_path / "missing" / "s.json")], capsys), "--output", "does not exist")


def test_out_naming_a_file_is_refused(tmp_path, capsys, checkpoint):
    afile = tmp_path / "taken"
    afile.write_text("mine", encoding="utf-8")
    assert_refused(run_cli(["compare", str(tmp_path), "--out", str(afile)], capsys), "--out", "is a file")
    assert_refused(run_cli(["attention", str(checkpoint), "--src", "abc", "--out", str(afile)], capsys), "--out", "is a file")
    assert_refused(run_cli(["sweep", str(QUICKSTART), "--out", str(afile), "--dry-run"], capsys), "--out", "is a file")
    assert afile.read_text(encoding="utf-8") == "mine"


def test_test_never_replaces_an_earlier_scores_file(tmp_path, capsys, checkpoint):
    first = run_cli(["test", str(checkpoint), "--beam", "1"], capsys)
    assert first.rc == 0, first.err
    scores = sorted((checkpoint.parent.parent).glob("test-*.json"))
    assert len(scores) == 1
    scores[0].write_text('{"mine": true}', encoding="utf-8")
    second = run_cli(["test", str(checkpoint), "--beam", "1"], capsys)
    assert second.rc == 0, second.err
    assert "not overwriting" in second.err
    assert scores[0].read_text(encoding="utf-8") == '{"mine": true}'
    (new,) = set((checkpoint.parent.parent).glob("test-*.json")) - {scores[0]}
    assert new.name == scores[0].stem + "-2.json" and json.loads(new.read_text())["split"] == "test"
