"""Mixture-of-experts feed-forward network (family ``ffn``, type ``moe``)."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from tfbuilder.contracts import FeedForwardBase
from tfbuilder.model.components.ffn import MLP, Activation
from tfbuilder.registry import AuxiliaryLoss, BuildContext, ComponentParams, ModelDims, register


@register("ffn", "moe")
class MixtureOfExperts(FeedForwardBase, nn.Module, AuxiliaryLoss):
    """Top-k routed mixture of MLP experts (Shazeer et al. 2017; Switch balancing loss, Fedus et al. 2021).

    arXiv:1701.06538 and arXiv:2101.03961.

    ``aux_loss`` holds the last call's balancing loss; :meth:`auxiliary_loss` is ``aux_weight`` times
    it, what training adds to the objective (see :class:`~tfbuilder.registry.AuxiliaryLoss`).
    """

    class Params(ComponentParams):
        type: Literal["moe"] = "moe"
        experts: int = Field(4, ge=1, le=256, description="number of expert MLPs")
        top_k: int = Field(2, ge=1, description="experts each token is routed to")
        hidden: int | None = Field(None, ge=1, description="inner width of each expert; default 4 * d_model")
        activation: Activation = Field("relu", description="non-linearity inside each expert")
        aux_weight: float = Field(0.01, ge=0.0, description="weight of the load-balancing loss in the objective")
        bias: bool = Field(True, description="learn biases in the experts")
        capacity_factor: float | None = Field(
            None,
            gt=0.0,
            le=64.0,
            description="expert capacity = factor * tokens * top_k / experts; routed tokens past it are dropped "
            "(Switch Transformer); default none dropped",
        )

        def check(self, dims: ModelDims) -> list[tuple[str, str]]:
            if self.top_k > self.experts:
                return [("top_k", f"top_k ({self.top_k}) cannot exceed experts ({self.experts})")]
            return []

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        self.top_k = params.top_k
        self.aux_weight = params.aux_weight
        self.router = nn.Linear(ctx.d_model, params.experts, bias=False)
        expert = MLP.Params(hidden=params.hidden, activation=params.activation, bias=params.bias)
        self.experts = nn.ModuleList(MLP(expert, ctx) for _ in range(params.experts))
        self.capacity_factor = params.capacity_factor
        self.aux_loss: Tensor = torch.zeros(())

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (b, n, d) -> (b, n, d); tokens go to their ``top_k`` experts, outputs weighted by the
        router probabilities: with ``top_k`` 1, the expert's output times its probability (Switch,
        Fedus et al. 2021, eq. 2; renormalised it would be 1, and the router would learn nothing from
        the task); with more, the chosen probabilities renormalised to sum to 1 (Mixtral, GShard)."""
        flat = x.reshape(-1, x.shape[-1])
        probs = self.router(flat).float().softmax(dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        if self.top_k > 1:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        # gates (t, experts): a token's weight for each expert it is routed to, 0 elsewhere.
        gates = torch.zeros(flat.shape[0], len(self.experts), dtype=x.dtype, device=x.device).scatter_(
            1, chosen, weights
        )
        static = self.capacity_factor is not None or x.device.type != "cpu" or torch.compiler.is_compiling()
        out = self._dispatch_static(flat, gates) if static else self._dispatch_gather(flat, gates)
        # Switch loss: experts * sum_e (share of tokens routed to e) * (mean router probability of e).
        share = F.one_hot(chosen[:, 0], len(self.experts)).float().mean(dim=0)
        self.aux_loss = len(self.experts) * (share * probs.mean(dim=0)).sum()
        return out.reshape(x.shape)

    def output_projections(self) -> list[nn.Linear]:
        """Every expert's ``ff_out``: each ends the residual branch for the tokens routed to it."""
        return [p for expert in self.experts if isinstance(expert, MLP) for p in expert.output_projections()]

    def auxiliary_loss(self) -> Tensor:
        """``aux_weight`` times the balancing loss of the last forward."""
        return self.aux_weight * self.aux_loss

    def capacity(self, tokens: int) -> int:
        """Token slots per expert: all tokens without a capacity factor, else the Switch capacity."""
        if self.capacity_factor is None:
            return tokens
        return max(1, min(tokens, math.ceil(self.capacity_factor * tokens * self.top_k / len(self.experts))))

    def _dispatch_static(self, flat: Tensor, gates: Tensor) -> Tensor:
        """Shapes fixed by the batch, nothing read back to the host (accelerators, torch.compile):
        each expert takes its ``capacity`` highest-gated tokens; a slot whose token is not routed
        to it has gate 0 and adds nothing."""
        out = torch.zeros_like(flat)
        slots = self.capacity(flat.shape[0])
        for e, expert in enumerate(self.experts):
            gate, token = gates[:, e].topk(slots)
            out = out.index_add(0, token, expert(flat[token]) * gate[:, None])
        return out

    def _dispatch_gather(self, flat: Tensor, gates: Tensor) -> Tensor:
        """Each expert runs on exactly the tokens routed to it (CPU, where reading the routing back
        costs nothing). Equal to :meth:`_dispatch_static` without a capacity factor (tested)."""
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token = gates[:, e].nonzero().squeeze(1)
            out.index_add_(0, token, expert(flat[token]) * gates[token, e, None])
        return out
