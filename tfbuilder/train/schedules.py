"""Learning-rate schedules as functions of the optimizer step (1-based, as in the paper)."""

from __future__ import annotations

import math
from collections.abc import Callable

from tfbuilder.spec.sections import ScheduleSection


def learning_rate(schedule: ScheduleSection, *, d_model: int, lr: float, max_steps: int) -> Callable[[int], float]:
    """The learning rate at optimizer step ``step`` (>= 1)."""
    warmup = schedule.warmup

    def inverse_sqrt(step: int) -> float:
        # lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (Vaswani et al. 2017, eq. 3)
        if warmup == 0:
            return schedule.scale * d_model**-0.5 * step**-0.5
        return schedule.scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)

    def cosine(step: int) -> float:
        if step <= warmup:
            return lr * step / max(warmup, 1)
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return schedule.min_lr + (lr - schedule.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))

    def constant(step: int) -> float:
        return lr * min(1.0, step / warmup) if warmup else lr

    return {"inverse_sqrt": inverse_sqrt, "cosine": cosine, "constant": constant}[schedule.type]
