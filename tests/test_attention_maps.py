"""tfbuilder attention: one PNG per layer and kind, holding (and drawing) the weights the model computes."""

from __future__ import annotations

import json
import math

import pytest
import torch
from einops import rearrange
from PIL import Image

import tfbuilder
from conftest import tiny_model
from tfbuilder.use.attention_maps import METADATA_KEY, attention_modules, attention_weights, plot
from tfbuilder.cli.commands import main
from tfbuilder.data.tokenizers import BOS, EOS
from tfbuilder.spec.recipe import ModelSection


@pytest.fixture(scope="module")
def checkpoint(quickstart_run) -> str:
    """The quick-start run (conftest.py): a trained model, whose translations end where they should."""
    return str(quickstart_run)


def by_hand(module, x, context=None, mask=None) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d_k)) of one attention module from its own projections: (h, i, j)."""
    if context is None:
        q, k, _ = module.to_qkv(x).split(module.split, dim=-1)
    else:
        q = module.to_q(x)
        k, _ = module.to_kv(context).split(module.split[1:], dim=-1)
    q = rearrange(q, "b i (h k) -> b h i k", h=module.heads)
    k = rearrange(k, "b j (h k) -> b h j k", h=module.kv_heads)
    scores = q @ k.transpose(-2, -1) / math.sqrt(module.key_dim)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1)[0]


def test_a_png_per_requested_layer_holds_the_weights_the_model_computes(checkpoint, tmp_path, capsys):
    loaded = tfbuilder.load_checkpoint(checkpoint)
    src, tgt = "abcab", "abca"
    assert main(["attention", checkpoint, "--src", src, "--tgt", tgt, "--layers", "1", "--out", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["decoder-cross-L1.png", "decoder-self-L1.png", "encoder-self-L1.png"]
    assert capsys.readouterr().out.split() == [str(tmp_path / n) for n in ("encoder-self-L1.png", "decoder-self-L1.png", "decoder-cross-L1.png")]

    # The same layer's weights, recomputed from its projections and the inputs it received.
    model = loaded.model.eval()
    src_ids = torch.tensor([loaded.vocab.src.encode(src) + [EOS]])
    tgt_ids = torch.tensor([[BOS] + loaded.vocab.tgt.encode(tgt)])
    seen = {}
    modules = attention_modules(model)
    hooks = [
        modules[name].register_forward_pre_hook(lambda m, args, kwargs, name=name: seen.setdefault(name, (args, kwargs)), with_kwargs=True)
        for name in ("encoder-self-L1", "decoder-self-L1", "decoder-cross-L1")
    ]
    with torch.no_grad():
        model(src_ids, tgt_ids)
        n = tgt_ids.shape[1]
        expected = {
            "encoder-self-L1": by_hand(modules["encoder-self-L1"], seen["encoder-self-L1"][0][0]),
            "decoder-self-L1": by_hand(
                modules["decoder-self-L1"], seen["decoder-self-L1"][0][0], mask=torch.ones(n, n, dtype=torch.bool).tril()
            ),
            "decoder-cross-L1": by_hand(
                modules["decoder-cross-L1"], seen["decoder-cross-L1"][0][0], context=seen["decoder-cross-L1"][1]["context"]
            ),
        }
    for hook in hooks:
        hook.remove()
    for name, want in expected.items():
        image = Image.open(tmp_path / f"{name}.png")
        stored = torch.tensor(json.loads(image.info[METADATA_KEY]))
        torch.testing.assert_close(stored, want, atol=1e-6, rtol=1e-5)
        assert image.size[0] > 200 and image.size[1] > 100  # a picture, not an empty file
    assert main(["attention", checkpoint, "--src", src, "--layers", "1", "--out", str(tmp_path)]) == 2  # never overwritten
    assert "not overwriting" in capsys.readouterr().err


def test_the_picture_draws_the_weights():
    weights = torch.softmax(torch.randn(4, 3, 5), dim=-1)
    fig = plot(weights, ["q0", "q1", "q2"], list("abcde"), title="t")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 4
    for head, ax in enumerate(panels):
        torch.testing.assert_close(torch.tensor(ax.images[0].get_array()), weights[head])
        assert [t.get_text() for t in ax.get_xticklabels()] == list("abcde")
        assert [t.get_text() for t in ax.get_yticklabels()] == ["q0", "q1", "q2"]


def test_without_a_target_the_models_translation_is_shown(checkpoint, tmp_path):
    assert main(["attention", checkpoint, "--src", "abc", "--out", str(tmp_path)]) == 0
    # 2 layers x (encoder self, decoder self, cross)
    assert len(list(tmp_path.glob("*.png"))) == 6


def test_decoder_only_models_have_causal_self_attention_maps():
    torch.manual_seed(0)
    model = tfbuilder.build_model(ModelSection.model_validate(tiny_model(kind="decoder", encoder=None)))
    weights = attention_weights(model, torch.randint(5, 50, (1, 6)))
    assert sorted(weights) == [f"decoder-self-L{i}" for i in range(len(model.decoder.layers))]
    for w in weights.values():
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
        assert torch.all(w.triu(diagonal=1) == 0)  # no query sees a later token
    assert all(not m.keep_weights for m in attention_modules(model).values())  # left as it was


def test_bad_requests_exit_2(checkpoint, tmp_path, capsys):
    assert main(["attention", checkpoint, "--src", "abc", "--layers", "7", "--out", str(tmp_path)]) == 2
    assert "no layer 7: layers are 0..1" in capsys.readouterr().err
    assert main(["attention", str(tmp_path / "missing.ckpt"), "--src", "abc"]) == 2
    assert "Traceback" not in capsys.readouterr().err
