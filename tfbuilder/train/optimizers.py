"""Optimizers built from a recipe's ``optim`` section: Adam, AdamW, and Muon for the hidden weight
matrices with AdamW for everything else (no Lightning here).

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks",
https://kellerjordan.github.io/posts/muon/) orthogonalises each 2-D update with Newton-Schulz
iterations; it is meant for the hidden layers' weight matrices only. The standard split, as in the
Muon reference and Moonshot's "Muon is Scalable for LLM Training" (Liu et al. 2025,
arXiv:2502.16982): the 2-D weights of the encoder and decoder stacks (attention and feed-forward
matrices, routers) go to Muon; embeddings, the output head, norms, biases and learned scalars or
vectors go to AdamW.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tfbuilder.model.model import Model
from tfbuilder.spec.sections import OptimSection


def muon_split(model: Model) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """The model's parameters as ``(muon, adamw)``, each a list of ``(name, parameter)``: Muon takes
    the 2-D weights inside the stacks (``model.stacks()``), AdamW the rest."""
    hidden = {id(p) for stack in model.stacks().values() for p in stack.parameters() if p.ndim == 2}
    muon: list[tuple[str, nn.Parameter]] = []
    adamw: list[tuple[str, nn.Parameter]] = []
    for name, p in model.named_parameters():
        (muon if id(p) in hidden else adamw).append((name, p))
    return muon, adamw


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon for the hidden weight matrices and AdamW for the rest, stepped together as one optimizer
    (one learning-rate schedule, one checkpoint entry). ``param_groups`` are the two optimizers' own
    groups, so a scheduler setting ``lr`` reaches both; ``state_dict`` holds both states."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW):
        self.muon, self.adamw = muon, adamw
        super().__init__([p for g in muon.param_groups + adamw.param_groups for p in g["params"]], {})
        self.param_groups = muon.param_groups + adamw.param_groups  # the same dicts: lr changes reach both

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        self.param_groups = self.muon.param_groups + self.adamw.param_groups


def build_optimizer(model: Model, optim: OptimSection) -> torch.optim.Optimizer:
    """The optimizer ``optim`` names, with base learning rate 1 (the schedule sets each step's rate,
    see :func:`tfbuilder.train.schedules.learning_rate`). Adam and AdamW: weight matrices and embedding
    tables in one group (decayed by AdamW), the rest in another; Muon: see :func:`muon_split`, its
    groups' base rate ``muon.lr / optim.lr`` so that it follows the same schedule to its own peak."""
    if optim.optimizer != "muon":
        params = list(model.parameters())
        groups = [
            {
                "params": [p for p in params if p.ndim >= 2],
                "weight_decay": optim.weight_decay if optim.optimizer == "adamw" else 0.0,
            },
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ]
        cls = torch.optim.AdamW if optim.optimizer == "adamw" else torch.optim.Adam
        # The fused kernel is one pass over all parameters: several times faster than the default on CPU.
        return cls(groups, lr=1.0, betas=optim.betas, eps=optim.eps, fused=True)
    settings = optim.muon
    hidden, rest = muon_split(model)
    muon = torch.optim.Muon(
        [p for _, p in hidden],
        lr=(settings.lr or optim.lr) / optim.lr,
        weight_decay=optim.weight_decay if settings.weight_decay is None else settings.weight_decay,
        momentum=settings.momentum,
        nesterov=settings.nesterov,
        ns_steps=settings.ns_steps,
        adjust_lr_fn=settings.adjust_lr,
    )
    adamw = torch.optim.AdamW(
        [
            {"params": [p for _, p in rest if p.ndim >= 2], "weight_decay": optim.weight_decay},
            {"params": [p for _, p in rest if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=1.0,
        betas=optim.betas,
        eps=optim.eps,
        fused=True,
    )
    return MuonWithAdamW(muon, adamw)


def describe_split(model: Model) -> list[str]:
    """Lines for ``tfbuilder show``: which parameters each optimizer of the Muon split gets."""
    hidden, rest = muon_split(model)
    lines = []
    for label, named in (
        ("muon (2-D weights of the stacks)", hidden),
        ("adamw (embeddings, head, norms, biases, scalars)", rest),
    ):
        count = sum(p.numel() for _, p in named)
        kinds = sorted({_kind(name) for name, _ in named})
        lines.append(f"{label}: {len(named)} tensors, {count:,} parameters")
        lines.append("  " + ", ".join(kinds))
    return lines


def _kind(name: str) -> str:
    """A parameter's name without layer indices: ``decoder.layers.*.self_attn.inner.to_qkv.weight``."""
    return ".".join("*" if part.isdigit() else part for part in name.split("."))
