"""A sequence head end to end: fit on labelled JSON Lines, the mapping kept in the run, `tfbuilder test`
and `tfbuilder predict` on the command line, and the sweep report's columns (tfbuilder/use/predict.py)."""

from __future__ import annotations

import io
import json
import random

import pytest

from tfbuilder.cli.commands import main
from tfbuilder.spec.recipe import load_recipe, recipe_from_dict
from tfbuilder.use.reports import group, markdown, read_runs
from tfbuilder.runs.checkpoints import load_checkpoint
from tfbuilder.train.fit import fit

FRUIT, VEHICLE = "apple banana cherry grape lemon mango".split(), "car bus train plane boat bike".split()


def texts(n: int, seed: int, *, noise: float = 0.0) -> list[dict]:
    """``n`` texts of fruit or vehicle words; a ``noise`` share of them labelled the other way."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.choice(["fruit", "vehicle"])
        words = " ".join(rng.choices(FRUIT if label == "fruit" else VEHICLE, k=rng.randint(2, 5)))
        if rng.random() < noise:
            label = "vehicle" if label == "fruit" else "fruit"
        out.append({"text": words, "label": label})
    return out


def recipe(folder, **head):
    data = {
        "type": "labelled", "format": "jsonl", "path": str(folder), "cache": str(folder / "cache"), "max_len": 40,
        "columns": {"text": "text", "label": "label"}, "tokenizer": {"type": "char", "vocab_size": 24}, "batch_size": 32, "workers": 0,
    }
    model = {
        "kind": "encoder", "d_model": 16, "dropout": 0.0, "placement": "pre", "position": {"type": "learned", "max_len": 48},
        "attention": {"type": "multihead", "heads": 2}, "ffn": {"type": "mlp", "hidden": 32}, "encoder": {"layers": 1},
        "head": {"type": "classify", "classes": 2, **head},
    }
    return recipe_from_dict({
        "name": "fruit", "model": model, "data": data,
        "optim": {"optimizer": "adamw", "lr": 3e-3, "schedule": {"type": "constant", "warmup": 5}, "label_smoothing": 0.0},
        "trainer": {"max_steps": 40, "val_every": 40, "monitor": "val_f1", "output": str(folder / "runs"), "progress": False, "threads": 1, "accelerator": "cpu", "devices": 1},
    })


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fruit")
    # Validation labels are noisy: its scores are not perfect, so that how they add up over batches shows.
    for split, n, seed, noise in (("train", 300, 0, 0.0), ("val", 40, 1, 0.2), ("test", 40, 2, 0.0)):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in texts(n, seed, noise=noise)))
    summary = fit(recipe(folder))
    return folder, summary


def test_fit_learns_and_keeps_the_label_names_in_the_run_and_the_checkpoint(run):
    folder, summary = run
    assert 0.6 <= summary.head_scores["val_acc"] < 1 and "val_f1" in summary.head_scores  # 40 steps: words of two kinds, noisy labels
    assert load_recipe(f"{summary.run_dir}/recipe.yaml").model.head.labels == ["fruit", "vehicle"]
    assert load_checkpoint(summary.run_dir, device="cpu").recipe.model.head.labels == ["fruit", "vehicle"]
    assert any(line.startswith("last validation macro-F1") for line in summary.lines())
    # Accuracy as a percentage, as a language model's summary, the console and `tfbuilder test` show it.
    accuracy = next(line for line in summary.lines() if line.startswith("last validation accuracy"))
    assert accuracy.endswith(f"  {summary.head_scores['val_acc']:.2%}")


def test_predict_writes_a_label_and_probabilities_per_input(run, tmp_path, capsys, monkeypatch):
    folder, summary = run
    lines = tmp_path / "in.txt"
    lines.write_text("apple lemon\nbus boat train\n")
    assert main(["predict", summary.run_dir, "--input", str(lines)]) == 0
    answers = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [a["label"] for a in answers] == ["fruit", "vehicle"]
    assert all(sum(a["probabilities"].values()) == pytest.approx(1, abs=1e-5) for a in answers)
    out = tmp_path / "out.jsonl"
    assert main(["predict", summary.run_dir, "--input", str(folder / "test.jsonl"), "--output", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 40
    assert main(["predict", summary.run_dir, "--input", str(lines), "--output", str(out)]) == 2  # never overwritten
    assert "not overwriting" in capsys.readouterr().err and len(out.read_text().splitlines()) == 40
    monkeypatch.setattr("sys.stdin", io.StringIO("lemon mango\n"))
    assert main(["predict", summary.run_dir, "--input", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["label"] == "fruit"


def test_test_prints_accuracy_and_macro_f1(run, capsys):
    _, summary = run
    assert main(["test", summary.run_dir, "--split", "val"]) == 0  # best.ckpt: the last validation's (40 texts, 2 batches)
    shown = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert float(shown["accuracy"].rstrip("%")) / 100 == pytest.approx(summary.head_scores["val_acc"], abs=1e-6)
    assert float(shown["macro-F1"]) == pytest.approx(summary.head_scores["val_f1"], abs=1e-4)


def test_an_unknown_label_in_the_test_split_is_named(run, tmp_path, capsys):
    folder, summary = run
    bad = tmp_path / "data"
    bad.mkdir()
    for split in ("train", "val"):
        (bad / f"{split}.jsonl").write_text((folder / f"{split}.jsonl").read_text())
    (bad / "test.jsonl").write_text(json.dumps({"text": "apple", "label": "fruit"}) + "\n" + json.dumps({"text": "ship", "label": "boat"}) + "\n")
    checkpoint = load_checkpoint(summary.run_dir, device="cpu")
    checkpoint.recipe.data.path = str(bad)
    from tfbuilder.errors import DataError
    from tfbuilder.use.predict import score

    with pytest.raises(DataError, match=r"test\.jsonl: record 2: label 'boat' is not one of the model's labels \('fruit', 'vehicle'\)"):
        score(checkpoint, "test")


def test_a_model_without_a_head_predicts_nothing(tmp_path, capsys):
    from tfbuilder import atomic
    from tfbuilder.model.builder import build_model
    from tfbuilder.data.prepare import Vocab
    from tfbuilder.data.tokenizers import CharTokenizer
    from tfbuilder.interop.hf.convert import checkpoint_dict

    language_model = recipe_from_dict({"model": {"kind": "encoder", "vocab_size": 8, "d_model": 8, "attention": {"type": "multihead", "heads": 1}, "encoder": {"layers": 1}}})
    model = build_model(language_model)
    tok = CharTokenizer("abc")
    atomic.save(checkpoint_dict(model, language_model, Vocab(tok, tok), source="test"), tmp_path / "lm.ckpt")
    lines = tmp_path / "in.txt"
    lines.write_text("abc\n")
    assert main(["predict", str(tmp_path / "lm.ckpt"), "--input", str(lines)]) == 2
    assert "has no sequence head" in capsys.readouterr().err


def test_the_sweep_report_shows_the_head_scores(run):
    _, summary = run
    from pathlib import Path

    table = markdown(group(read_runs([Path(summary.run_dir)], warn=lambda line: None)))
    assert "val acc %" in table and "val F1" in table and "val PPL" not in table


def test_a_regress_head_trains_tests_and_predicts_numbers(run, tmp_path, capsys):
    folder, _ = run
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val"):  # the label becomes a number: 1 for fruit, 0 for vehicles
        rows = [json.loads(line) for line in (folder / f"{split}.jsonl").read_text().splitlines()]
        (data / f"{split}.jsonl").write_text("".join(json.dumps({"text": r["text"], "label": float(r["label"] == "fruit")}) + "\n" for r in rows))
    r = recipe(data).to_dict()
    r["model"]["head"] = {"type": "regress", "pooling": "mean"}
    r["trainer"]["monitor"] = "val_mse"
    summary = fit(recipe_from_dict(r))
    assert set(summary.head_scores) == {"val_mse", "val_pearson"} and summary.head_scores["val_pearson"] > 0.3  # at most 0.6 with 20% of the labels flipped
    assert main(["test", summary.run_dir, "--split", "val"]) == 0
    shown = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines() if not line.startswith("Pearson"))
    assert float(shown["MSE"]) == pytest.approx(summary.head_scores["val_mse"], abs=1e-4)
    lines = tmp_path / "in.txt"
    lines.write_text("apple\nbus\n")
    assert main(["predict", summary.run_dir, "--input", str(lines)]) == 0
    values = [json.loads(x)["value"] for x in capsys.readouterr().out.splitlines()]
    assert len(values) == 2 and values[0] > values[1]


def test_pairs_are_cut_longest_first_to_fit_the_positions():
    from types import SimpleNamespace

    from tfbuilder.data.tokenizers import CharTokenizer
    from tfbuilder.use.predict import _encoded

    tok = CharTokenizer("abcdefgh")
    model = recipe_from_dict({"model": {"kind": "encoder", "vocab_size": 13, "d_model": 8, "position": {"type": "learned", "max_len": 9},
                                        "attention": {"type": "multihead", "heads": 1}, "encoder": {"layers": 1}}}).model
    from tfbuilder.specials import OWN

    loaded = SimpleNamespace(vocab=SimpleNamespace(src=tok, specials=OWN), recipe=SimpleNamespace(model=model))
    # 9 positions: <s> text </s> pair </s> leaves 6 tokens; "abcdefg" + "ab" (9) loses 3 from the longer text.
    batch = _encoded(loaded, [("abcdefg", "ab"), ("abc", "h")])
    assert batch["tokens"].tolist() == [[1, 5, 6, 7, 8, 2, 5, 6, 2], [1, 5, 6, 7, 2, 12, 2, 0, 0]]
    assert batch["token_types"][0].tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1]
    single = _encoded(loaded, [("abcdefgh", None)])
    assert single["tokens"].tolist() == [[1, 5, 6, 7, 8, 9, 10, 11, 2]]  # 7 tokens kept: the beginning
