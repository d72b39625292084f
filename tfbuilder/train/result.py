"""What an objective returns: the sums of a batch (:class:`Result`), for the objectives of every model
kind (:mod:`tfbuilder.train.objectives`) and of the sequence heads (:mod:`tfbuilder.train.heads.objective`).
``tfbuilder.train.objectives.Result`` is this class."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class Result:
    """Sums over the target tokens of a batch, so that averages are exact across batches and ranks.
    All are tensors on the model's device: reading them is left to the caller (a host sync)."""

    loss: Tensor  # mean smoothed loss per target token (what is optimised)
    nll: Tensor  # summed negative log-likelihood (for perplexity)
    correct: Tensor  # argmax hits
    tokens: Tensor  # target tokens that count (a sequence head: texts)
    outputs: Tensor | None = None  # a sequence head's outputs (b, c), for its scores
