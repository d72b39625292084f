"""Dropout (Srivastava et al. 2014) drawn with ``torch.rand``: the same distribution as ``nn.Dropout``,
about twice as fast on CPU, where ``bernoulli_`` is the slow part. The mask is kept as the factors
themselves (0 or 1/(1-p), in the input's dtype, as ``nn.Dropout``'s on CPU): one product each way."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class _DropoutFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        # In place: 1 where kept, then 1/(1-p); a boolean mask and a separate scale took two products
        # and two conversions each way, and on CPU every pass over the activations counts.
        factor = torch.rand(x.shape, device=x.device).ge_(p).mul_(1.0 / (1.0 - p)).to(x.dtype)
        ctx.save_for_backward(factor)
        return x * factor

    @staticmethod
    def backward(ctx, grad: Tensor):
        (factor,) = ctx.saved_tensors
        return grad * factor, None


class Dropout(nn.Module):
    """Zero each element with probability ``p`` in training, scale the rest by 1/(1-p)."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        """Any shape, unchanged."""
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return nn.functional.dropout(x, self.p, True)  # fused kernels elsewhere
        return _DropoutFn.apply(x, self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"
