"""What every decoder shares: the rules every pick obeys (:class:`Rules`), the picks themselves
(greedy's, sampling's), the model's special ids and position limit, and the reordering of a key/value
cache as the rows of a batch move."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from tfbuilder.inference.interfaces import Cache, Decodable
from tfbuilder.model.components.position import LearnedPosition

Pick = Callable[[Tensor], Tensor]
"""How a decoder chooses the next token of each row from its log-probabilities (rows, vocab) -> (rows,)."""


def reorder(cache: Cache, rows: Tensor, parts: tuple[str, ...] = ("self", "cross")) -> None:
    """Keep (and reorder) the batch rows ``rows`` of the cached tensors of ``parts``, in place."""
    for layer in cache:
        for name in parts:
            part = layer.get(name, {})
            for key in part:
                part[key] = part[key].index_select(0, rows)


def position_limit(model: Decodable) -> int | None:
    """The most positions the model's learned position tables cover (None: any length)."""

    return min((m.table.num_embeddings for m in model.modules() if isinstance(m, LearnedPosition)), default=None)


@dataclass(frozen=True)
class Rules:
    """What every pick of every decoder obeys. The model's ``never`` ids (<pad>, <s>, <mask>) are never
    generated; ``unk_penalty`` is taken from the log-probability of <unk> (fairseq's ``--unk-penalty``;
    negative favours it); with ``no_repeat_ngram`` n > 0 no n-gram occurs twice in an output (fairseq's and
    Hugging Face's ``no_repeat_ngram_size``); no output is shorter than ``min_len`` tokens unless the length
    limit ends it (</s> ruled out before; fairseq's ``--min-len``: no search returns an empty output)."""

    unk_penalty: float = 0.0
    no_repeat_ngram: int = 0
    min_len: int = 1

    def apply(self, logp: Tensor, model: Decodable, history: Tensor, never: Tensor, *, step: int) -> Tensor:
        """``logp`` (rows, vocab) log-probabilities of the next token of outputs ``history`` (rows, t),
        generated tokens only, when ``step`` tokens have been generated, with the rules applied (in place)."""
        logp.index_fill_(1, never, float("-inf"))
        end, unk = model.specials.end, model.specials.unk
        if step < self.min_len and end is not None:
            logp[:, end] = float("-inf")
        if self.unk_penalty and unk is not None:
            logp[:, unk] -= self.unk_penalty
        n = self.no_repeat_ngram
        if n and history.shape[1] >= n:
            # Each earlier n-gram whose first n-1 tokens are the output's last n-1 bans its last token.
            grams = history.unfold(1, n, 1)  # (rows, windows, n)
            seen = (grams[:, :, :-1] == history[:, None, history.shape[1] - n + 1 :]).all(dim=-1)
            banned = torch.zeros_like(logp).scatter_add_(1, grams[:, :, -1], seen.to(logp.dtype))
            logp.masked_fill_(banned > 0, float("-inf"))
        return logp


def never_ids(model: Decodable, device: torch.device) -> Tensor:
    return torch.tensor(model.specials.never, dtype=torch.long, device=device)


def start_end(model: Decodable) -> tuple[int, int]:
    """The model's (start, end) ids; a model without them cannot decode."""
    start, end = model.specials.start, model.specials.end
    if start is None or end is None:
        raise ValueError("this model has no start or end token: it cannot generate text")
    return start, end


def most_likely(logp: Tensor) -> Tensor:
    """Greedy's pick: the most likely token of each row (rows, vocab) -> (rows,)."""
    return logp.argmax(dim=-1)


def draw(
    logp: Tensor, *, temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator | None
) -> Tensor:
    """One token per row of ``logp`` (rows, vocab): the most likely at temperature 0, else drawn from
    :func:`distribution`."""
    if temperature == 0:
        return logp.argmax(dim=-1)
    probs = distribution(logp, temperature=temperature, top_k=top_k, top_p=top_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def distribution(logp: Tensor, *, temperature: float, top_k: int | None, top_p: float | None) -> Tensor:
    """What sampling draws from, (rows, vocab) float64: softmax(logp / temperature) restricted to the
    top-k tokens, then to the top-p nucleus (Holtzman et al. 2020, arXiv:1904.09751): transformers'
    temperature, top-k and top-p warpers, in that order. ``temperature`` > 0."""
    # Shift the row's maximum to 0 first, in float64 (a temperature of 1e-320 is 0 in float32):
    # divided by a tiny temperature the others go to -inf, never NaN.
    logp = logp.double()
    logits = (logp - logp.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already hold top_p of the mass.
        drop = probs.cumsum(-1) - probs >= top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits.softmax(-1)
