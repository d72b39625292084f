"""Properties every built model must have, whatever its components: shared by the generated tests."""

from __future__ import annotations

import torch
from torch import nn

from tfbuilder.model.heads import SequenceHead
from tfbuilder.train.objectives import causal_lm

PAD = 0


def ids(batch: int, n: int, vocab: int) -> torch.Tensor:
    return torch.randint(1, vocab, (batch, n))


def call(model: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    return model(*inputs)


def inputs_for(model: nn.Module, vocab: int, src_vocab: int | None = None, *, batch: int = 2) -> tuple[torch.Tensor, ...]:
    if model.kind == "encoder_decoder":
        return ids(batch, 7, src_vocab or vocab), ids(batch, 5, vocab)
    return (ids(batch, 6, vocab),)


def check_shapes(model: nn.Module, vocab: int, src_vocab: int | None = None) -> None:
    inputs = inputs_for(model, vocab, src_vocab)
    out = call(model, *inputs)
    if isinstance(model.head, SequenceHead):  # one output per text
        assert out.shape == (inputs[-1].shape[0], model.head.out.out_features)
    else:
        assert out.shape == (*inputs[-1].shape, vocab)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()


def check_gradients(model: nn.Module, vocab: int, src_vocab: int | None = None) -> None:
    """A loss on the logits gives every parameter a non-zero gradient (a batch large enough that a
    mixture of experts routes tokens to every expert)."""
    model.zero_grad()
    inputs = inputs_for(model, vocab, src_vocab, batch=16)
    out = call(model, *inputs)
    loss = (out * torch.randn_like(out)).sum()
    if model.kind == "decoder" and model.mtp is not None:  # training-only modules: the objective reaches them
        loss = loss + causal_lm(model.train(), {"tokens": inputs[0]}, 0.0).loss
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"no gradient reaches: {missing}"


def check_causal(model: nn.Module, vocab: int, src_vocab: int | None = None) -> None:
    """Changing target token t leaves the logits before t unchanged, and changes some at t."""
    inputs = list(inputs_for(model, vocab, src_vocab))
    tokens = inputs[-1]
    t = tokens.shape[1] - 2
    changed = tokens.clone()
    changed[:, t:] = (changed[:, t:] % (vocab - 1)) + 1  # different real tokens from t on
    before = call(model, *inputs[:-1], tokens)
    after = call(model, *inputs[:-1], changed)
    torch.testing.assert_close(before[:, :t], after[:, :t], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(before[:, t:], after[:, t:], atol=1e-5)


def check_padding(model: nn.Module, vocab: int, src_vocab: int | None = None) -> None:
    """Extra padding on the right changes no real position's logits (in every input)."""
    inputs = list(inputs_for(model, vocab, src_vocab))
    base = call(model, *inputs)
    for which in range(len(inputs)):
        padded = list(inputs)
        extra = torch.full((inputs[which].shape[0], 3), PAD, dtype=torch.long)
        padded[which] = torch.cat([inputs[which], extra], dim=1)
        out = call(model, *padded)
        torch.testing.assert_close(out[:, : base.shape[1]], base, atol=1e-5, rtol=1e-5)


PROPERTIES = {
    "shapes": check_shapes,
    "gradients": check_gradients,
    "causal": check_causal,
    "padding": check_padding,
}
