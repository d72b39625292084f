"""Multi-head attention against its definition written out (Vaswani et al. 2017, sec. 3.2): the
look-ahead for any number of queries, with and without a cache, and query/key normalisation
(Henry et al. 2020: cosine similarity times a learned temperature, initialised to sqrt(d_k))."""

from __future__ import annotations

import math

import pytest
import torch

from tfbuilder.model.components.attention import MultiHeadAttention
from tfbuilder.registry import BuildContext

D, HEADS = 16, 2


def attention(*, causal: bool = True, **params) -> MultiHeadAttention:
    return MultiHeadAttention(MultiHeadAttention.Params(heads=HEADS, **params), BuildContext(d_model=D, causal=causal)).eval()


@pytest.mark.parametrize("n", [2, 3, 5])
def test_each_query_sees_only_itself_and_the_keys_before(n):
    """Row t of a causal forward over n tokens is the forward over the first t+1 tokens' last row."""
    attn = attention()
    x = torch.randn(2, n, D)
    with torch.no_grad():
        full = attn(x)
        for t in range(n):
            torch.testing.assert_close(full[:, t], attn(x[:, : t + 1])[:, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunks", [[1] * 6, [2, 2, 2], [3, 2, 1], [1, 3, 2]])
def test_a_cache_filled_in_chunks_gives_the_full_forward(chunks):
    """Prefill and decoding in chunks of any size (a chunk of several new queries at a cache offset
    needs the look-ahead inside the chunk): the rows equal those of one causal forward."""
    attn = attention()
    x = torch.randn(2, sum(chunks), D)
    cache: dict = {}
    with torch.no_grad():
        full = attn(x)
        start, rows = 0, []
        for size in chunks:
            rows.append(attn(x[:, start : start + size], cache=cache))
            start += size
    torch.testing.assert_close(torch.cat(rows, dim=1), full, atol=1e-5, rtol=1e-5)


def test_qk_norm_is_cosine_similarity_times_a_temperature():
    attn = attention(causal=False, qk_norm=True)
    dk = D // HEADS
    assert attn.qk_scale.item() == pytest.approx(math.sqrt(dk))
    with torch.no_grad():
        attn.qk_scale.fill_(2.7)
    x = torch.randn(1, 5, D)
    with torch.no_grad():
        q, k, v = attn.to_qkv(x).split(D, dim=-1)
        out = []
        for h in range(HEADS):
            part = slice(h * dk, (h + 1) * dk)
            qh, kh, vh = q[0, :, part], k[0, :, part], v[0, :, part]
            cosine = torch.tensor([[float(qh[i] @ kh[j] / (qh[i].norm() * kh[j].norm())) for j in range(5)] for i in range(5)])
            out.append((2.7 * cosine).softmax(dim=-1) @ vh)
        torch.testing.assert_close(attn(x)[0], attn.to_out(torch.cat(out, dim=-1)), atol=1e-5, rtol=1e-5)


def test_qk_rms_norm_normalises_each_heads_queries_and_keys_with_a_gain_per_channel_before_rotary():
    """Qwen3's q_norm/k_norm: x / sqrt(mean(x^2) + eps) * g over each head's d_k channels (one gain
    vector for queries, one for keys), then the rotation, then softmax(q k^T / sqrt(d_k)) v."""
    from tfbuilder.model.components.position import RotaryPosition

    dk, eps = D // HEADS, 1e-6
    rotary = RotaryPosition(RotaryPosition.Params(), BuildContext(d_model=D, heads=HEADS))
    params = MultiHeadAttention.Params(heads=HEADS, qk_norm="rms", qk_norm_eps=eps)
    attn = MultiHeadAttention(params, BuildContext(d_model=D, causal=False, position=rotary)).eval()
    assert attn.qk_scale is None and attn.q_norm.weight.shape == (dk,)
    with torch.no_grad():
        attn.q_norm.weight.copy_(torch.rand(dk) + 0.5)
        attn.k_norm.weight.copy_(torch.rand(dk) * 3)
    x = torch.randn(1, 5, D) * 4

    def rms(t, gain):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + eps) * gain

    with torch.no_grad():
        q, k, v = attn.to_qkv(x).split(D, dim=-1)
        out = []
        for h in range(HEADS):
            part = slice(h * dk, (h + 1) * dk)
            qh = rotary.rotate(rms(q[:, :, part], attn.q_norm.weight)[:, None], 0)[0, 0]
            kh = rotary.rotate(rms(k[:, :, part], attn.k_norm.weight)[:, None], 0)[0, 0]
            out.append((qh @ kh.T / math.sqrt(dk)).softmax(dim=-1) @ v[0, :, part])
        torch.testing.assert_close(attn(x)[0], attn.to_out(torch.cat(out, dim=-1)), atol=1e-5, rtol=1e-5)


def test_qk_rms_norm_decodes_with_a_cache_as_the_full_forward():
    attn = attention(qk_norm="rms")
    with torch.no_grad():
        attn.k_norm.weight.copy_(torch.rand(D // HEADS) * 2)
        x = torch.randn(2, 5, D)
        cache: dict = {}
        rows = [attn(x[:, t : t + 1], cache=cache) for t in range(5)]
        torch.testing.assert_close(torch.cat(rows, dim=1), attn(x), atol=1e-5, rtol=1e-5)


def test_qk_rms_norm_over_all_heads_normalises_the_whole_projections_before_rotary():
    """OLMo 2's q_norm/k_norm (arXiv:2501.00656; transformers' Olmo2Attention): one RMS norm over all
    h * d_k channels of the query projection (a gain per channel), one over the key projection's, then
    the split into heads, the rotation and softmax(q k^T / sqrt(d_k)) v."""
    from tfbuilder.model.components.position import RotaryPosition

    dk, eps = D // HEADS, 1e-6
    rotary = RotaryPosition(RotaryPosition.Params(), BuildContext(d_model=D, heads=HEADS))
    params = MultiHeadAttention.Params(heads=HEADS, qk_norm="rms", qk_norm_eps=eps, qk_norm_over="all")
    attn = MultiHeadAttention(params, BuildContext(d_model=D, causal=False, position=rotary)).eval()
    assert attn.q_norm.weight.shape == (D,) and attn.k_norm.weight.shape == (D,)
    with torch.no_grad():
        attn.q_norm.weight.copy_(torch.rand(D) + 0.5)
        attn.k_norm.weight.copy_(torch.rand(D) * 3)
    x = torch.randn(1, 5, D) * 4

    def rms(t, gain):
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + eps) * gain

    with torch.no_grad():
        q, k, v = attn.to_qkv(x).split(D, dim=-1)
        q, k = rms(q, attn.q_norm.weight), rms(k, attn.k_norm.weight)
        out = []
        for h in range(HEADS):
            part = slice(h * dk, (h + 1) * dk)
            qh = rotary.rotate(q[:, :, part][:, None], 0)[0, 0]
            kh = rotary.rotate(k[:, :, part][:, None], 0)[0, 0]
            out.append((qh @ kh.T / math.sqrt(dk)).softmax(dim=-1) @ v[0, :, part])
        torch.testing.assert_close(attn(x)[0], attn.to_out(torch.cat(out, dim=-1)), atol=1e-5, rtol=1e-5)


def test_qk_norm_over_all_needs_rms():
    from tfbuilder.registry import ModelDims

    params = MultiHeadAttention.Params(heads=HEADS, qk_norm=True, qk_norm_over="all")
    assert ("qk_norm_over", "all normalises with an RMS norm: set qk_norm: rms") in params.check(ModelDims(d_model=D))


@pytest.mark.parametrize("cross", [False, True])
def test_bias_qkv_biases_the_query_key_and_value_projections_only(cross):
    """Qwen2's attention: biases on q, k and v, none on the output projection."""
    attn = MultiHeadAttention(MultiHeadAttention.Params(heads=HEADS, bias="qkv"), BuildContext(d_model=D, cross=cross))
    inputs = [attn.to_q, attn.to_kv] if cross else [attn.to_qkv]
    assert all(linear.bias is not None for linear in inputs) and attn.to_out.bias is None
    full = MultiHeadAttention(MultiHeadAttention.Params(heads=HEADS, bias=True), BuildContext(d_model=D, cross=cross))
    assert full.to_out.bias is not None
    assert sum(p.numel() for p in full.parameters()) - sum(p.numel() for p in attn.parameters()) == D
