"""Multi-head latent attention against DeepSeek-V2's equations (arXiv:2405.04434, eq. 9-19), written
out per head in plain torch; the cache keeps the latent only."""

from __future__ import annotations

import math

import pytest
import torch

import tfbuilder
from conftest import tiny_model
from tfbuilder.model.components.latent_attention import LatentAttention
from tfbuilder.model.components.position import RotaryPosition
from tfbuilder import registry
from tfbuilder.spec.recipe import ModelSection
from tfbuilder.registry import BuildContext

D, H, D_H, D_V, D_C, D_Q, R = 16, 2, 4, 3, 6, 5, 4


def rope(x: torch.Tensor, position: int, base: float = 10000.0) -> torch.Tensor:
    """RoFormer's rotation of one vector: the pairs (x_2i, x_2i+1) turned by position * base^(-2i/r)."""
    out = x.clone()
    for i in range(len(x) // 2):
        angle = position * base ** (-2 * i / len(x))
        c, s = math.cos(angle), math.sin(angle)
        out[2 * i], out[2 * i + 1] = x[2 * i] * c - x[2 * i + 1] * s, x[2 * i] * s + x[2 * i + 1] * c
    return out


def rms(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean() + 1e-6) * gain


def equations(mla: LatentAttention, x: torch.Tensor) -> torch.Tensor:
    """One sequence x (n, d), causal: the paper's equations token by token and head by head."""
    n = x.shape[0]
    out = torch.zeros(n, D)
    W_kv = mla.to_kv.weight  # per head: W_UK_h (d_h rows) then W_UV_h (d_v rows)
    k_C, v, k_R, q_C, q_R = {}, {}, {}, {}, {}
    for t in range(n):
        kv = mla.to_kv_latent.weight @ x[t]
        c = rms(kv[:D_C], mla.norm_kv.weight)  # eq. 9
        k_R[t] = rope(kv[D_C:], t)  # eq. 17: shared by the heads
        c_q = rms(mla.to_q_latent.weight @ x[t], mla.norm_q.weight)  # eq. 12
        q = mla.to_q.weight @ c_q  # eq. 13 and 16: per head [q_C; q_R]
        for h in range(H):
            block = W_kv[h * (D_H + D_V) : (h + 1) * (D_H + D_V)]
            k_C[t, h], v[t, h] = block[:D_H] @ c, block[D_H:] @ c  # eq. 10, 11
            q_h = q[h * (D_H + R) : (h + 1) * (D_H + R)]
            q_C[t, h], q_R[t, h] = q_h[:D_H], rope(q_h[D_H:], t)
    for t in range(n):
        heads = []
        for h in range(H):
            scores = torch.stack(
                [(q_C[t, h] @ k_C[s, h] + q_R[t, h] @ k_R[s]) / math.sqrt(D_H + R) for s in range(t + 1)]
            )  # eq. 18, 19
            heads.append(sum(w * v[s, h] for s, w in enumerate(scores.softmax(0))))
        out[t] = mla.to_out.weight @ torch.cat(heads)
    return out


def latent(**extra) -> tuple[LatentAttention, RotaryPosition]:
    ctx = BuildContext(d_model=D, causal=True, heads=H, head_dim=D_H + R)
    position = RotaryPosition(RotaryPosition.Params(), ctx)
    params = LatentAttention.Params(heads=H, head_dim=D_H, value_dim=D_V, kv_rank=D_C, q_rank=D_Q, rope_dim=R, **extra)
    mla = LatentAttention(params, BuildContext(d_model=D, causal=True, heads=H, head_dim=D_H + R, position=position)).eval()
    for norm in (mla.norm_kv, mla.norm_q):  # gains other than 1, so that a dropped norm shows
        torch.nn.init.uniform_(norm.weight, 0.5, 1.5)
    return mla, position


def test_latent_attention_is_deepseek_v2s_equations():
    torch.manual_seed(0)
    mla, _ = latent()
    x = torch.randn(1, 5, D)
    with torch.no_grad():
        torch.testing.assert_close(mla(x)[0], equations(mla, x[0]), atol=1e-5, rtol=1e-4)


def test_the_cache_keeps_only_the_latent_and_decodes_as_the_whole_sequence():
    torch.manual_seed(1)
    mla, _ = latent()
    x = torch.randn(2, 6, D)
    cache: dict = {}
    with torch.no_grad():
        full = mla(x)
        stepwise = torch.cat([mla(x[:, t : t + 1], cache=cache) for t in range(6)], dim=1)
    torch.testing.assert_close(stepwise, full, atol=1e-5, rtol=1e-4)
    assert sorted(cache) == ["k_rope", "latent"]
    assert cache["latent"].shape == (2, 6, D_C) and cache["k_rope"].shape == (2, 1, 6, R)
    assert mla.cache_per_token() == D_C + R  # against 2 * H * D_H for multi-head attention


def test_a_latent_attention_model_trains_and_decodes_from_a_recipe():
    spec = tiny_model(kind="decoder", encoder=None, position={"type": "rotary"})
    spec["attention"] = {"type": "latent", "heads": 2, "kv_rank": 8, "q_rank": 8}
    model = tfbuilder.build_model(ModelSection.model_validate(spec))
    tokens = torch.randint(5, spec["vocab_size"], (2, 7))
    model(tokens).logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_an_odd_rotary_width_is_refused():
    with pytest.raises(ValueError, match="rope_dim \\(3\\) must be even"):
        LatentAttention.Params(rope_dim=3)


def test_show_reports_the_cache_per_token_of_every_decoder_layer():
    from tfbuilder.model.module_tree import kv_cache_per_token

    def cached(attention: dict, **changes) -> int | None:
        spec = tiny_model(**changes)
        spec["attention"] = attention
        return kv_cache_per_token(tfbuilder.build_model(ModelSection.model_validate(spec)))

    layers = tiny_model()["decoder"]["layers"]
    d = tiny_model()["d_model"]
    assert cached({"type": "latent", "heads": 2, "kv_rank": 8, "rope_dim": 4}) == layers * (8 + 4)
    assert cached({"type": "multihead", "heads": 2}) == layers * 2 * d
    assert cached({"type": "multihead", "heads": 2, "kv_heads": 1}) == layers * d
    assert cached({"type": "multihead", "heads": 2}, kind="encoder", decoder=None) is None


@pytest.mark.parametrize("name", registry.types("attention"))
def test_the_reported_cache_per_token_is_what_the_cache_holds(name):
    """Whatever the attention type, ``show``'s figure is the numbers its decoding cache holds per token."""
    from tfbuilder.model.module_tree import kv_cache_per_token

    spec = tiny_model(kind="decoder", encoder=None)
    spec["attention"] = {"type": name, "heads": 2}
    model = tfbuilder.build_model(ModelSection.model_validate(spec)).eval()
    reported = kv_cache_per_token(model)
    if reported is None:
        pytest.skip(f"attention '{name}' does not say what its cache holds")
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(5, 53, (1, 5)), cache=cache)
    held = sum(t.numel() for layer in cache for part in layer.values() for t in part.values())
    assert held == 5 * reported
