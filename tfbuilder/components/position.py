"""Positional encodings added to the token embeddings (family ``position``)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from ..registry import BuildContext, ComponentParams, register


def sinusoids(n: int, d: int, *, base: float = 10000.0, offset: int = 0) -> Tensor:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d)); shape (n, d)."""
    pos = torch.arange(offset, offset + n, dtype=torch.float64).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * (-math.log(base) / d))
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv_freq)
    pe[:, 1::2] = torch.cos(pos * inv_freq[: d // 2])
    return pe.to(torch.get_default_dtype())


@register("position", "sinusoidal")
class SinusoidalPosition(nn.Module):
    """Fixed sinusoidal positions added to the embeddings (Vaswani et al. 2017, sec. 3.5)."""

    class Params(ComponentParams):
        type: Literal["sinusoidal"] = "sinusoidal"
        base: float = Field(10000.0, gt=1.0, description="wavelength base (10000 in the paper)")
        max_len: int = Field(
            1024, ge=1, description="positions precomputed; longer inputs are computed on the fly"
        )

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        self.base = params.base
        self.d_model = ctx.d_model
        # Not persistent: a function of the params, so it stays out of checkpoints.
        self.register_buffer("table", sinusoids(params.max_len, ctx.d_model, base=params.base), persistent=False)

    def forward(self, x: Tensor, *, offset: int = 0) -> Tensor:
        """``x`` (b, n, d) -> x + PE[offset : offset + n]."""
        n = x.shape[1]
        if offset + n <= self.table.shape[0]:
            pe = self.table[offset : offset + n]
        else:
            pe = sinusoids(n, self.d_model, base=self.base, offset=offset).to(x.device)
        return x + pe.to(x.dtype)


@register("position", "learned")
class LearnedPosition(nn.Module):
    """Learned absolute position embeddings (Vaswani et al. 2017, Table 3 row E; Gehring et al. 2017)."""

    class Params(ComponentParams):
        type: Literal["learned"] = "learned"
        max_len: int = Field(1024, ge=1, le=1_000_000, description="longest sequence the table covers")

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        self.table = nn.Embedding(params.max_len, ctx.d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, x: Tensor, *, offset: int = 0) -> Tensor:
        """``x`` (b, n, d) -> x + P[offset : offset + n]."""
        n, max_len = x.shape[1], self.table.num_embeddings
        if offset + n > max_len:
            raise ValueError(f"sequence of {offset + n} positions exceeds learned max_len ({max_len})")
        return x + self.table.weight[offset : offset + n]


@register("position", "none")
class NoPosition(nn.Module):
    """No positional information (an ablation: attention alone is permutation-equivariant)."""

    class Params(ComponentParams):
        type: Literal["none"] = "none"

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()

    def forward(self, x: Tensor, *, offset: int = 0) -> Tensor:
        """``x`` (b, n, d) unchanged."""
        return x
