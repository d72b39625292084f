"""Training objectives: label-smoothed cross-entropy on the positions that count (no Lightning here)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .data.tokenizers import MASK, PAD
from .sections import SPECIAL_TOKENS


@dataclass
class Result:
    """Sums over the target tokens of a batch, so that averages are exact across batches and ranks."""

    loss: Tensor  # mean smoothed loss per target token (what is optimised)
    nll: Tensor  # summed negative log-likelihood (for perplexity)
    correct: Tensor  # argmax hits
    tokens: int


def smoothed_cross_entropy(logits: Tensor, target: Tensor, epsilon: float) -> Result:
    """Label smoothing (Szegedy et al. 2016; Vaswani et al. 2017 sec. 5.4): (1-eps) NLL + eps * uniform CE.
    ``logits`` (t, vocab) and ``target`` (t,) hold real target tokens only."""
    logp = logits.float().log_softmax(dim=-1)
    nll = -logp.gather(1, target[:, None]).squeeze(1)
    loss = nll if epsilon == 0 else (1 - epsilon) * nll - epsilon * logp.mean(dim=-1)
    with torch.no_grad():
        correct = (logits.argmax(dim=-1) == target).sum()
    return Result(loss.mean(), nll.detach().sum(), correct, int(target.numel()))


def seq2seq(model: nn.Module, batch: dict[str, Tensor], epsilon: float) -> Result:
    """Teacher-forced translation: predict ``tgt_out`` from ``src`` and ``tgt_in``."""
    hidden = model.features(batch["src"], batch["tgt_in"])
    target = batch["tgt_out"]
    real = target != PAD
    # The vocabulary projection is the costliest matmul: apply it to real tokens only, not padding.
    return smoothed_cross_entropy(model.head(hidden[real]), target[real], epsilon)


def causal_lm(model: nn.Module, batch: dict[str, Tensor], epsilon: float) -> Result:
    """Next-token prediction on ``tokens`` (<s> x </s>)."""
    tokens = batch["tokens"]
    hidden = model.features(tokens[:, :-1])
    target = tokens[:, 1:]
    real = target != PAD
    return smoothed_cross_entropy(model.head(hidden[real]), target[real], epsilon)


def masked_lm(model: nn.Module, batch: dict[str, Tensor], epsilon: float, *, probability: float, vocab_size: int) -> Result:
    """BERT's masked LM (Devlin et al. 2019): predict a random ``probability`` share of the real tokens,
    shown as <mask> 80% of the time, a random token 10%, unchanged 10%."""
    tokens = batch["tokens"]
    candidates = tokens >= len(SPECIAL_TOKENS)
    chosen = candidates & (torch.rand(tokens.shape, device=tokens.device) < probability)
    if not chosen.any():  # always predict at least one token
        first = candidates.float().argmax(dim=1)
        chosen[torch.arange(len(tokens)), first] = candidates[torch.arange(len(tokens)), first]
    roll = torch.rand(tokens.shape, device=tokens.device)
    inputs = torch.where(chosen & (roll < 0.8), torch.full_like(tokens, MASK), tokens)
    random_ids = torch.randint(len(SPECIAL_TOKENS), vocab_size, tokens.shape, device=tokens.device)
    inputs = torch.where(chosen & (roll >= 0.8) & (roll < 0.9), random_ids, inputs)
    hidden = model.features(inputs)
    return smoothed_cross_entropy(model.head(hidden[chosen]), tokens[chosen], epsilon)
