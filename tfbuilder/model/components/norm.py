"""Normalisation layers (family ``norm``)."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from tfbuilder.registry import BuildContext, ComponentParams, register


@register("norm", "layernorm")
class LayerNorm(nn.LayerNorm):
    """Layer normalisation (Ba et al. 2016, arXiv:1607.06450), as in Vaswani et al. 2017."""

    class Params(ComponentParams):
        type: Literal["layernorm"] = "layernorm"
        eps: float = Field(1e-5, gt=0.0, lt=1.0, description="added to the variance for stability")
        bias: bool = Field(True, description="learn an additive bias beside the gain")

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__(ctx.d_model, eps=params.eps, bias=params.bias)


@register("norm", "rmsnorm")
class RMSNorm(nn.RMSNorm):
    """Root-mean-square layer normalisation (Zhang & Sennrich 2019, arXiv:1910.07467)."""

    class Params(ComponentParams):
        type: Literal["rmsnorm"] = "rmsnorm"
        eps: float = Field(1e-6, gt=0.0, lt=1.0, description="added to the mean square for stability")

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__(ctx.d_model, eps=params.eps)


@register("norm", "scalenorm")
class ScaleNorm(nn.Module):
    """ScaleNorm: g * x / ||x|| with one learned scalar g (Nguyen & Salazar 2019, arXiv:1910.05895)."""

    class Params(ComponentParams):
        type: Literal["scalenorm"] = "scalenorm"
        eps: float = Field(1e-5, gt=0.0, lt=1.0, description="lower bound of the norm")

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        self.eps = params.eps
        self.d_model = ctx.d_model
        self.scale = nn.Parameter(torch.tensor(float(ctx.d_model) ** 0.5))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.scale.fill_(float(self.d_model) ** 0.5)  # the paper's initialisation, sqrt(d)

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (..., d) -> (..., d)."""
        return self.scale * x / x.norm(dim=-1, keepdim=True).clamp(min=self.eps)
