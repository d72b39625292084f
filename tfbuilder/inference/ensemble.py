"""Several translation models decoding as one (an ensemble). Plain PyTorch, no Lightning.

At every step each model predicts the next token and the ensemble's distribution is the mean of
their probabilities, computed in log space (``logsumexp(log p_i) - log n``), as fairseq's
ensembles do. The ensemble has the interface the decoders use (``encode``, ``decode``,
``new_cache``, ``pad_id``, ``specials``), so greedy, beam search and sampling take it as they take
one model; its members must share their vocabulary and special ids.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from tfbuilder.model.model import EncoderDecoder


class Ensemble(nn.Module):
    """Translation models averaged at each step: ``members`` (two or more ``EncoderDecoder``)."""

    kind = "encoder_decoder"

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        if len(members) < 2:
            raise ValueError("an ensemble needs at least two models")
        models = _translation_models(members)
        first = models[0]
        self.members = nn.ModuleList(models)
        self.pad_id = first.pad_id
        self.specials = first.specials
        # Memories are concatenated along the feature axis; each member reads back its own slice.
        self._widths = [m.src_embed.tokens.embedding_dim for m in models]
        self._layers = [len(m.new_cache()) for m in models]

    def models(self) -> list[EncoderDecoder]:
        """The members, typed (``members``, a ModuleList, holds them for parameters, devices and state)."""
        return [m for m in self.members if isinstance(m, EncoderDecoder)]  # all of them: __init__ checks

    def new_cache(self) -> list[dict]:
        """The members' caches, one after the other."""
        return [layer for m in self.models() for layer in m.new_cache()]

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor | None]:
        """``src`` (b, j) -> the members' memories side by side (b, j, sum of d) and the key mask."""
        encoded = [m.encode(src) for m in self.models()]
        return torch.cat([memory for memory, _ in encoded], dim=-1), encoded[0][1]

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        memory_mask: Tensor | None,
        *,
        cache: list[dict] | None = None,
        offset: int = 0,
    ) -> Tensor:
        """``tgt`` (b, i) -> the log of the members' mean next-token probabilities (b, i, vocab)."""
        memories = memory.split(self._widths, dim=-1)
        starts = [sum(self._layers[:k]) for k in range(len(self._layers))]
        logps = [
            m.decode(tgt, mem, memory_mask, cache=None if cache is None else cache[s : s + n], offset=offset)
            .float()
            .log_softmax(-1)
            for m, mem, s, n in zip(self.models(), memories, starts, self._layers, strict=True)
        ]
        return torch.logsumexp(torch.stack(logps), dim=0) - math.log(len(logps))

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """``src`` (b, j), ``tgt`` (b, i) -> the ensemble's log-probabilities (b, i, vocab), teacher-forced."""
        memory, memory_mask = self.encode(src)
        return self.decode(tgt, memory, memory_mask)


def _translation_models(members: Sequence[nn.Module]) -> list[EncoderDecoder]:
    """``members`` as translation models sharing their special ids; a ``ValueError`` naming the first that is not."""
    models: list[EncoderDecoder] = []
    for i, m in enumerate(members, start=1):
        if not isinstance(m, EncoderDecoder):
            raise ValueError(f"model {i} is not a translation (encoder_decoder) model")
        if models and (m.pad_id, m.specials) != (models[0].pad_id, models[0].specials):
            raise ValueError(f"model {i} has other special ids than model 1: they cannot be ensembled")
        models.append(m)
    return models
