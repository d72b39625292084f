"""Decoding with a key/value cache: greedy, beam search, sampling. Plain PyTorch, no Lightning.

Every function takes the plain model a recipe builds (or :func:`tfbuilder.load_checkpoint` returns)
and int64 ids; sequences are right-padded with ``model.pad_id``. The decoder is fed one token per
step: self-attention keys and values are appended to a per-layer cache, and cross-attention keys
and values are computed once per source.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .data.tokenizers import BOS, EOS


def reorder(cache: list[dict], rows: Tensor, parts: tuple[str, ...] = ("self", "cross")) -> None:
    """Keep (and reorder) the batch rows ``rows`` of the cached tensors of ``parts``, in place."""
    for layer in cache:
        for name in parts:
            part = layer.get(name, {})
            for key in part:
                part[key] = part[key].index_select(0, rows)


def incremental_logits(model: nn.Module, tgt: Tensor, src: Tensor | None = None) -> Tensor:
    """Logits for ``tgt`` (b, n) computed one token at a time through the cache: (b, n, vocab).
    Equal to ``model(src, tgt)`` (or ``model(tgt)``) when the cache is right; the tests check that."""
    cache = model.new_cache()
    steps = []
    if src is not None:
        memory, memory_mask = model.encode(src)
        for t in range(tgt.shape[1]):
            steps.append(model.decode(tgt[:, t : t + 1], memory, memory_mask, cache=cache, offset=t))
    else:
        for t in range(tgt.shape[1]):
            steps.append(model(tgt[:, t : t + 1], cache=cache, offset=t))
    return torch.cat(steps, dim=1)


def _max_lengths(src: Tensor, pad_id: int, a: float, b: int) -> Tensor:
    return ((src != pad_id).sum(dim=1).float() * a + b).long()


@torch.no_grad()
def greedy(model: nn.Module, src: Tensor, *, max_len_a: float = 1.0, max_len_b: int = 50) -> list[list[int]]:
    """Greedy translation of ``src`` (b, j); each output stops at </s>, or is cut to ``a * len(src) + b``
    tokens counting the closing </s>. Returns the ids without <s> and </s>."""
    pick = lambda logits: logits.argmax(dim=-1)  # noqa: E731
    return [ids for _, ids in _left_to_right(model, src, pick, max_len_a=max_len_a, max_len_b=max_len_b)]


@torch.no_grad()
def sample_translations(
    model: nn.Module,
    src: Tensor,
    *,
    n: int = 1,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
) -> list[list[tuple[float, list[int]]]]:
    """``n`` sampled translations of each row of ``src`` (b, j), each with its log-probability under
    the model: temperature, top-k and nucleus (top-p, Holtzman et al. 2020) sampling, as
    :func:`sample` draws them; lengths are limited as in :func:`greedy`. Returns, per input, the
    ``n`` samples (score, ids without <s> and </s>), most likely first."""
    rows = src.repeat_interleave(n, dim=0)
    pick = lambda logits: _draw(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)  # noqa: E731
    drawn = _left_to_right(model, rows, pick, max_len_a=max_len_a, max_len_b=max_len_b)
    return [sorted(drawn[i * n : (i + 1) * n], key=lambda d: -d[0]) for i in range(src.shape[0])]


def _left_to_right(model: nn.Module, src: Tensor, pick, *, max_len_a: float, max_len_b: int) -> list[tuple[float, list[int]]]:
    """One token at a time, ``pick(logits) -> (rows,)`` choosing it, until </s> or the length limit.
    Returns (log-probability under the model, ids) per row; finished rows leave the batch."""
    model.eval()
    b = src.shape[0]
    limits = _max_lengths(src, model.pad_id, max_len_a, max_len_b)
    memory, memory_mask = model.encode(src)
    cache = model.new_cache()
    alive = torch.arange(b, device=src.device)  # which input each remaining row belongs to
    out: list[list[int]] = [[] for _ in range(b)]
    score = torch.zeros(b, dtype=torch.float64, device=src.device)
    token = torch.full((b, 1), BOS, dtype=torch.long, device=src.device)
    for step in range(int(limits.max())):
        logits = model.decode(token, memory, memory_mask, cache=cache, offset=step)[:, -1]
        last = step + 1 >= limits[alive]  # the limit counts the closing </s>
        chosen = torch.where(last, torch.full_like(alive, EOS), pick(logits))
        score.index_add_(0, alive, logits.float().log_softmax(-1).gather(1, chosen[:, None])[:, 0].double())
        token = chosen[:, None]
        done = (chosen == EOS) | last
        for row, i in enumerate(alive.tolist()):
            if not done[row]:
                out[i].append(int(token[row, 0]))
        if done.all():
            break
        if done.any():  # drop finished rows from every tensor, so that work shrinks with the batch
            keep = (~done).nonzero().squeeze(1)
            alive, token, memory = alive[keep], token[keep], memory[keep]
            memory_mask = memory_mask[keep] if memory_mask is not None else None
            reorder(cache, keep)
    return list(zip(score.tolist(), out))


@torch.no_grad()
def beam_search(
    model: nn.Module,
    src: Tensor,
    *,
    beam: int = 4,
    alpha: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
) -> list[list[int]]:
    """Beam search with the GNMT length penalty ((5 + |y|) / 6) ^ alpha (Wu et al. 2016), as in
    Vaswani et al. 2017 (beam 4, alpha 0.6, max length = input length + 50). Returns the best
    hypothesis per input, without <s> and </s> (see :func:`beam_search_nbest`)."""
    found = beam_search_nbest(model, src, beam=beam, nbest=1, alpha=alpha, max_len_a=max_len_a, max_len_b=max_len_b)
    return [candidates[0][1] for candidates in found]


@torch.no_grad()
def beam_search_nbest(
    model: nn.Module,
    src: Tensor,
    *,
    beam: int = 4,
    nbest: int = 1,
    alpha: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
) -> list[list[tuple[float, list[int]]]]:
    """The ``nbest`` (at most ``beam``) best hypotheses of a beam search per input, best first, each
    as (length-normalised log-probability, ids without <s> and </s>). An input's search ends when
    ``beam`` hypotheses have ended, or earlier when no live hypothesis can still beat the
    ``nbest``-th best ended one (an exact bound: the result is the same)."""
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest ({nbest}) must be between 1 and the beam ({beam})")
    model.eval()
    limits = _max_lengths(src, model.pad_id, max_len_a, max_len_b)
    # The beams of one input share its source: memory and cross-attention keys/values stay one row
    # per input (cross-attention groups the beams' queries), and only follow the batch as it shrinks.
    memory, memory_mask = model.encode(src)
    cache = model.new_cache()
    search = _BeamSearch.start(src.shape[0], beam=beam, nbest=nbest, alpha=alpha, limits=limits, device=src.device)
    for step in range(int(limits.max())):
        n = len(search.alive)
        logp = model.decode(search.tokens[:, -1:], memory, memory_mask, cache=cache, offset=step)[:, -1].float().log_softmax(-1)
        last = step + 1 >= limits[search.alive]  # at the length limit only </s> may follow
        keep, select = search.step(_only_eos_where(logp, last, beam), last, step)
        if keep is None:
            break
        if len(keep) < n:
            memory = memory[keep]
            memory_mask = memory_mask[keep] if memory_mask is not None else None
            reorder(cache, keep, parts=("cross",))
        reorder(cache, select, parts=("self",))
    return search.results()


def _length_penalty(length, alpha: float):
    """GNMT's ((5 + |y|) / 6) ^ alpha, for a length or a tensor of lengths."""
    return ((5.0 + length) / 6.0) ** alpha


def _only_eos_where(logp: Tensor, last: Tensor, beam: int) -> Tensor:
    """Log-probabilities (n * beam, vocab) with every token but </s> ruled out for the inputs where
    ``last`` (n,) is true."""
    if not last.any():
        return logp
    n, vocab = last.shape[0], logp.shape[-1]
    forced = torch.full_like(logp.view(n, beam, vocab), float("-inf"))
    forced[..., EOS] = logp.view(n, beam, vocab)[..., EOS]
    return torch.where(last[:, None, None], forced, logp.view(n, beam, vocab)).view(n * beam, vocab)


@dataclass
class _BeamSearch:
    """A beam search over a batch: the inputs still searching with their live hypotheses, and the
    ended hypotheses of every input."""

    beam: int
    nbest: int
    alpha: float
    limits: Tensor  # (b,) the longest output of each input, </s> counted
    alive: Tensor  # (n,) the inputs still searching
    tokens: Tensor  # (n * beam, t) their live hypotheses, <s> first
    scores: Tensor  # (n, beam) the hypotheses' log-probabilities
    ended: Tensor  # (b,) hypotheses ended so far per input (at most beam count)
    bar: Tensor  # (b,) the nbest-th best ended score per input, length-normalised (-inf until nbest ended)
    finished: list[list[tuple[float, list[int]]]]  # per input: (normalised score, ids) of its ended hypotheses

    @classmethod
    def start(cls, b: int, *, beam: int, nbest: int, alpha: float, limits: Tensor, device) -> "_BeamSearch":
        scores = torch.full((b, beam), float("-inf"), device=device)
        scores[:, 0] = 0.0  # all beams start identical: keep one
        return cls(
            beam=beam,
            nbest=nbest,
            alpha=alpha,
            limits=limits,
            alive=torch.arange(b, device=device),
            tokens=torch.full((b * beam, 1), BOS, dtype=torch.long, device=device),
            scores=scores,
            ended=torch.zeros(b, dtype=torch.long, device=device),
            bar=torch.full((b,), float("-inf"), device=device),
            finished=[[] for _ in range(b)],
        )

    def step(self, logp: Tensor, last: Tensor, step: int) -> tuple[Tensor | None, Tensor | None]:
        """Extend the live hypotheses by ``logp`` (n * beam, vocab): record those that end, keep the
        best ``beam`` that do not, and drop the inputs whose search is over. Returns the rows of the
        inputs kept and the rows of the hypotheses extended (for the cache), or (None, None) when
        every search is over."""
        n, vocab = len(self.alive), logp.shape[-1]
        candidates = (self.scores.view(n * self.beam, 1) + logp).view(n, self.beam * vocab)
        top_scores, top_index = candidates.topk(2 * self.beam, dim=1)
        origin, word = top_index // vocab, top_index % vocab
        is_eos = word == EOS
        self._record_ended(top_scores, origin, is_eos, step)
        # The best `beam` candidates that did not end continue.
        live_scores, pick = top_scores.masked_fill(is_eos, float("-inf")).topk(self.beam, dim=1)
        origin, word = origin.gather(1, pick), word.gather(1, pick)
        keep = (~self._over(live_scores[:, 0], last, step)).nonzero().squeeze(1)
        if len(keep) == 0:
            return None, None
        select = (keep[:, None] * self.beam + origin[keep]).reshape(-1)  # rows of the surviving beams
        self.tokens = torch.cat([self.tokens[select], word[keep].reshape(-1, 1)], dim=1)
        self.scores = live_scores[keep]
        self.alive = self.alive[keep]
        return keep, select

    def _record_ended(self, top_scores: Tensor, origin: Tensor, is_eos: Tensor, step: int) -> None:
        """Ended hypotheses among the best ``beam`` candidates are final (normalised by length)."""
        penalty = _length_penalty(step + 1, self.alpha)
        first_beams = torch.arange(2 * self.beam, device=is_eos.device) < self.beam
        for r, c in (is_eos & first_beams).nonzero().tolist():
            i = int(self.alive[r])
            if self.ended[i] < self.beam:
                self.ended[i] += 1
                score = float(top_scores[r, c]) / penalty
                self.finished[i].append((score, self.tokens[r * self.beam + origin[r, c], 1:].tolist()))
                if len(self.finished[i]) >= self.nbest:
                    self.bar[i] = sorted((s for s, _ in self.finished[i]), reverse=True)[self.nbest - 1]

    def _over(self, now: Tensor, last: Tensor, step: int) -> Tensor:
        """Which inputs' searches are over: at the length limit, ``beam`` hypotheses ended, or no live
        one can beat the ``nbest``-th best ended one. A live hypothesis (best score ``now``) only loses log-probability; it ends with
        between step + 2 and limit tokens, so its normalised score is at most ``now`` over one of
        those penalties."""
        alive = self.alive
        bound = torch.maximum(now / _length_penalty(self.limits[alive], self.alpha), now / _length_penalty(step + 2, self.alpha))
        return last | (self.ended[alive] >= self.beam) | (self.bar[alive] >= bound)

    def results(self) -> list[list[tuple[float, list[int]]]]:
        """The ``nbest`` best ended hypotheses per input, best first (of equal scores, the one that
        ended first: sorted() is stable)."""
        return [sorted(found, key=lambda h: -h[0])[: self.nbest] or [(float("-inf"), [])] for found in self.finished]


@torch.no_grad()
def sample(
    model: nn.Module,
    prompt: Tensor,
    *,
    max_new: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """Continue ``prompt`` (b, n), all rows of the same length, with a decoder-only model: temperature,
    top-k and nucleus (top-p, Holtzman et al. 2020) sampling; temperature 0 is greedy.
    Returns the new ids of each row, stopping at </s>."""
    model.eval()
    cache = model.new_cache()
    logits = model(prompt, cache=cache)[:, -1]
    b = prompt.shape[0]
    out: list[list[int]] = [[] for _ in range(b)]
    ended = torch.zeros(b, dtype=torch.bool, device=prompt.device)
    offset = prompt.shape[1]
    for step in range(max_new):
        token = _draw(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        for i in (~ended).nonzero().squeeze(1).tolist():
            if token[i] != EOS:
                out[i].append(int(token[i]))
        ended |= token == EOS
        if ended.all():
            break
        logits = model(token[:, None], cache=cache, offset=offset + step)[:, -1]
    return out


def _draw(logits: Tensor, *, temperature: float, top_k: int | None, top_p: float | None, generator) -> Tensor:
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already hold top_p of the mass.
        drop = probs.cumsum(-1) - probs >= top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)
