"""Position-wise feed-forward networks (family ``ffn``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import Field
from torch import Tensor, nn

from tfbuilder.contracts import FeedForwardBase, default_ffn_hidden
from tfbuilder.model.dropout import Dropout
from tfbuilder.registry import BuildContext, ComponentParams, register

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "silu": nn.SiLU,
}
Activation = Literal["relu", "gelu", "gelu_tanh", "silu"]


@register("ffn", "mlp")
class MLP(FeedForwardBase, nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2 (Vaswani et al. 2017, sec. 3.3)."""

    class Params(ComponentParams):
        type: Literal["mlp"] = "mlp"
        hidden: int | None = Field(None, ge=1, description="inner width d_ff; default 4 * d_model")
        activation: Activation = Field("relu", description="non-linearity between the two projections")
        dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the hidden activations")
        bias: bool = Field(True, description="learn biases in both projections")

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        hidden = params.hidden or default_ffn_hidden(ctx.d_model)
        self.ff_in = nn.Linear(ctx.d_model, hidden, bias=params.bias)
        self.act = ACTIVATIONS[params.activation]()
        self.drop = Dropout(params.dropout)
        self.ff_out = nn.Linear(hidden, ctx.d_model, bias=params.bias)

    def output_projections(self) -> list[nn.Linear]:
        """W2, ``ff_out``."""
        return [self.ff_out]

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (b, n, d) -> (b, n, d)."""
        return self.ff_out(self.drop(self.act(self.ff_in(x))))


class _GLUParams(ComponentParams):
    hidden: int | None = Field(
        None, ge=1, description="inner width; default 4 * d_model, or 2/3 of it with match_params"
    )
    match_params: bool = Field(
        True,
        description="scale the default width by 2/3 (rounded up to a multiple of 8) to keep an MLP's parameter count",
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the gated hidden activations")
    bias: bool = Field(False, description="learn biases in the projections")


def glu_hidden(params: _GLUParams, d_model: int) -> int:
    if params.hidden is not None:
        return params.hidden
    if not params.match_params:
        return default_ffn_hidden(d_model)
    return -(-(2 * default_ffn_hidden(d_model)) // 3 // 8) * 8  # 2/3 of an MLP's width, rounded up to a multiple of 8


class GLU(FeedForwardBase, nn.Module):
    """FFN_GLU(x) = (act(x W) * x V) W2: a gated linear unit with an activation (Shazeer 2020, arXiv:2002.05202)."""

    activation: str = "silu"

    def __init__(self, params: _GLUParams, ctx: BuildContext):
        super().__init__()
        hidden = glu_hidden(params, ctx.d_model)
        self.ff_in = nn.Linear(ctx.d_model, 2 * hidden, bias=params.bias)  # gate and value, fused
        self.act = ACTIVATIONS[self.activation]()
        self.drop = Dropout(params.dropout)
        self.ff_out = nn.Linear(hidden, ctx.d_model, bias=params.bias)

    def output_projections(self) -> list[nn.Linear]:
        """W2, ``ff_out``."""
        return [self.ff_out]

    def fused_widths(self) -> dict[str, list[int]]:
        """The gate and value projections, fused in ``ff_in``."""
        return {"ff_in": [self.ff_out.in_features] * 2}

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (b, n, d) -> (b, n, d)."""
        gate, value = self.ff_in(x).chunk(2, dim=-1)
        return self.ff_out(self.drop(self.act(gate) * value))


@register("ffn", "swiglu")
class SwiGLU(GLU):
    """GLU with a Swish (SiLU) gate (Shazeer 2020, arXiv:2002.05202)."""

    activation = "silu"

    class Params(_GLUParams):
        type: Literal["swiglu"] = "swiglu"


@register("ffn", "geglu")
class GEGLU(GLU):
    """GLU with a GELU gate (Shazeer 2020, arXiv:2002.05202). ``approximate: tanh`` gates with GELU's tanh
    approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (Hendrycks & Gimpel 2016,
    arXiv:1606.08415), as Gemma does (Gemma Team 2024, arXiv:2403.08295; ``gelu_pytorch_tanh``)."""

    activation = "gelu"

    class Params(_GLUParams):
        type: Literal["geglu"] = "geglu"
        approximate: Literal["none", "tanh"] = Field(
            "none", description="GELU exact (erf), or its tanh approximation (Gemma's gelu_pytorch_tanh)"
        )

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__(params, ctx)
        if params.approximate == "tanh":
            self.act = ACTIVATIONS["gelu_tanh"]()


@register("ffn", "reglu")
class ReGLU(GLU):
    """GLU with a ReLU gate (Shazeer 2020, arXiv:2002.05202)."""

    activation = "relu"

    class Params(_GLUParams):
        type: Literal["reglu"] = "reglu"
