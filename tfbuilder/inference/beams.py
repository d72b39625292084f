"""The state of a beam search over a batch (:class:`BeamSearch`) and its length penalty: what the
translation search and the decoder-only continuation of :mod:`tfbuilder.inference.decoding` share."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def length_penalty(length, alpha: float):
    """GNMT's ((5 + |y|) / 6) ^ alpha, for a length or a tensor of lengths."""
    return ((5.0 + length) / 6.0) ** alpha


def only_end_where(logp: Tensor, last: Tensor, beam: int, end: int) -> Tensor:
    """Log-probabilities (n * beam, vocab) with every token but ``end`` ruled out for the inputs where
    ``last`` (n,) is true."""
    if not last.any():
        return logp
    n, vocab = last.shape[0], logp.shape[-1]
    forced = torch.full_like(logp.view(n, beam, vocab), float("-inf"))
    forced[..., end] = logp.view(n, beam, vocab)[..., end]
    return torch.where(last[:, None, None], forced, logp.view(n, beam, vocab)).view(n * beam, vocab)


@dataclass
class BeamSearch:
    """A beam search over a batch: the inputs still searching with their live hypotheses, and the
    best ended hypotheses of every input."""

    beam: int
    nbest: int
    alpha: float
    end: int
    limits: Tensor  # (b,) the longest output of each input, </s> counted
    alive: Tensor  # (n,) the inputs still searching
    tokens: Tensor  # (n * beam, t) their live hypotheses, <s> first
    scores: Tensor  # (n, beam) the hypotheses' log-probabilities, best first
    greedy: Tensor  # (n,) the beam slot holding the greedy hypothesis, -1 once it has ended
    bar: Tensor  # (b,) the nbest-th best ended score per input, length-normalised (-inf until nbest ended)
    finished: list[list[tuple[float, list[int]]]]  # per input: its nbest best ended (normalised score, ids), best first

    @classmethod
    def start(cls, b: int, *, beam: int, nbest: int, alpha: float, limits: Tensor, start: int, end: int) -> BeamSearch:
        device = limits.device
        scores = torch.full((b, beam), float("-inf"), device=device)
        scores[:, 0] = 0.0  # all beams start identical: keep one
        return cls(
            beam=beam,
            nbest=nbest,
            alpha=alpha,
            end=end,
            limits=limits,
            alive=torch.arange(b, device=device),
            tokens=torch.full((b * beam, 1), start, dtype=torch.long, device=device),
            scores=scores,
            greedy=torch.zeros(b, dtype=torch.long, device=device),
            bar=torch.full((b,), float("-inf"), device=device),
            finished=[[] for _ in range(b)],
        )

    def step(self, logp: Tensor, last: Tensor, step: int) -> tuple[Tensor, Tensor] | None:
        """Extend the live hypotheses by ``logp`` (n * beam, vocab): record those that end, keep the
        best ``beam`` that do not (the greedy one among them), and drop the inputs whose search is
        over. Returns the rows of the inputs kept and the rows of the hypotheses extended (for the
        cache), or None when every search is over."""
        n, vocab = len(self.alive), logp.shape[-1]
        candidates = self.scores[:, :, None] + logp.view(n, self.beam, vocab)  # (n, beam, vocab)
        self._record_ended(candidates[:, :, self.end], step)
        candidates[:, :, self.end] = float("-inf")
        live_scores, index = candidates.view(n, self.beam * vocab).topk(self.beam, dim=1)
        index, live_scores, self.greedy = self._keep_greedy(logp.view(n, self.beam, vocab), index, live_scores)
        origin, word = index // vocab, index % vocab
        keep = (~self._over(live_scores.max(dim=1).values, last, step)).nonzero().squeeze(1)
        if len(keep) == 0:
            return None
        select = (keep[:, None] * self.beam + origin[keep]).reshape(-1)  # rows of the surviving beams
        self.tokens = torch.cat([self.tokens[select], word[keep].reshape(-1, 1)], dim=1)
        self.scores = live_scores[keep]
        self.greedy = self.greedy[keep]
        self.alive = self.alive[keep]
        return keep, select

    def _keep_greedy(self, logp: Tensor, index: Tensor, live_scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The candidates ``index`` (n, beam) with the greedy hypothesis's continuation in the last
        slot where the best ``beam`` left it out, and the greedy hypothesis's new slot (-1 once its
        most likely next token is </s>: then it has just ended and been recorded)."""
        if not bool((self.greedy >= 0).any()):
            return index, live_scores, self.greedy
        n, vocab = logp.shape[0], logp.shape[-1]
        has = self.greedy >= 0
        slot = self.greedy.clamp(min=0)
        rows = torch.arange(n, device=index.device)
        word = logp[rows, slot].argmax(dim=-1)
        goes_on = has & (word != self.end)
        wanted = slot * vocab + word
        found = (index == wanted[:, None]) & goes_on[:, None]
        missing = goes_on & ~found.any(dim=1)
        score = self.scores[rows, slot] + logp[rows, slot, word]
        index = index.clone()
        index[:, -1] = torch.where(missing, wanted, index[:, -1])
        live_scores = live_scores.clone()
        live_scores[:, -1] = torch.where(missing, score, live_scores[:, -1])
        new_slot = torch.where(missing, torch.full_like(slot, self.beam - 1), found.long().argmax(dim=1))
        return index, live_scores, torch.where(goes_on, new_slot, torch.full_like(slot, -1))

    def record_cut(self, step: int) -> None:
        """Record every live hypothesis as it stands, cut at the length limit after ``step`` + 1 tokens
        (a decoder-only continuation's ``max_new``; no </s> follows them)."""
        self._record_ended(self.scores, step)

    def _record_ended(self, ended: Tensor, step: int) -> None:
        """``ended`` (n, beam): the scores of every live hypothesis followed by </s>. Those that beat
        an input's ``nbest``-th best so far replace it (length-normalised)."""
        normalised = ended / length_penalty(step + 1, self.alpha)
        if self.nbest == 1:  # the common case, without a Python loop over candidates
            best, column = normalised.max(dim=1)  # of equal scores, the first
            rows = (best > self.bar[self.alive]).nonzero().squeeze(1)
            if len(rows) == 0:
                return
            inputs = self.alive[rows]
            self.bar[inputs] = best[rows]
            ids = self.tokens[rows * self.beam + column[rows], 1:].tolist()
            for i, score, hyp in zip(inputs.tolist(), best[rows].tolist(), ids, strict=True):
                self.finished[i] = [(score, hyp)]
            return
        better = normalised > self.bar[self.alive][:, None]
        if not bool(better.any()):
            return
        for r, c in better.nonzero().tolist():
            i = int(self.alive[r])
            score = float(normalised[r, c])
            if score <= float(self.bar[i]):  # an earlier candidate of this step raised the bar
                continue
            kept = self.finished[i]
            kept.append((score, self.tokens[r * self.beam + c, 1:].tolist()))
            kept.sort(key=lambda h: -h[0])  # stable: of equal scores, the one that ended first
            del kept[self.nbest :]
            if len(kept) == self.nbest:
                self.bar[i] = kept[-1][0]

    def _over(self, now: Tensor, last: Tensor, step: int) -> Tensor:
        """Which inputs' searches are over: at the length limit, or when no live hypothesis can beat
        the ``nbest``-th best ended one. A live hypothesis (best score ``now``) only loses
        log-probability; it ends with between step + 2 and limit tokens, so its normalised score is
        at most ``now`` over one of those penalties."""
        alive = self.alive
        bound = torch.maximum(
            now / length_penalty(self.limits[alive], self.alpha), now / length_penalty(step + 2, self.alpha)
        )
        return last | (self.bar[alive] >= bound)

    def results(self) -> list[list[tuple[float, list[int]]]]:
        """The ``nbest`` best ended hypotheses per input, best first."""
        return [found or [(float("-inf"), [])] for found in self.finished]
