"""Feed-forward layers against their definitions written out: the GLU's width (Shazeer 2020: 2/3 of
the MLP's 4 d_model, here rounded up to a multiple of 8) and the mixture of experts' forward
(Shazeer et al. 2017; Fedus et al. 2021: the top-k experts, weighted by their router probabilities
renormalised over the k)."""

from __future__ import annotations

import math

import pytest
import torch

from tfbuilder.model.components.ffn import SwiGLU, glu_hidden
from tfbuilder.model.components.moe import MixtureOfExperts
from tfbuilder.registry import BuildContext


@pytest.mark.parametrize("d_model", [32, 96, 100, 512, 4096])
def test_glu_width_is_two_thirds_of_four_d_rounded_up_to_eight(d_model):
    want = math.ceil(2 / 3 * 4 * d_model / 8) * 8
    assert glu_hidden(SwiGLU.Params(), d_model) == want
    assert glu_hidden(SwiGLU.Params(match_params=False), d_model) == 4 * d_model
    assert glu_hidden(SwiGLU.Params(hidden=40), d_model) == 40


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_moe_output_is_the_top_k_mixture(top_k):
    """Top-1: the expert's output times its router probability (Switch); top-k: the k probabilities
    renormalised to sum to 1."""
    moe = MixtureOfExperts(MixtureOfExperts.Params(experts=4, top_k=top_k, hidden=16), BuildContext(d_model=8))
    x = torch.randn(2, 5, 8)
    want = []
    for token in x.reshape(-1, 8):
        probs = moe.router(token).softmax(dim=-1)
        top = probs.topk(top_k)
        weights = top.values if top_k == 1 else top.values / top.values.sum()
        want.append(sum(w * moe.experts[int(e)](token) for w, e in zip(weights, top.indices)))
    with torch.no_grad():
        torch.testing.assert_close(moe(x), torch.stack(want).reshape(2, 5, 8), atol=1e-5, rtol=1e-5)
        moe.capacity_factor = 64.0  # the static dispatch (accelerators), with room for every token
        torch.testing.assert_close(moe(x), torch.stack(want).reshape(2, 5, 8), atol=1e-5, rtol=1e-5)


def test_switch_routing_trains_the_router_from_the_task_loss():
    """With top-1 routing and no balancing loss, the task's gradient still reaches the router,
    through the probability that scales the chosen expert's output (Fedus et al. 2021, sec. 2.1)."""
    moe = MixtureOfExperts(MixtureOfExperts.Params(experts=4, top_k=1, hidden=16, aux_weight=0.0), BuildContext(d_model=8))
    x = torch.randn(2, 5, 8)
    (moe(x).square().sum() + moe.auxiliary_loss()).backward()
    assert moe.router.weight.grad is not None and moe.router.weight.grad.abs().sum() > 1e-2


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_geglu_gates_with_gelu_exact_or_its_tanh_form(approximate):
    """GEGLU(x) = (GELU(x W) * x V) W2; the tanh form written out from Hendrycks & Gimpel (2016)."""
    from tfbuilder.model.components.ffn import GEGLU

    torch.manual_seed(0)
    ffn = GEGLU(GEGLU.Params(hidden=12, approximate=approximate), BuildContext(d_model=8))
    x = torch.randn(2, 5, 8) * 3
    gate, value = ffn.ff_in(x).chunk(2, dim=-1)
    if approximate == "tanh":
        gelu = 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)))
    else:
        gelu = 0.5 * gate * (1 + torch.erf(gate / math.sqrt(2)))
    with torch.no_grad():
        torch.testing.assert_close(ffn(x), ffn.ff_out(gelu * value), atol=1e-6, rtol=1e-6)
        other = GEGLU(GEGLU.Params(hidden=12, approximate="tanh" if approximate == "none" else "none"), BuildContext(d_model=8))
        other.load_state_dict(ffn.state_dict())
        assert (other(x) - ffn(x)).abs().max() > 1e-5  # the two forms differ
