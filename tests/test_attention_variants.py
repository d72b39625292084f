"""The 2024-2025 attention variants against their papers' equations, written out here from the
papers (not by calling the implementation): soft-capped scores (Gemma 2), and each variant with
grouped-query heads, rotary positions, every norm placement and the key/value cache."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

import tfbuilder
from conftest import tiny_model
from tfbuilder.inference import decoding
from tfbuilder.model.components.attention import MultiHeadAttention
from tfbuilder.model.components.differential import DifferentialAttention
from tfbuilder.spec.recipe import ModelSection
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


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["per-head", "multi-query"])
def test_differential_attention_is_the_papers_difference_of_two_softmaxes(kv_heads):
    """Ye et al. 2025 (arXiv:2410.05258), sec. 2.1, for head i of layer l (here l = 3):
    [Q1; Q2] = X W_Q, [K1; K2] = X W_K, V = X W_V (2d wide),
    head_i = (softmax(Q1 K1^T / sqrt(d)) - lambda softmax(Q2 K2^T / sqrt(d))) V,
    lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init, lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)),
    out = W_O concat_i((1 - lambda_init) RMSNorm(head_i))."""

    h, d = 2, D // 4  # two heads; each query/key half d = 4, values 2d = 8
    params = DifferentialAttention.Params(heads=h, kv_heads=kv_heads)
    attn = DifferentialAttention(params, BuildContext(d_model=D, causal=True, layer=2, num_layers=4)).eval()
    with torch.no_grad():
        attn.head_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, D)
    q, k, v = attn.to_qkv(x).split([h * 2 * d, kv_heads * 2 * d, kv_heads * 2 * d], dim=-1)
    init = 0.8 - 0.6 * torch.exp(torch.tensor(-0.3 * (3 - 1)))
    lam = torch.exp(attn.lambda_q1 @ attn.lambda_k1) - torch.exp(attn.lambda_q2 @ attn.lambda_k2) + init
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1)
    heads = []
    for i in range(h):
        g = i // (h // kv_heads)
        qi, ki, vi = q[..., i * 2 * d : (i + 1) * 2 * d], k[..., g * 2 * d : (g + 1) * 2 * d], v[..., g * 2 * d : (g + 1) * 2 * d]
        a1 = (qi[..., :d] @ ki[..., :d].transpose(-1, -2) / d**0.5).masked_fill(mask, float("-inf")).softmax(-1)
        a2 = (qi[..., d:] @ ki[..., d:].transpose(-1, -2) / d**0.5).masked_fill(mask, float("-inf")).softmax(-1)
        head = (a1 - lam * a2) @ vi
        head = head / head.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt() * attn.head_norm.weight
        heads.append((1 - init) * head)
    torch.testing.assert_close(attn(x), attn.to_out(torch.cat(heads, dim=-1)), atol=1e-5, rtol=1e-5)
    assert attn.lambda_init == pytest.approx(float(init))


def differential_as_in_multihead_diffattn(attn: DifferentialAttention, x: torch.Tensor, h: int, kv_heads: int) -> torch.Tensor:
    """The authors' plain implementation (microsoft/unilm, Diff-Transformer/multihead_diffattn.py),
    written from its equations: queries (b, 2h, n, d), keys (b, 2 kv_heads, n, d) and values
    (b, kv_heads, n, 2d) from the projections; keys and values repeated h / kv_heads times each
    (repeat_kv), so that softmax map m reads key map m // (h / kv_heads) and head i value group
    i // (h / kv_heads); maps viewed as (b, h, 2, n, n), map 1 minus lambda times map 2, times the values,
    RMSNorm over 2d, times (1 - lambda_init), heads concatenated, out_proj."""
    b, n, _ = x.shape
    d = attn.key_dim
    rep = h // kv_heads
    q, k, v = attn.to_qkv(x).split([2 * h * d, 2 * kv_heads * d, 2 * kv_heads * d], dim=-1)
    q = q.view(b, n, 2 * h, d).transpose(1, 2)
    k = k.view(b, n, 2 * kv_heads, d).transpose(1, 2)
    v = v.view(b, n, kv_heads, 2 * d).transpose(1, 2)
    k = k[:, :, None].expand(b, 2 * kv_heads, rep, n, d).reshape(b, 2 * h, n, d)
    v = v[:, :, None].expand(b, kv_heads, rep, n, 2 * d).reshape(b, h, n, 2 * d)
    scores = (q * d**-0.5) @ k.transpose(-1, -2) + torch.full((n, n), float("-inf")).triu(1)
    weights = scores.softmax(-1).view(b, h, 2, n, n)
    lam = torch.exp((attn.lambda_q1 * attn.lambda_k1).sum()) - torch.exp((attn.lambda_q2 * attn.lambda_k2).sum()) + attn.lambda_init
    out = (weights[:, :, 0] - lam * weights[:, :, 1]) @ v
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + 1e-5) * attn.head_norm.weight
    out = (out * (1 - attn.lambda_init)).transpose(1, 2).reshape(b, n, h * 2 * d)
    return attn.to_out(out)


@pytest.mark.parametrize(("h", "kv_heads"), [(4, 2), (4, 1), (3, 1), (4, 4)], ids=["gqa", "mqa", "odd-ratio", "per-head"])
def test_differential_kv_layout_repeat_is_the_authors_multihead_diffattn(h, kv_heads):
    """kv_layout repeat: the authors' multihead_diffattn.py, grouped-query keys included."""
    torch.manual_seed(0)
    d_model = 8 * h
    params = DifferentialAttention.Params(heads=h, kv_heads=kv_heads, kv_layout="repeat")
    attn = DifferentialAttention(params, BuildContext(d_model=d_model, causal=True, layer=1, num_layers=2)).eval()
    with torch.no_grad():
        attn.head_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, d_model)
    torch.testing.assert_close(attn(x), differential_as_in_multihead_diffattn(attn, x, h, kv_heads), atol=1e-5, rtol=1e-5)


def test_differential_kv_layouts_differ_only_with_grouped_keys():
    """pairs (default) and repeat agree when every head has its own keys, and not when heads share them."""
    x = torch.randn(2, 5, 32)
    for kv_heads, same in ((4, True), (2, False)):
        torch.manual_seed(0)
        pairs = DifferentialAttention(DifferentialAttention.Params(heads=4, kv_heads=kv_heads), BuildContext(d_model=32, causal=True))
        torch.manual_seed(0)
        params = DifferentialAttention.Params(heads=4, kv_heads=kv_heads, kv_layout="repeat")
        repeat = DifferentialAttention(params, BuildContext(d_model=32, causal=True))
        assert pairs.kv_layout == "pairs"
        assert torch.allclose(pairs(x), repeat(x)) is same


def test_differential_kv_layout_is_validated():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="kv_layout"):
        DifferentialAttention.Params(heads=4, kv_heads=2, kv_layout="interleaved")


def test_differential_attention_in_a_model_decodes_with_a_cache_as_without():
    torch.manual_seed(0)
    spec = tiny_model(kind="decoder", encoder=None, placement="pre", position={"type": "rotary"})
    spec["attention"] = {"type": "differential", "heads": 2, "kv_heads": 1}
    model = tfbuilder.build_model(ModelSection.model_validate(spec)).eval()
    tokens = torch.randint(5, 53, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(decoding.incremental_logits(model, tokens), model(tokens), atol=1e-5, rtol=1e-5)
    inits = [layer.self_attn.inner.lambda_init for layer in model.decoder.layers]
    assert inits == pytest.approx([0.8 - 0.6 * math.exp(-0.3 * l) for l in range(2)])
