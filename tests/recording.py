"""What the optimizer is given during a real (tiny) fit: learning rates, gradients and batches per step.

Used by the reference tests of schedules, clipping and accumulation: they check what training
actually does at step k, not only the functions it is built from.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from tfbuilder.train.fit import fit
from tfbuilder.train.summary import Summary
from tfbuilder.spec.recipe import Recipe


class StepRecorder(Callback):
    """Records, at every optimizer step (after the step, when gradients are still those it used): the
    learning rate of each parameter group, optionally every gradient, and the micro-batches that
    step consumed. ``initial`` holds the model's weights before the first step."""

    def __init__(self, *, grads: bool = False):
        self.keep_grads = grads
        self.lrs: list[list[float]] = []  # per optimizer step, per parameter group
        self.grads: list[dict[str, Tensor]] = []  # per optimizer step, by parameter name
        self.batches: list[list[dict[str, Tensor]]] = []  # per optimizer step, its micro-batches
        self.global_steps: list[int] = []  # trainer.global_step when each step ran (0-based)
        self.initial: dict[str, Tensor] = {}
        self.groups: list[list[str]] = []  # parameter names of each group
        self._pending: list[dict[str, Tensor]] = []
        self._names: dict[int, str] = {}
        self._trainer: Any = None

    def on_train_start(self, trainer, pl_module) -> None:
        self._trainer = trainer
        self.initial = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}
        self._names = {id(p): n for n, p in pl_module.model.named_parameters()}
        optimizer = trainer.optimizers[0]
        self.groups = [[self._names[id(p)] for p in group["params"]] for group in optimizer.param_groups]
        optimizer.register_step_post_hook(self._stepped)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self._pending.append({k: v.detach().clone() for k, v in batch.items()})

    def _stepped(self, optimizer, args, kwargs) -> None:
        self.lrs.append([group["lr"] for group in optimizer.param_groups])
        self.global_steps.append(self._trainer.global_step)
        if self.keep_grads:
            self.grads.append(
                {self._names[id(p)]: p.grad.detach().clone() for group in optimizer.param_groups for p in group["params"] if p.grad is not None}
            )
        self.batches.append(self._pending)
        self._pending = []


def fit_recording(recipe: Recipe, monkeypatch: pytest.MonkeyPatch, recorder: StepRecorder) -> Summary:
    """``tfbuilder.fit(recipe)`` with ``recorder`` among the trainer's callbacks (``monkeypatch``: kept
    for callers; the public ``callbacks`` argument needs none)."""
    return fit(recipe, callbacks=[recorder])


def global_norm(grads: dict[str, Tensor]) -> float:
    """The 2-norm of all gradients together (what clip_grad_norm_ clips)."""
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.double()) for g in grads.values()])).item()
