"""Position-wise feed-forward networks (family ``ffn``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor, nn

from ..dropout import Dropout
from ..registry import BuildContext, ComponentParams, register

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "gelu_tanh": lambda: nn.GELU(approximate="tanh"), "silu": nn.SiLU}


@register("ffn", "mlp")
class MLP(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2 (Vaswani et al. 2017, sec. 3.3)."""

    class Params(ComponentParams):
        type: Literal["mlp"] = "mlp"
        hidden: int | None = Field(None, ge=1, description="inner width d_ff; default 4 * d_model")
        activation: Literal["relu", "gelu", "gelu_tanh", "silu"] = Field(
            "relu", description="non-linearity between the two projections"
        )
        dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the hidden activations")
        bias: bool = Field(True, description="learn biases in both projections")

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        hidden = params.hidden or 4 * ctx.d_model
        self.ff_in = nn.Linear(ctx.d_model, hidden, bias=params.bias)
        self.act = ACTIVATIONS[params.activation]()
        self.drop = Dropout(params.dropout)
        self.ff_out = nn.Linear(hidden, ctx.d_model, bias=params.bias)

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (b, n, d) -> (b, n, d)."""
        return self.ff_out(self.drop(self.act(self.ff_in(x))))
