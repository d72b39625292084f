"""The 2024-2025 attention variants against their papers' equations, written out here from the
papers (not by calling the implementation): soft-capped scores (Gemma 2), and each variant with
grouped-query heads, rotary positions, every norm placement and the key/value cache."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

import tfbuilder
from conftest import tiny_model
from tfbuilder import decoding
from tfbuilder.components.attention import MultiHeadAttention
from tfbuilder.recipe import ModelSection
from tfbuilder.registry import BuildContext

D, HEADS = 16, 2


def attention(*, causal: bool = True, **params) -> MultiHeadAttention:
    return MultiHeadAttention(MultiHeadAttention.Params(heads=HEADS, **params), BuildContext(d_model=D, causal=causal)).eval()


def heads_of(x: torch.Tensor, heads: int = HEADS) -> torch.Tensor:
    return rearrange(x, "b n (h k) -> b h n k", h=heads)


def causal_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    n = q.shape[2]
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))


def test_softcap_is_cap_times_tanh_of_the_scores():
    """Gemma 2 (arXiv:2408.00118, sec. 2): scores <- cap * tanh(scores / cap), then mask and softmax."""
    attn = attention(softcap=0.7, bias=False)
    x = 3 * torch.randn(2, 5, D)  # large scores: the cap bites
    q, k, v = (heads_of(t) for t in attn.to_qkv(x).split(D, dim=-1))
    scores = q @ k.transpose(-1, -2) / (D // HEADS) ** 0.5
    scores = 0.7 * torch.tanh(scores / 0.7)
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    expected = attn.to_out(rearrange(scores.softmax(-1) @ v, "b h n v -> b n (h v)"))
    torch.testing.assert_close(attn(x), expected, atol=1e-5, rtol=1e-5)
    uncapped = attn.to_out(rearrange(causal_scores(q, k).softmax(-1) @ v, "b h n v -> b n (h v)"))
    assert not torch.allclose(expected, uncapped, atol=1e-3)  # the cap made a difference here


@pytest.mark.parametrize("gate", ["elementwise", "headwise"])
def test_gated_attention_multiplies_each_heads_output_by_a_sigmoid_of_the_input(gate):
    """Qiu et al. 2025 (arXiv:2505.06708), G1: Y' = Y * sigmoid(X W_theta), Y the SDPA output of each
    head, X the attention's input; W_theta is d x (h d_v) (elementwise) or d x h (headwise)."""
    attn = attention(gate=gate)
    x = torch.randn(2, 5, D)
    q, k, v = (heads_of(t) for t in attn.to_qkv(x).split(D, dim=-1))
    y = causal_scores(q, k).softmax(-1) @ v  # (b, h, n, d_v)
    w = attn.to_gate.weight  # (outputs, d)
    assert w.shape == ((D if gate == "elementwise" else HEADS), D) and attn.to_gate.bias is None
    g = torch.sigmoid(x @ w.T)
    g = heads_of(g) if gate == "elementwise" else rearrange(g, "b n h -> b h n 1")
    expected = attn.to_out(rearrange(y * g, "b h n v -> b n (h v)"))
    torch.testing.assert_close(attn(x), expected, atol=1e-5, rtol=1e-5)


OPTIONS = [{"softcap": 5.0}, {"gate": "elementwise"}, {"gate": "headwise"}, {"value_residual": "learnable"}]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("placement", ["pre", "post", "sandwich"])
def test_cached_decoding_equals_uncached_with_gqa_and_rotary(options, placement):
    torch.manual_seed(0)
    spec = tiny_model(kind="decoder", encoder=None, placement=placement, position={"type": "rotary"})
    spec["attention"] = {"type": "multihead", "heads": 4, "kv_heads": 2, **options}
    model = tfbuilder.build_model(ModelSection.model_validate(spec)).eval()
    tokens = torch.randint(5, 53, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(decoding.incremental_logits(model, tokens), model(tokens), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["fixed", "learnable"])
def test_value_residual_mixes_the_first_layers_values_into_every_later_layer(mode):
    """ResFormer (Zhou et al. 2024, arXiv:2410.17897): layer n >= 2 attends with its own attention
    weights over V'_n = lambda1 * V_1 + lambda2 * V_n, V_1 = the first layer's values (of its input)."""
    torch.manual_seed(0)
    spec = tiny_model(kind="decoder", encoder=None, placement="pre", decoder={"layers": 3})
    spec["attention"] = {"type": "multihead", "heads": HEADS, "bias": False, "value_residual": mode, "value_lambdas": [0.3, 0.9]}
    model = tfbuilder.build_model(ModelSection.model_validate(spec)).eval()
    tokens = torch.randint(5, 53, (2, 5))
    x = model.embed(tokens)
    v1 = None
    for n, layer in enumerate(model.decoder.layers):
        attn = layer.self_attn.inner
        h = layer.self_attn.norm(x)
        q, k, v = (heads_of(t, HEADS) for t in attn.to_qkv(h).split(32, dim=-1))
        if n == 0:
            v1 = v
        else:
            v = 0.3 * v1 + 0.9 * v
        y = attn.to_out(rearrange(causal_scores(q, k).softmax(-1) @ v, "b h n v -> b n (h v)"))
        x = layer.ffn(x + y)
    torch.testing.assert_close(model(tokens), model.head(model.decoder.final_norm(x)), atol=1e-5, rtol=1e-5)
    lambdas = [p for name, p in model.named_parameters() if "value_lambdas" in name]
    assert len(lambdas) == (2 if mode == "learnable" else 0)  # layers 2 and 3; the first layer has none
    assert all(layer.self_attn.inner._shared[0].first_values is None for layer in model.decoder.layers)  # nothing kept


def test_value_residual_compiles_across_layers_without_graph_breaks():
    import torch._dynamo

    torch.manual_seed(0)
    spec = tiny_model(kind="decoder", encoder=None, placement="pre", decoder={"layers": 2})
    spec["attention"] = {"type": "multihead", "heads": 4, "kv_heads": 2, "value_residual": "learnable"}
    model = tfbuilder.build_model(ModelSection.model_validate(spec))
    tokens = torch.randint(5, 53, (2, 6))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(tokens), model(tokens))
