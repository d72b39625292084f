"""The losses of a sequence head: label-smoothed cross-entropy over classes (Szegedy et al. 2016),
or the squared error of a number. Returned as an :class:`~tfbuilder.train.result.Result` whose
``tokens`` are the texts, so that training and validation average per text."""

from __future__ import annotations

import torch
from torch import Tensor

from tfbuilder.model.model import DecoderOnly, EncoderOnly
from tfbuilder.train.result import Result


def sequence_loss(
    model: DecoderOnly | EncoderOnly, batch: dict[str, Tensor], *, epsilon: float, regress: bool
) -> Result:
    """The head's loss on ``batch`` (``tokens`` (b, n), ``token_types`` (b, n), ``labels`` (b,)):
    mean over texts; ``nll`` sums the unsmoothed cross-entropy (regress: the squared error)."""
    tokens = batch["tokens"]
    hidden = model.features(tokens, token_types=batch.get("token_types"))
    outputs = model.head(hidden, tokens=tokens)  # (b, c)
    labels = batch["labels"]
    texts = torch.tensor(labels.shape[0], device=labels.device)
    if regress:
        error = (outputs.float().squeeze(-1) - labels.float()) ** 2
        return Result(error.mean(), error.sum().detach(), torch.zeros_like(texts), texts, outputs=outputs.detach())
    logp = outputs.float().log_softmax(dim=-1)
    nll = -logp.gather(1, labels.long()[:, None]).squeeze(1)
    loss = nll if epsilon == 0 else (1 - epsilon) * nll - epsilon * logp.mean(dim=-1)
    correct = (logp.argmax(dim=-1) == labels).sum()
    return Result(loss.mean(), nll.sum().detach(), correct, texts, outputs=outputs.detach())
