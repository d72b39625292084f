"""Decoding at the extremes: tiny temperatures, huge length penalties, and models whose learned
positions end before the length limit (decoding stops at the model's maximum length)."""

from __future__ import annotations

import pytest
import torch

import tfbuilder
import tfbuilder.cli.commands
from conftest import QUICKSTART, tiny_model
from hostile import assert_refused, run_cli
from tfbuilder.inference import decoding
from tfbuilder.model.builder import build_model
from tfbuilder.data.collate import pad
from tfbuilder.data.prepare import Vocab
from tfbuilder.data.synthetic import alphabet
from tfbuilder.data.tokenizers import CharTokenizer
from tfbuilder.spec.recipe import ModelSection

LEARNED = {"type": "learned", "max_len": 12}


def _model(kind: str = "encoder_decoder", position: dict | None = None):
    torch.manual_seed(0)
    spec = tiny_model(kind=kind, **({"encoder": None} if kind == "decoder" else {}))
    if position is not None:
        spec["position"] = position
    return tfbuilder.build_model(ModelSection.model_validate(spec)).eval()


@pytest.mark.parametrize("temperature", [1e-320, 1e-300, 1e-30])
def test_a_tiny_temperature_samples_the_most_likely_token(temperature):
    model = _model(kind="decoder")
    prompt = torch.tensor([[1, 9, 10]])
    greedy = decoding.sample(model, prompt, max_new=6, temperature=0)
    assert decoding.sample(model, prompt, max_new=6, temperature=temperature, generator=torch.Generator().manual_seed(0)) == greedy


def test_greedy_and_beam_stop_at_the_learned_table(tmp_path):
    model = _model(position=LEARNED)
    src = pad([[7, 8, 9]], eos=True)
    for hyp in (decoding.greedy(model, src)[0], decoding.beam_search(model, src, beam=3)[0]):
        assert len(hyp) < 12  # the closing </s> takes the last position
    sampled = decoding.sample(_model(kind="decoder", position=LEARNED), torch.tensor([[1, 9, 10]]), max_new=100)
    assert len(sampled[0]) <= 12 - 3


def _checkpoint(tmp_path, *overrides: str):
    recipe = tfbuilder.load_recipe(QUICKSTART, ["model.d_model=16", "model.attention.heads=2", "model.ffn.hidden=16",
                                                "model.encoder.layers=1", "model.decoder.layers=1", "data.test_size=3",
                                                "data.val_size=3", "data.lengths=[1, 6]", *overrides])  # fmt: skip
    torch.manual_seed(0)
    model = build_model(recipe)
    vocab = Vocab(CharTokenizer(alphabet(10)), CharTokenizer(alphabet(10)))
    data = {"tfbuilder": {"recipe": recipe.to_dict(), "vocab": vocab.to_json()}, "global_step": 1,
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}}  # fmt: skip
    path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    path.parent.mkdir(parents=True)
    torch.save(data, path)
    return path


def test_test_scores_a_model_with_learned_positions(tmp_path, capsys):
    path = _checkpoint(tmp_path, "model.position={type: learned, max_len: 12}")
    rc = tfbuilder.cli.commands.main(["test", str(path), "--beam", "2"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "Traceback" not in captured.err


def test_a_huge_length_penalty_is_refused(tmp_path, capsys):
    path = _checkpoint(tmp_path)
    assert_refused(run_cli(["test", str(path), "--alpha", "5000"], capsys), "--alpha", "must be between 0 and 10")
    rc = tfbuilder.cli.commands.main(["test", str(path), "--beam", "2", "--alpha", "10"])
    assert rc == 0, capsys.readouterr().err
