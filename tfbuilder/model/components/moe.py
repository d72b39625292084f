"""Mixture-of-experts feed-forward network (family ``ffn``, type ``moe``).

One router scores every expert for each token; the token goes to its ``top_k`` experts, whose outputs
are summed with the routing weights, plus optional shared experts that every token passes through.
The routings of the Switch Transformer, Mixtral, Qwen2-MoE/Qwen3-MoE and DeepSeek-V3 are settings:

==============  =====================================================================================
Switch          ``top_k: 1`` (the expert's probability scales its output)
Mixtral         ``expert: swiglu, bias: false, top_k: 2`` (always renormalised)
Qwen2-MoE       ``expert: swiglu, bias: false, normalize: <norm_topk_prob>, shared_experts: 1,
                shared_hidden: <shared_expert_intermediate_size>, shared_gate: true``
Qwen3-MoE       ``expert: swiglu, bias: false, normalize: <norm_topk_prob>``
DeepSeek-V3     ``expert: swiglu, bias: false, router: sigmoid, correction_bias: true, groups: <n_group>,
                top_groups: <topk_group>, routed_scale: <routed_scaling_factor>,
                shared_experts: <n_shared_experts>`` (and ``normalize: <norm_topk_prob>``)
==============  =====================================================================================

Weight layout (for converters). Routed expert ``e`` is ``experts.{e}``, a module of the ``expert`` kind:

* ``mlp``: ``experts.{e}.ff_in`` (d -> hidden) and ``experts.{e}.ff_out`` (hidden -> d), with biases if
  ``bias``;
* ``swiglu``/``geglu``: ``experts.{e}.ff_in`` fuses the gate and up projections, gate rows first
  (weight ``(2 * hidden, d)``), and ``experts.{e}.ff_out`` is the down projection ``(d, hidden)``. This is
  the layout of transformers' fused 3-D expert parameters, one expert per index:
  ``experts.gate_up_proj[e]`` is ``experts.{e}.ff_in.weight`` and ``experts.down_proj[e]`` is
  ``experts.{e}.ff_out.weight`` (:func:`load_fused_experts`, :func:`fused_experts`); a checkpoint with
  separate ``gate_proj``/``up_proj`` concatenates them (gate first) into ``ff_in``.

The router is ``router`` (``Linear(d, experts)``, no bias: transformers' ``gate.weight``); DeepSeek-V3's
``gate.e_score_correction_bias`` is the buffer ``correction_bias``. The shared experts are one module of
the same kind, ``shared`` (``shared.ff_in``/``shared.ff_out``; transformers' ``shared_experts`` or
``shared_expert``), and Qwen2-MoE's ``shared_expert_gate`` is ``shared_gate`` (``Linear(d, 1)``, no bias).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from pydantic import Field
from torch import Tensor, nn

from tfbuilder.contracts import FeedForwardBase
from tfbuilder.model.components.ffn import GEGLU, GLU, MLP, Activation, SwiGLU
from tfbuilder.registry import AuxiliaryLoss, BuildContext, ComponentParams, ModelDims, RoutingBalance, register

ExpertKind = Literal["mlp", "swiglu", "geglu"]


def build_expert(
    kind: ExpertKind, hidden: int | None, *, activation: Activation, bias: bool, ctx: BuildContext
) -> MLP | GLU:
    """One expert of ``kind``: an MLP with ``activation``, or a SwiGLU/GEGLU (their default width when
    ``hidden`` is None: 4 * d_model, or 2/3 of it for the GLU kinds)."""
    if kind == "mlp":
        return MLP(MLP.Params(hidden=hidden, activation=activation, bias=bias), ctx)
    if kind == "swiglu":
        return SwiGLU(SwiGLU.Params(hidden=hidden, bias=bias), ctx)
    return GEGLU(GEGLU.Params(hidden=hidden, bias=bias), ctx)


def group_limited(choice: Tensor, groups: int, top_groups: int) -> Tensor:
    """DeepSeek-V3's group-limited (node-limited) routing (DeepSeek-AI 2024, arXiv:2412.19437, sec. 2.1.2;
    transformers' ``DeepseekV3TopkRouter``): the experts are split into ``groups`` equal groups, a group
    scores the sum of its two highest (bias-corrected) scores, and the experts outside the ``top_groups``
    best groups are masked to -inf before the top-k.
    ``choice`` (t, experts) -> (t, experts)."""
    grouped = rearrange(choice, "t (g e) -> t g e", g=groups)
    group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)
    best = group_score.topk(top_groups, dim=-1).indices
    kept = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, best, True)
    return grouped.masked_fill(~kept[..., None], float("-inf")).flatten(1)


@register("ffn", "moe")
class MixtureOfExperts(FeedForwardBase, nn.Module, AuxiliaryLoss, RoutingBalance):
    """Top-k routed mixture of experts (Shazeer et al. 2017; Switch balancing loss, Fedus et al. 2021).

    arXiv:1701.06538 and arXiv:2101.03961. GLU experts (Mixtral, Jiang et al. 2024, arXiv:2401.04088;
    Qwen-MoE; DeepSeek-V3), sigmoid routing with a selection-only correction bias, group-limited
    routing, a routed scale and shared experts (DeepSeek-V3, arXiv:2412.19437, sec. 2.1.2;
    DeepSeekMoE, arXiv:2401.06066), a sigmoid-gated shared expert (Qwen2-MoE, arXiv:2407.10671).

    ``aux_loss`` holds the last call's balancing loss; :meth:`auxiliary_loss` is ``aux_weight`` times
    it, what training adds to the objective (see :class:`~tfbuilder.registry.AuxiliaryLoss`).
    """

    class Params(ComponentParams):
        type: Literal["moe"] = "moe"
        experts: int = Field(4, ge=1, le=256, description="number of routed experts")
        top_k: int = Field(2, ge=1, description="experts each token is routed to")
        expert: ExpertKind = Field(
            "mlp", description="each expert's kind: an MLP, or a SwiGLU/GEGLU (Mixtral, Qwen-MoE, DeepSeek)"
        )
        hidden: int | None = Field(
            None, ge=1, description="inner width of each expert; default 4 * d_model, or 2/3 of it for GLU experts"
        )
        activation: Activation = Field("relu", description="non-linearity inside each mlp expert")
        aux_weight: float = Field(0.01, ge=0.0, description="weight of the load-balancing loss in the objective")
        bias: bool = Field(True, description="learn biases in the experts (Mixtral, Qwen and DeepSeek have none)")
        capacity_factor: float | None = Field(
            None,
            gt=0.0,
            le=64.0,
            description="expert capacity = factor * tokens * top_k / experts; routed tokens past it are dropped "
            "(Switch Transformer); default none dropped",
        )
        router: Literal["softmax", "sigmoid"] = Field(
            "softmax", description="expert scores: a softmax over the experts, or each one's sigmoid (DeepSeek-V3)"
        )
        normalize: bool | None = Field(
            None,
            description="renormalise the chosen weights to sum to 1; default: softmax when top_k > 1, sigmoid always",
        )
        correction_bias: bool = Field(
            False,
            description="a per-expert bias added to the scores to choose experts, not to weight them (DeepSeek-V3)",
        )
        bias_update: float = Field(
            0.0,
            ge=0.0,
            le=1.0,
            description="after each optimizer step, correction bias += this * sign(mean load - load)",
        )
        groups: int = Field(1, ge=1, description="expert groups for group-limited routing (DeepSeek-V3 n_group)")
        top_groups: int = Field(1, ge=1, description="groups a token's experts may come from (DeepSeek-V3 topk_group)")
        routed_scale: float = Field(1.0, gt=0.0, description="factor on the routed weights (routed_scaling_factor)")
        shared_experts: int = Field(0, ge=0, le=64, description="experts every token passes through (DeepSeekMoE)")
        shared_hidden: int | None = Field(
            None, ge=1, description="inner width of the shared experts, one module; default hidden * shared_experts"
        )
        shared_gate: bool = Field(False, description="scale the shared experts by sigmoid(x w) (Qwen2-MoE)")

        def check(self, dims: ModelDims) -> list[tuple[str, str]]:
            problems = []
            kept = self.top_groups * (self.experts // self.groups)  # the experts a token may choose from
            if self.top_k > self.experts:
                problems.append(("top_k", f"top_k ({self.top_k}) cannot exceed experts ({self.experts})"))
            if self.experts % self.groups:
                problems.append(("groups", f"experts ({self.experts}) must be divisible by groups ({self.groups})"))
            elif self.groups > 1 and self.experts // self.groups < 2:
                message = f"each group of experts needs 2 or more ({self.experts} experts in {self.groups} groups)"
                problems.append(("groups", message))
            elif self.top_groups > self.groups:
                problems.append(("top_groups", f"top_groups ({self.top_groups}) cannot exceed groups ({self.groups})"))
            elif kept < self.top_k <= self.experts:  # (more than experts: said above)
                problems.append(("top_k", f"top_k ({self.top_k}) exceeds the {kept} experts of top_groups"))
            if self.bias_update > 0 and not self.correction_bias:
                problems.append(("bias_update", "updates the correction bias; set correction_bias: true"))
            if self.shared_experts == 0 and (self.shared_gate or self.shared_hidden is not None):
                field = "shared_gate" if self.shared_gate else "shared_hidden"
                problems.append((field, "needs shared_experts of 1 or more"))
            # (the default passes: a resolved recipe, as checkpoints keep it, states every field)
            if self.expert != "mlp" and "activation" in self.model_fields_set and self.activation != "relu":
                problems.append(("activation", f"is for mlp experts; a {self.expert} expert has its own gate"))
            return problems

        def normalizes(self) -> bool:
            """Whether the chosen weights are renormalised: ``normalize``, else softmax routing with
            top_k > 1 (top-1 keeps its probability, as Switch) and sigmoid routing always (DeepSeek-V3)."""
            if self.normalize is not None:
                return self.normalize
            return self.router == "sigmoid" or self.top_k > 1

    def __init__(self, params: Params, ctx: BuildContext):
        super().__init__()
        self.top_k = params.top_k
        self.aux_weight = params.aux_weight
        self.sigmoid = params.router == "sigmoid"
        self.normalize = params.normalizes()
        self.routed_scale = params.routed_scale
        self.groups, self.top_groups = params.groups, params.top_groups
        self.bias_update = params.bias_update
        self.router = nn.Linear(ctx.d_model, params.experts, bias=False)
        self.experts = nn.ModuleList(
            build_expert(params.expert, params.hidden, activation=params.activation, bias=params.bias, ctx=ctx)
            for _ in range(params.experts)
        )
        self.shared: MLP | GLU | None = None
        self.shared_gate: nn.Linear | None = None
        if params.shared_experts:
            width = params.shared_hidden or self.expert_width() * params.shared_experts
            self.shared = build_expert(params.expert, width, activation=params.activation, bias=params.bias, ctx=ctx)
            self.shared_gate = nn.Linear(ctx.d_model, 1, bias=False) if params.shared_gate else None
        self.correction_bias: Tensor | None
        self.register_buffer("correction_bias", torch.zeros(params.experts) if params.correction_bias else None)
        # Tokens routed to each expert since the last bias update (counted in training, never saved).
        self.expert_load: Tensor | None
        load = torch.zeros(params.experts) if params.bias_update > 0 else None
        self.register_buffer("expert_load", load, persistent=False)
        self.capacity_factor = params.capacity_factor
        self.aux_loss: Tensor = torch.zeros(())

    def expert_width(self) -> int:
        """The inner width of each routed expert."""
        first = self.experts[0]
        assert isinstance(first, (MLP, GLU))
        return first.ff_out.in_features

    def route(self, flat: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Routing of ``flat`` (t, d): the chosen experts (t, top_k), their weights (t, top_k, float32)
        and each token's distribution over the experts (t, experts) for the balancing loss.

        The scores are a softmax over the experts or each one's sigmoid (DeepSeek-V3, eq. 15); the
        correction bias and the group limit change only which experts are chosen, and the weights are
        the plain scores of those (eq. 16), renormalised to sum to 1 when :meth:`Params.normalizes`,
        then times ``routed_scale``."""
        logits = self.router(flat).float()
        scores = logits.sigmoid() if self.sigmoid else logits.softmax(dim=-1)
        choice = scores if self.correction_bias is None else scores + self.correction_bias
        if self.groups > 1:
            choice = group_limited(choice, self.groups, self.top_groups)
        chosen = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, chosen)
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        probs = scores / scores.sum(dim=-1, keepdim=True) if self.sigmoid else scores
        return chosen, weights * self.routed_scale, probs

    def forward(self, x: Tensor) -> Tensor:
        """``x`` (b, n, d) -> (b, n, d); tokens go to their ``top_k`` experts, outputs weighted by the
        routing weights (:meth:`route`): with softmax routing and ``top_k`` 1, the expert's output times
        its probability (Switch, Fedus et al. 2021, eq. 2; renormalised it would be 1, and the router
        would learn nothing from the task); with more, the chosen probabilities renormalised to sum to 1
        (Mixtral, GShard). The shared experts' output is added (gated, with ``shared_gate``)."""
        flat = x.reshape(-1, x.shape[-1])
        chosen, weights, probs = self.route(flat)
        experts = len(self.experts)
        # gates (t, experts): a token's weight for each expert it is routed to, 0 elsewhere.
        gates = torch.zeros(flat.shape[0], experts, dtype=x.dtype, device=x.device)
        gates = gates.scatter_(1, chosen, weights.to(x.dtype))
        static = self.capacity_factor is not None or x.device.type != "cpu" or torch.compiler.is_compiling()
        out = self._dispatch_static(flat, gates) if static else self._dispatch_gather(flat, gates)
        if self.shared is not None:
            shared = self.shared(flat)
            out = out + (shared if self.shared_gate is None else shared * self.shared_gate(flat).sigmoid())
        # Switch loss: experts * sum_e (share of tokens routed first to e) * (mean router probability of
        # e); with sigmoid routing, of each token's scores normalised to sum to 1 (DeepSeek-V3, eq. 19).
        share = F.one_hot(chosen[:, 0], experts).float().mean(dim=0)
        self.aux_loss = experts * (share * probs.mean(dim=0)).sum()
        if self.training and self.expert_load is not None:
            with torch.no_grad():  # read by balance() once per optimizer step, on the device
                self.expert_load += torch.zeros_like(self.expert_load).index_add_(
                    0, chosen.flatten(), torch.ones_like(chosen.flatten(), dtype=self.expert_load.dtype)
                )
        return out.reshape(x.shape)

    def output_projections(self) -> list[nn.Linear]:
        """Every expert's ``ff_out`` (shared ones included): each ends the residual branch for the
        tokens routed to it."""
        modules = [*self.experts, *([self.shared] if self.shared is not None else [])]
        return [p for expert in modules if isinstance(expert, (MLP, GLU)) for p in expert.output_projections()]

    def fused_widths(self) -> dict[str, list[int]]:
        """GLU experts fuse their gate and up projections in ``ff_in``: ``experts.{e}.ff_in`` and
        ``shared.ff_in`` (none for mlp experts)."""
        named = [(f"experts.{e}", m) for e, m in enumerate(self.experts)] + [("shared", self.shared)]
        return {f"{name}.{k}": v for name, m in named if isinstance(m, GLU) for k, v in m.fused_widths().items()}

    def auxiliary_loss(self) -> Tensor:
        """``aux_weight`` times the balancing loss of the last forward."""
        return self.aux_weight * self.aux_loss

    def routing_load(self) -> Tensor | None:
        """Tokens routed to each expert since the last :meth:`balance` (None without ``bias_update``)."""
        return self.expert_load

    @torch.no_grad()
    def balance(self, load: Tensor) -> None:
        """DeepSeek-V3's auxiliary-loss-free balancing (Wang et al. 2024, arXiv:2408.15664, eq. 5;
        arXiv:2412.19437, sec. 2.1.2): each expert's correction bias moves by ``bias_update`` towards the
        mean load, bias_e += gamma * sign(mean load - load_e); then the count restarts. Training calls it
        once per optimizer step with :meth:`routing_load` summed over ranks (``tfbuilder.train.task``)."""
        if self.correction_bias is None or self.expert_load is None:
            return
        self.correction_bias += self.bias_update * torch.sign(load.mean() - load)
        self.expert_load.zero_()

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


def load_fused_experts(moe: MixtureOfExperts, gate_up: Tensor, down: Tensor) -> None:
    """Copy transformers' fused expert parameters into ``moe``'s GLU experts: ``gate_up`` (experts,
    2 * hidden, d), gate rows first, into each ``experts.{e}.ff_in.weight``; ``down`` (experts, d, hidden)
    into each ``experts.{e}.ff_out.weight`` (Mixtral, Qwen2/3-MoE and DeepSeek-V3 in transformers 5)."""
    with torch.no_grad():
        for e, expert in enumerate(moe.experts):
            assert isinstance(expert, GLU), "fused gate/up weights are for swiglu or geglu experts"
            expert.ff_in.weight.copy_(gate_up[e])
            expert.ff_out.weight.copy_(down[e])


def fused_experts(moe: MixtureOfExperts) -> tuple[Tensor, Tensor]:
    """The inverse of :func:`load_fused_experts`: (gate_up (experts, 2 * hidden, d), down (experts, d, hidden))."""
    experts = [e for e in moe.experts if isinstance(e, GLU)]
    assert len(experts) == len(moe.experts), "fused gate/up weights are for swiglu or geglu experts"
    return torch.stack([e.ff_in.weight for e in experts]), torch.stack([e.ff_out.weight for e in experts])
