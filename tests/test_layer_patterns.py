"""Per-layer patterns and overrides (a stack's ``kinds``, ``pattern`` and ``overrides``): each layer
gets the stack's components changed by its kind, then by its override; bad patterns are named where
they were written; patterned models decode with a cache as without, and compile as one graph."""

from __future__ import annotations

import pytest
import torch

import tfbuilder
from conftest import tiny_model
from tfbuilder.inference import decoding
from tfbuilder.cli.commands import main
from tfbuilder.model.components.ffn import MLP, SwiGLU
from tfbuilder.spec.recipe import ModelSection

GEMMA_LIKE = {
    "layers": 6,
    "kinds": {"local": {"attention": {"window": 2}}, "global": {}},
    "pattern": ["local", "local", "global"],
    "overrides": {0: {"ffn": {"type": "swiglu", "hidden": 16}}, -1: {"attention": {"softcap": 5.0}, "norm": {"eps": 1e-3}}},
}


def patterned(**changes) -> torch.nn.Module:
    torch.manual_seed(0)
    spec = tiny_model(kind="decoder", encoder=None, placement="pre", position={"type": "rotary"}, norm={"type": "rmsnorm"})
    spec["attention"] = {"type": "multihead", "heads": 4, "kv_heads": 2}
    spec["decoder"] = {**GEMMA_LIKE, **changes}
    return tfbuilder.build_model(ModelSection.model_validate(spec)).eval()


def test_each_layer_gets_its_kind_then_its_override():
    model = patterned()
    attentions = [layer.self_attn.inner for layer in model.decoder.layers]
    assert [a.window for a in attentions] == [2, 2, None, 2, 2, None]  # the pattern, repeated
    assert [a.softcap for a in attentions] == [None] * 5 + [5.0]  # -1: the last layer
    assert [a.kv_heads for a in attentions] == [2] * 6  # the stack's own params, kept under the changes
    ffns = [type(layer.ffn.inner) for layer in model.decoder.layers]
    assert ffns == [SwiGLU] + [MLP] * 5  # a kind or override naming another type starts from that type
    for residual in ("self_attn", "ffn"):  # both of a layer's norms
        assert [getattr(layer, residual).norm.eps for layer in model.decoder.layers] == [1e-6] * 5 + [1e-3]


def test_an_override_wins_over_the_pattern_on_the_field_both_set():
    """The rule (docs/recipes.md, "Layers that differ"): a layer's override is applied after its
    kind's changes, so where both set a field (here the window of a local layer) the override wins."""
    model = patterned(overrides={0: {"attention": {"window": 5}}, -2: {"attention": {"window": None}}})
    attentions = [layer.self_attn.inner for layer in model.decoder.layers]
    assert [a.window for a in attentions] == [5, 2, None, 2, None, None]  # layers 0 and 4 are local


def test_a_patterned_model_decodes_with_a_cache_as_without():
    model = patterned()
    tokens = torch.randint(5, 53, (2, 7))
    with torch.no_grad():
        full = model(tokens)
        torch.testing.assert_close(decoding.incremental_logits(model, tokens), full, atol=1e-5, rtol=1e-5)
        plain = patterned(kinds={"local": {}, "global": {}}, overrides={})(tokens)
    assert not torch.allclose(full, plain, atol=1e-4)  # the windows and overrides changed something


def test_a_patterned_model_compiles_as_one_graph():
    """Layers that differ, and value residual learning handing the first layer's values on (a side
    effect on the stack's scratch), in one graph."""
    import torch._dynamo

    torch.manual_seed(0)
    spec = tiny_model(kind="decoder", encoder=None, placement="pre", position={"type": "rotary"})
    spec["attention"] = {"type": "multihead", "heads": 4, "kv_heads": 2, "value_residual": "learnable"}
    spec["decoder"] = {**GEMMA_LIKE, "layers": 3, "overrides": {}}
    model = tfbuilder.build_model(ModelSection.model_validate(spec))
    tokens = torch.randint(5, 53, (2, 6))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(tokens), model(tokens))


BAD = """\
name: bad-pattern
model:
  kind: decoder
  vocab_size: 40
  d_model: 32
  attention: {type: multihead, heads: 4}
  decoder:
    layers: 4
    kinds:
      local: {attention: {window: 0}}
      global: {attention: {heads: 2}}
      spare: {}
    pattern: [local, local, local, globl]
    overrides: {4: {ffn: {hidden: 8}}, -1: {norm: {type: layernrom}}, 1: {attention: {value_residual: fixed}}}
"""


def test_bad_patterns_are_named_where_they_were_written(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    expected = [
        "bad.yaml:10:35: model.decoder.kinds.local.attention.window: Input should be greater than or equal to 1",
        "bad.yaml:11:27: model.decoder.kinds.global.attention: a layer's heads and key width must be the stack's",
        "bad.yaml:12:14: model.decoder.kinds.spare: kind 'spare' is not in decoder.pattern",
        "bad.yaml:13:36: model.decoder.pattern[3]: unknown layer kind 'globl' (kinds: global, local, spare); did you mean 'global'?",
        "bad.yaml:14:16: model.decoder.overrides[4]: no layer 4 in a stack of 4 layers (0 to 3, or -1 to -4)",
        "model.decoder.overrides[-1].norm.type: unknown norm type 'layernrom'; did you mean 'layernorm'?",
        "model.decoder.overrides[1].attention.value_residual: value_residual must be the stack's (none) in every layer",
    ]
    for line in expected:
        assert line in err, f"{line}\n--- got:\n{err}"


def test_show_prints_the_layers_compactly(tmp_path, capsys):
    import yaml

    path = tmp_path / "pattern.yaml"
    spec = tiny_model(kind="decoder", encoder=None, placement="pre")
    spec["decoder"] = GEMMA_LIKE
    path.write_text(yaml.safe_dump({"name": "p", "model": spec}))
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out.split("# layers (pattern and overrides)\n")[1]
    assert out.startswith("decoder: 0 local+override, 1 local, 2 global, 3-4 local, 5 global+override\n")
    assert "  kind local: attention.window=2\n" in out and "  layer -1: attention.softcap=5.0, norm.eps=0.001\n" in out


def test_the_preflight_counts_layers_that_differ_exactly():
    """Alike layers are extrapolated from one and two; a pattern's are counted all (a checkpoint's
    parameter count is checked against it before loading)."""
    from tfbuilder.model.sizing import count_parameters
    from tfbuilder.spec.recipe import Recipe

    spec = tiny_model(kind="decoder", encoder=None, placement="pre")
    kinds = {"small": {}, "wide": {"ffn": {"hidden": 200}}}
    spec["decoder"] = {"layers": 6, "kinds": kinds, "pattern": ["small", "wide", "wide"], "overrides": {2: {"ffn": {"hidden": 8}}}}
    recipe = Recipe.model_validate({"model": spec})
    assert count_parameters(recipe) == sum(p.numel() for p in tfbuilder.build_model(recipe).parameters())
