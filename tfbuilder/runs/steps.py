"""How a run's ``metrics.csv`` (and TensorBoard, W&B, MLflow) numbers its rows.

A run numbers the metrics of optimizer step n, and of the validation after it, as step n: the step the
console, the checkpoints (``step-00000100.ckpt``) and ``summary.json`` name. Runs begun by an earlier
tfbuilder logged them as n - 1 (Lightning's logging count); their checkpoints say
nothing of it, and such a run keeps its numbering when it is resumed, so one file never mixes two.
"""

from __future__ import annotations

OPTIMIZER = "optimizer"
"""Step n logged as n: what every run begun now records in its checkpoints and ``summary.json``."""
LIGHTNING = "lightning"
"""Step n logged as n - 1: a run whose checkpoints record no numbering."""
KEY = "metrics_steps"
"""The key of the numbering in a checkpoint's ``tfbuilder`` record and in ``summary.json``."""


def of(record: object) -> str:
    """The numbering a checkpoint's ``tfbuilder`` record or a ``summary.json`` states: :data:`LIGHTNING`
    where it states none (or anything else)."""
    return OPTIMIZER if isinstance(record, dict) and record.get(KEY) == OPTIMIZER else LIGHTNING


def offset(numbering: str) -> int:
    """What a logged step number lacks of its optimizer step: 0, or 1 for :data:`LIGHTNING`."""
    return 0 if numbering == OPTIMIZER else 1


__all__ = ["KEY", "LIGHTNING", "OPTIMIZER", "of", "offset"]
