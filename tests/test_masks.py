"""Masks at their exact edges: the look-ahead and the sliding window (Beltagy et al. 2020; Jiang et al.
2023, Mistral: with window w, the query at i sees the w keys i-w+1 .. i, itself included, and not
i-w; an encoder sees w-1 keys on either side), alone, inside attention, and with a cache offset."""

from __future__ import annotations

import pytest
import torch

from tfbuilder import masks
from tfbuilder.model.components.attention import MultiHeadAttention
from tfbuilder.registry import BuildContext

D, N = 16, 10


def sees(query: int, key: int, *, window: int | None, causal: bool) -> bool:
    """Whether ``query`` may attend to ``key``, from the convention above."""
    if causal and key > query:
        return False
    return window is None or abs(query - key) <= window - 1


def expected(n_query: int, n_key: int, offset: int, *, window: int | None, causal: bool) -> torch.Tensor:
    return torch.tensor([[sees(offset + i, j, window=window, causal=causal) for j in range(n_key)] for i in range(n_query)])


@pytest.mark.parametrize("offset", [0, 5])
def test_causal_mask_lets_each_query_see_itself_and_the_keys_before(offset):
    got = masks.causal_mask(4, offset + 4, offset=offset)
    assert got.shape == (1, 1, 4, offset + 4)
    assert torch.equal(got[0, 0], expected(4, offset + 4, offset, window=None, causal=True))
    assert torch.equal(masks.causal_mask(3)[0, 0], torch.ones(3, 3, dtype=torch.bool).tril())


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("window", [1, 2, 3, 7])
@pytest.mark.parametrize("offset", [0, 6])
def test_window_mask_edge(window, causal, offset):
    """Keys at distance window-1 are in, at distance window out (behind, and ahead in encoders)."""
    n_key = offset + 5 if causal else 12
    got = masks.combine(masks.window_mask(5, n_key, window, offset=offset, causal=causal), masks.causal_mask(5, n_key, offset=offset) if causal else None)
    assert torch.equal(got[0, 0], expected(5, n_key, offset, window=window, causal=causal))


def attention(*, window: int, causal: bool) -> MultiHeadAttention:
    return MultiHeadAttention(MultiHeadAttention.Params(heads=2, window=window), BuildContext(d_model=D, causal=causal)).eval()


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("window", [1, 3, 4])
def test_attention_weights_fall_exactly_on_the_window(window, causal):
    attn = attention(window=window, causal=causal)
    attn.keep_weights = True
    with torch.no_grad():
        attn(torch.randn(2, N, D))
    assert torch.equal(attn.weights > 0, expected(N, N, 0, window=window, causal=causal).expand(2, 2, N, N))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_the_fused_kernel_ignores_the_key_just_outside_the_window(causal):
    """Without kept weights (the fast path): changing the key at distance w leaves query i's output
    alone; changing the one at distance w-1 changes it, on both sides in encoders."""
    window, i = 3, 5
    attn = attention(window=window, causal=causal)
    x = torch.randn(1, N, D)

    def output_at_i_after_changing(key: int) -> torch.Tensor:
        changed = x.clone()
        changed[0, key] += 3.0
        with torch.no_grad():
            return attn(changed)[0, i]

    with torch.no_grad():
        base = attn(x)[0, i]
    sides = [-1, 1] if not causal else [-1]
    for side in sides:
        torch.testing.assert_close(output_at_i_after_changing(i + side * window), base)
        assert not torch.allclose(output_at_i_after_changing(i + side * (window - 1)), base, atol=1e-4)
    if causal:
        torch.testing.assert_close(output_at_i_after_changing(i + 1), base)  # and nothing ahead


def test_window_with_a_cache_offset_slides_with_the_query():
    """Incremental decoding: the query at position p (one new token, the cache holding 0..p-1) sees
    keys p-w+1 .. p only, and its output equals the full causal forward's row p."""
    window = 3
    attn = attention(window=window, causal=True)
    x = torch.randn(1, N, D)
    with torch.no_grad():
        full = attn(x)
        cache: dict = {}
        attn(x[:, :4], cache=cache)
        attn.keep_weights = True
        for p in range(4, N):
            step = attn(x[:, p : p + 1], cache=cache)
            torch.testing.assert_close(step[0, 0], full[0, p], atol=1e-5, rtol=1e-5)
            assert torch.equal(attn.weights[0, :, 0] > 0, expected(1, p + 1, p, window=window, causal=True)[0].expand(2, -1))
