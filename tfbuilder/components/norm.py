"""Normalisation layers (family ``norm``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import nn

from ..registry import BuildContext, ComponentParams, register


@register("norm", "layernorm")
class LayerNorm(nn.LayerNorm):
    """Layer normalisation (Ba et al. 2016, arXiv:1607.06450), as in Vaswani et al. 2017."""

    class Params(ComponentParams):
        type: Literal["layernorm"] = "layernorm"
        eps: float = Field(1e-5, gt=0.0, lt=1.0, description="added to the variance for stability")
        bias: bool = Field(True, description="learn an additive bias beside the gain")

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__(ctx.d_model, eps=params.eps, bias=params.bias)
