"""Scores of a sequence head, from sums that add up across batches and ranks.

classify: a confusion matrix (c, c), rows the true class, columns the predicted one; accuracy and
macro-F1 (the unweighted mean over classes of 2 tp / (2 tp + fp + fn), over the classes that occur
as a label or as a prediction, as scikit-learn's ``f1_score(average="macro")``).
regress: n, sum y, sum p, sum y^2, sum p^2, sum y p, sum (p - y)^2; the mean squared error and
Pearson's r = cov(p, y) / (std p * std y) (NaN when either is constant).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

REGRESS_SUMS = 7


def confusion(predicted: Tensor, target: Tensor, classes: int) -> Tensor:
    """(c, c) float64 counts: ``[t, p]`` texts of class t predicted as p."""
    flat = target.long() * classes + predicted.long()
    return torch.bincount(flat, minlength=classes * classes).reshape(classes, classes).double()


def accuracy(matrix: Tensor) -> float:
    total = float(matrix.sum())
    return float(matrix.diagonal().sum()) / total if total else math.nan


def macro_f1(matrix: Tensor) -> float:
    tp = matrix.diagonal()
    fp = matrix.sum(dim=0) - tp  # predicted as the class, labelled otherwise
    fn = matrix.sum(dim=1) - tp  # labelled as the class, predicted otherwise
    denominator = 2 * tp + fp + fn
    seen = denominator > 0
    if not bool(seen.any()):
        return math.nan
    return float((2 * tp[seen] / denominator[seen]).mean())


def regress_sums(predicted: Tensor, target: Tensor) -> Tensor:
    """The :data:`REGRESS_SUMS` sums of a batch, float64."""
    p, y = predicted.double().reshape(-1), target.double().reshape(-1)
    return torch.stack(
        [
            torch.tensor(float(p.numel()), dtype=torch.float64, device=p.device),
            y.sum(),
            p.sum(),
            (y * y).sum(),
            (p * p).sum(),
            (y * p).sum(),
            ((p - y) ** 2).sum(),
        ]
    )


def mse(sums: Tensor) -> float:
    n = float(sums[0])
    return float(sums[6]) / n if n else math.nan


def pearson(sums: Tensor) -> float:
    n, sy, sp, syy, spp, syp = (float(v) for v in sums[:6])
    covariance = n * syp - sy * sp
    spread = (n * syy - sy * sy) * (n * spp - sp * sp)
    return covariance / math.sqrt(spread) if spread > 0 else math.nan


def batch_sums(kind: str, outputs: Tensor, labels: Tensor, classes: int) -> Tensor:
    """The sums of one batch, flat float64: a confusion matrix (classify) or the regression sums."""
    if kind == "regress":
        return regress_sums(outputs.reshape(-1), labels)
    return confusion(outputs.argmax(dim=-1), labels, classes).reshape(-1)


def size(kind: str, classes: int) -> int:
    """Length of :func:`batch_sums`' vector."""
    return REGRESS_SUMS if kind == "regress" else classes * classes


def scores(kind: str, sums: Tensor, classes: int, *, prefix: str = "") -> dict[str, float]:
    """``{prefix}acc`` and ``{prefix}f1`` (classify) or ``{prefix}mse`` and ``{prefix}pearson`` (regress)."""
    sums = sums.detach().double().cpu()
    if kind == "regress":
        return {f"{prefix}mse": mse(sums), f"{prefix}pearson": pearson(sums)}
    matrix = sums.reshape(classes, classes)
    return {f"{prefix}acc": accuracy(matrix), f"{prefix}f1": macro_f1(matrix)}
