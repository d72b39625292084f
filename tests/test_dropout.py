"""tfbuilder's dropout: nn.Dropout's distribution and gradient, identity in eval."""

from __future__ import annotations

import pytest
import torch

from tfbuilder.model.dropout import Dropout


def test_keeps_the_right_share_scaled():
    drop = Dropout(0.3).train()
    x = torch.ones(200_000)
    y = drop(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.005
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / 0.7))
    assert abs(y.mean().item() - 1.0) < 0.01  # unbiased in expectation


def test_gradient_flows_through_the_same_mask():
    drop = Dropout(0.5).train()
    x = torch.randn(1000, requires_grad=True)
    y = drop(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, (y != 0).float() * 2.0)


def test_identity_in_eval_and_at_zero_and_reproducible_under_a_seed():
    x = torch.randn(50)
    assert torch.equal(Dropout(0.5).eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)
    torch.manual_seed(3)
    a = Dropout(0.5).train()(x)
    torch.manual_seed(3)
    assert torch.equal(Dropout(0.5).train()(x), a)


def test_refuses_bad_probabilities():
    with pytest.raises(ValueError):
        Dropout(1.0)
