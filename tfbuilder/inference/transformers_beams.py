"""Hugging Face transformers' beam search (``model.generate(num_beams=...)``: ``GenerationMixin._beam_search``
of transformers 4.50 and later), so that a decoder-only model continues prompts as transformers does.

Per step and input, from the ``beam`` running hypotheses and their summed log-probabilities:

1. the best 2 * beam continuations over every running hypothesis and token;
2. those among the first ``beam`` of them that end (</s>, or the ``max_new``-th new token) are
   finished, scored sum / length ** length_penalty (length: the new tokens, </s> counted), and kept
   if among the ``beam`` best finished so far;
3. the ``beam`` best that do not end run on;
4. an input takes no more finished hypotheses once every slot is full and the best running score
   cannot beat the worst finished one: over its current length (``early_stopping`` False), over
   ``max_new`` when ``length_penalty`` > 0 (``"never"``), or as soon as the slots are full (True).

Unlike :class:`~tfbuilder.inference.beams.BeamSearch`, an ending hypothesis ranked below the first
``beam`` candidates is dropped, the greedy path may leave the beam, and the stop is a heuristic
(transformers' own docstring: ``early_stopping="never"`` with ``length_penalty=0`` is the
canonical search).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

EarlyStopping = bool | Literal["never"]
NEVER = -1.0e9  # transformers' stand-in for minus infinity in beam scores


@dataclass
class TransformersBeams:
    """The running and finished hypotheses of a batch of inputs (b), ``beam`` each."""

    beam: int
    length_penalty: float
    early_stopping: EarlyStopping
    max_new: int
    end: int
    tokens: Tensor  # (b * beam, 1 + t): a placeholder column, then the running hypotheses' new tokens
    scores: Tensor  # (b, beam) their summed log-probabilities, best first
    closed: Tensor  # (b,) inputs that take no more finished hypotheses
    finished: list[list[tuple[float, list[int]]]]  # per input, at most beam, best first

    @classmethod
    def start(
        cls, b: int, *, beam: int, length_penalty: float, early_stopping: EarlyStopping, max_new: int, end: int, device
    ) -> TransformersBeams:
        scores = torch.full((b, beam), NEVER, device=device)
        scores[:, 0] = 0.0  # the beams start identical: one runs
        return cls(
            beam=beam,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
            max_new=max_new,
            end=end,
            tokens=torch.full((b * beam, 1), end, dtype=torch.long, device=device),
            scores=scores,
            closed=torch.zeros(b, dtype=torch.bool, device=device),
            finished=[[] for _ in range(b)],
        )

    def step(self, logp: Tensor, step: int) -> Tensor | None:
        """Extend the running hypotheses by ``logp`` (b * beam, vocab), the ``step``-th new token.
        Returns the rows the new running hypotheses extend (for the cache), or None when the search is over."""
        b, vocab = self.scores.shape[0], logp.shape[-1]
        candidates = (self.scores[:, :, None] + logp.view(b, self.beam, vocab)).view(b, -1)
        top, index = candidates.topk(2 * self.beam, dim=1)
        rows = index // vocab + torch.arange(b, device=logp.device)[:, None] * self.beam
        word = index % vocab
        length = step + 1
        ends = (word == self.end) | (length >= self.max_new)
        self._finish(top, rows, word, ends, length)
        running = top + ends.to(top.dtype) * NEVER
        keep = running.topk(self.beam, dim=1).indices
        self.scores = running.gather(1, keep)
        select = rows.gather(1, keep).view(-1)
        self.tokens = torch.cat([self.tokens[select], word.gather(1, keep).view(-1, 1)], dim=1)
        self._close(length)
        full = torch.tensor([len(f) == self.beam for f in self.finished], device=logp.device)
        if bool(self.closed.all()) or bool(ends.all()) or (self.early_stopping is True and bool(full.all())):
            return None
        return select

    def _finish(self, top: Tensor, rows: Tensor, word: Tensor, ends: Tensor, length: int) -> None:
        """Finish the candidates among the first ``beam`` of each input that end."""
        scores = top[:, : self.beam] / length**self.length_penalty
        full = [len(kept) == self.beam for kept in self.finished]  # as the step starts
        for i, r in ends[:, : self.beam].nonzero().tolist():
            kept = self.finished[i]
            if bool(self.closed[i]) or (self.early_stopping is True and full[i]):
                continue
            w = int(word[i, r])
            ids = self.tokens[int(rows[i, r]), 1:].tolist() + ([] if w == self.end else [w])
            kept.append((float(scores[i, r]), ids))
            kept.sort(key=lambda h: -h[0])  # stable: of equal scores, the earlier
            del kept[self.beam :]

    def _close(self, length: int) -> None:
        """Close the inputs whose best running hypothesis cannot beat their worst finished one."""
        hypothetical = self.max_new if self.early_stopping == "never" and self.length_penalty > 0 else length
        best = (self.scores[:, 0] / hypothetical**self.length_penalty).tolist()
        for i, kept in enumerate(self.finished):
            if len(kept) == self.beam and not best[i] > kept[-1][0]:
                self.closed[i] = True

    def results(self) -> list[tuple[float, list[int]]]:
        """The best finished hypothesis of each input (score, new ids without </s>)."""
        return [found[0] if found else (float("-inf"), []) for found in self.finished]
