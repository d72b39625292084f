"""How a validation metric is shown to a person, the same on the console, in a fit's summary and in
``tfbuilder test``: accuracies as percentages, losses and scores as numbers."""

from __future__ import annotations

FORMATS = {
    "val_loss": "{:.4f}",
    "val_ppl": "{:.2f}",
    "val_acc": "{:.2%}",
    "val_bleu": "{:.2f}",
    "val_f1": "{:.4f}",
    "val_mse": "{:.4f}",
    "val_pearson": "{:.4f}",
}


def show(name: str, value: float) -> str:
    """``value`` of the metric ``name`` (``val_acc``, ...) as it is shown: 0.9778 -> ``97.78%``."""
    return FORMATS.get(name, "{:.4g}").format(value)


__all__ = ["FORMATS", "show"]
