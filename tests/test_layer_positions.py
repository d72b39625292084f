"""Positions that differ per layer (a layer kind's or override's ``position`` changes): each layer's
self-attention turns with its own params (Gemma 3's local and global rotary bases, against transformers'
Gemma3RotaryEmbedding), layers with the same params share one module, and changes that cannot act per
layer are refused where they were written."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model

import tfbuilder
from tfbuilder.errors import RecipeError
from tfbuilder.inference import decoding
from tfbuilder.spec.recipe import ModelSection, recipe_from_dict

GEMMA3_POSITION = {"type": "rotary", "base": 1_000_000.0, "pairing": "half", "scaling": {"type": "linear", "factor": 8.0}}
LOCAL = {"attention": {"window": 3}, "position": {"base": 10000.0, "scaling": None}}


def model_with(decoder: dict, position: dict | None = None, **model) -> torch.nn.Module:
    torch.manual_seed(0)
    spec = tiny_model(kind="decoder", encoder=None, placement="pre", position=position or GEMMA3_POSITION, **model)
    spec["decoder"] = decoder
    return tfbuilder.build_model(ModelSection.model_validate(spec)).eval()


def gemma3_like(**changes) -> torch.nn.Module:
    return model_with({"layers": 4, "kinds": {"local": LOCAL, "global": {}}, "pattern": ["local", "global"]} | changes)


def positions(model: torch.nn.Module) -> list:
    return [layer.self_attn.inner.position for layer in model.decoder.layers]


def test_each_layer_rotates_as_gemma3s_rotary_of_its_layer_type():
    """transformers' Gemma3RotaryEmbedding with rope_parameters per layer type (full attention: base 1e6,
    linear factor 8, Gemma 3 4B's; sliding attention: base 10000) against each layer's rotation, at
    positions 0..49 (past our table's end too)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding, apply_rotary_pos_emb

    model = gemma3_like()
    heads, k = 2, 8
    config = transformers.Gemma3TextConfig(
        hidden_size=heads * k, num_attention_heads=heads, num_key_value_heads=heads, head_dim=k, num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention"] * 2,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
    )
    rotary = Gemma3RotaryEmbedding(config)
    q = torch.randn(1, heads, 50, k)
    for layer, layer_type, position in zip(range(4), config.layer_types, positions(model), strict=True):
        cos, sin = rotary(q, torch.arange(50)[None], layer_type)
        want, _ = apply_rotary_pos_emb(q, q, cos, sin)
        torch.testing.assert_close(position.rotate(q, 0), want, atol=1e-5, rtol=1e-5, msg=f"layer {layer}")


def rotated(x: list[float], pos: int, *, base: float, factor: float = 1.0) -> list[float]:
    """Pairing half: pair (x_i, x_i+k/2) turned by pos / factor * base^(-2i/k)."""
    k, out = len(x), list(x)
    for i in range(k // 2):
        theta = pos / factor * base ** (-2 * i / k)
        out[i] = x[i] * math.cos(theta) - x[i + k // 2] * math.sin(theta)
        out[i + k // 2] = x[i] * math.sin(theta) + x[i + k // 2] * math.cos(theta)
    return out


def test_each_layer_uses_its_own_base_and_same_params_share_one_module():
    """Local layers (0, 2) turn at base 10000 unscaled, global ones (1, 3) as model.position; the two
    local layers share one module, owned by the stack; the global layers use the embedding's."""
    model = gemma3_like()
    local, global_, local2, global2 = positions(model)
    assert local is local2 and global_ is global2 is model.embed.position and local is not global_
    assert list(model.decoder.positions) == [local]  # saved and moved with the stack
    x = torch.randn(1, 1, 5, 8)
    for module, base, factor in ((local, 10000.0, 1.0), (global_, 1_000_000.0, 8.0)):
        want = [[[rotated(x[0, 0, t].tolist(), t + 2, base=base, factor=factor) for t in range(5)]]]
        torch.testing.assert_close(module.rotate(x, 2), torch.tensor(want), atol=1e-5, rtol=0)


def test_a_layers_position_change_changes_the_models_output_and_decodes_with_a_cache():
    """The same weights with and without the local layers' base: different logits; with it, decoding
    step by step with a cache gives the full forward's logits."""
    model = gemma3_like()
    tokens = torch.randint(5, 53, (2, 9))
    same = gemma3_like(kinds={"local": {"attention": {"window": 3}}, "global": {}})
    same.load_state_dict(model.state_dict())
    with torch.no_grad():
        full = model(tokens)
        assert not torch.allclose(full, same(tokens), atol=1e-4)
        torch.testing.assert_close(decoding.incremental_logits(model, tokens), full, atol=1e-5, rtol=1e-5)


def test_an_override_gives_one_layer_no_position_and_another_alibi():
    """{type: none}: a NoPE layer (no position in its attention); a position type acting inside attention
    may replace the model's for one layer."""
    model = model_with({"layers": 3, "overrides": {0: {"position": {"type": "none"}}, -1: {"position": {"type": "alibi"}}}},
                       position={"type": "rotary"})
    first, middle, last = positions(model)
    assert first is None and middle is model.embed.position and last is not None and last.biases
    model(torch.randint(5, 53, (1, 6))).sum().backward()


def test_a_layers_relative_bias_is_its_own_trained_table():
    model = model_with({"layers": 2, "overrides": {1: {"position": {"buckets": 8}}}}, position={"type": "relative_bias"})
    keys = [k for k in model.state_dict() if k.endswith("table.weight")]
    assert keys == ["embed.position.table.weight", "decoder.positions.0.table.weight"]
    assert positions(model)[1].table.weight.shape == (8, 4)


@pytest.mark.parametrize("position, change, message", [
    ({"type": "sinusoidal"}, {"base": 500.0},
     r"decoder\.kinds\.local\.position: model\.position \(sinusoidal\) is added to the embeddings once, for every layer; "
     r"only a position acting inside attention \(alibi, relative_bias, rotary\) can differ per layer"),
    ({"type": "rotary"}, {"type": "learned"},
     r"decoder\.kinds\.local\.position\.type: a layer's position must act inside its attention .* or be none; 'learned'"),
    ({"type": "rotary"}, {"buckets": 4}, r"decoder\.kinds\.local\.position\.buckets: Extra inputs are not permitted"),
    ({"type": "rotary"}, {"scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0], "original_max_position_embeddings": 8, "factor": 2.0}},
     r"decoder\.kinds\.local\.position\.scaling: short_factor and long_factor have 1 entries; the 8 rotated features per head make 4 pairs"),
], ids=["additive-model-position", "to-learned", "unknown-key", "longrope-width"])
def test_position_changes_that_cannot_apply_are_refused_where_written(position, change, message):
    spec = tiny_model(kind="decoder", encoder=None, position=position)
    spec["decoder"] = {"layers": 2, "kinds": {"local": {"position": change}, "global": {}}, "pattern": ["local", "global"]}
    with pytest.raises(RecipeError, match=message):
        recipe_from_dict({"name": "x", "model": spec})


def test_an_encoder_decoders_stacks_each_take_the_change_over_their_sides_position():
    spec = tiny_model(position={"type": "rotary"})
    spec["encoder"] = {"layers": 2, "overrides": {1: {"position": {"base": 100.0}}}}
    model = tfbuilder.build_model(ModelSection.model_validate(spec))
    encoder = [layer.self_attn.inner.position for layer in model.encoder.layers]
    assert encoder[0] is model.src_embed.position and encoder[1].base == 100.0
    assert all(layer.self_attn.inner.position is model.tgt_embed.position for layer in model.decoder.layers)


def test_show_prints_each_kinds_position_change(tmp_path, capsys):
    import yaml

    from tfbuilder.cli.commands import main

    path = tmp_path / "gemma3.yaml"
    spec = tiny_model(kind="decoder", encoder=None, placement="pre", position=GEMMA3_POSITION)
    spec["decoder"] = {"layers": 4, "kinds": {"local": LOCAL, "global": {}}, "pattern": ["local", "global"]}
    path.write_text(yaml.safe_dump({"name": "g", "model": spec}))
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out.split("# layers (pattern and overrides)\n")[1]
    assert "  kind local: attention.window=3, position.base=10000.0, position.scaling=None\n" in out
