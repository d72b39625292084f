"""Decoding with a key/value cache: greedy, beam search, sampling. Plain PyTorch, no Lightning.

Every function takes the plain model a recipe builds (or :func:`tfbuilder.load_checkpoint` returns)
and int64 ids; sequences are right-padded with ``model.pad_id``. The decoder is fed one token per
step: self-attention keys and values are appended to a per-layer cache, and cross-attention keys
and values are computed once per source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch import Tensor

from tfbuilder.inference.interfaces import Cache, Decodable, LanguageModel, Translator, language_model, translator
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


def incremental_logits(model: Translator | LanguageModel, tgt: Tensor, src: Tensor | None = None) -> Tensor:
    """Logits for ``tgt`` (b, n) computed one token at a time through the cache: (b, n, vocab).
    Equal to ``model(src, tgt)`` (or ``model(tgt)``) when the cache is right; the tests check that."""
    cache = model.new_cache()
    steps = []
    if src is not None:
        seq2seq = translator(model)
        memory, memory_mask = seq2seq.encode(src)
        for t in range(tgt.shape[1]):
            steps.append(seq2seq.decode(tgt[:, t : t + 1], memory, memory_mask, cache=cache, offset=t))
    else:
        lm = language_model(model)
        for t in range(tgt.shape[1]):
            steps.append(lm(tgt[:, t : t + 1], cache=cache, offset=t))
    return torch.cat(steps, dim=1)


def _max_lengths(model: Decodable, src: Tensor, a: float, b: int) -> Tensor:
    """Each input's output limit (its length * a + b, the closing </s> included), never more than the
    positions the model's learned table covers: decoding stops at the model's maximum length."""
    pad_id = model.pad_id
    lengths = (src != pad_id).sum(dim=1) if pad_id is not None else torch.full_like(src[:, 0], src.shape[1])
    limits = (lengths.double() * a + b).clamp(1, 2**31).long()
    most = position_limit(model)
    return limits if most is None else limits.clamp(max=most)


def position_limit(model: Decodable) -> int | None:
    """The most positions the model's learned position tables cover (None: any length)."""

    return min((m.table.num_embeddings for m in model.modules() if isinstance(m, LearnedPosition)), default=None)


def source_batch(model: Decodable, rows: list[list[int]]) -> Tensor:
    """Sources (ids without specials) as the batch (b, j) ``model`` reads: each row followed by the
    model's end id and right-padded with its pad id (its own ids: an imported model's may differ)."""
    end, pad_id = model.specials.end, model.pad_id
    tail = [] if end is None else [end]
    out = np.full((len(rows), max((len(r) for r in rows), default=0) + len(tail)), pad_id or 0, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row) + len(tail)] = row + tail
    return torch.from_numpy(out)  # on the host: the caller moves it with the batch


def ended_sources(model: Decodable, src: Tensor) -> Tensor:
    """``src`` (b, j), right-padded, with the model's end id (</s>) after each row that lacks it: the
    sources a translation model was trained on end with it, and a caller who forgets would get
    wrong output silently. Rows that end with it are unchanged."""
    end, pad_id = model.specials.end, model.pad_id
    if end is None or pad_id is None:
        return src
    lengths = (src != pad_id).sum(dim=1)
    last = src.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
    missing = last != end  # an empty row's 'last' is its padding
    if not bool(missing.any()):
        return src
    out = torch.cat([src, torch.full_like(src[:, :1], pad_id)], dim=1)
    rows = missing.nonzero().squeeze(1)
    out[rows, lengths[rows]] = end
    return out


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


def _never(model: Decodable, device: torch.device) -> Tensor:
    return torch.tensor(model.specials.never, dtype=torch.long, device=device)


def _ids(model: Decodable) -> tuple[int, int]:
    """The model's (start, end) ids; a model without them cannot decode."""
    start, end = model.specials.start, model.specials.end
    if start is None or end is None:
        raise ValueError("this model has no start or end token: it cannot generate text")
    return start, end


@torch.no_grad()
def greedy(
    model: Translator, src: Tensor, *, max_len_a: float = 1.0, max_len_b: int = 50, rules: Rules = Rules()
) -> list[list[int]]:
    """Greedy translation of ``src`` (b, j); each output stops at </s>, or is cut to ``a * len(src) + b``
    tokens counting the closing </s>. Returns the ids without <s> and </s>."""
    found = _left_to_right(model, src, _most_likely, max_len_a=max_len_a, max_len_b=max_len_b, rules=rules)
    return [ids for _, ids in found]


@torch.no_grad()
def sample_translations(
    model: Translator,
    src: Tensor,
    *,
    n: int = 1,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    rules: Rules = Rules(),
) -> list[list[tuple[float, list[int]]]]:
    """``n`` sampled translations of each row of ``src`` (b, j), each with its log-probability under
    the model (less the <unk> penalty of :class:`Rules`): temperature, top-k and nucleus (top-p,
    Holtzman et al. 2020) sampling, as :func:`sample` draws them; lengths are limited as in
    :func:`greedy`. Returns, per input, the ``n`` samples (score, ids without <s> and </s>), most
    likely first."""
    rows = src.repeat_interleave(n, dim=0)
    pick = partial(_draw, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    drawn = _left_to_right(model, rows, pick, max_len_a=max_len_a, max_len_b=max_len_b, rules=rules)
    return [sorted(drawn[i * n : (i + 1) * n], key=lambda d: -d[0]) for i in range(src.shape[0])]


def _left_to_right(
    model: Translator, src: Tensor, pick: Pick, *, max_len_a: float, max_len_b: int, rules: Rules
) -> list[tuple[float, list[int]]]:
    """One token at a time, ``pick(logp) -> (rows,)`` choosing it from the log-probabilities the
    rules allow, until </s> or the length limit. Returns (log-probability, ids) per row; finished
    rows leave the batch."""
    model.eval()
    start, end = _ids(model)
    src = ended_sources(model, src)
    b = src.shape[0]
    limits = _max_lengths(model, src, max_len_a, max_len_b)
    memory, memory_mask = model.encode(src)
    cache = model.new_cache()
    never = _never(model, src.device)
    alive = torch.arange(b, device=src.device)  # which input each remaining row belongs to
    out: list[list[int]] = [[] for _ in range(b)]
    score = torch.zeros(b, dtype=torch.float64, device=src.device)
    token = torch.full((b, 1), start, dtype=torch.long, device=src.device)
    history = token[:, :0]
    for step in range(int(limits.max())):
        logits = model.decode(token, memory, memory_mask, cache=cache, offset=step)[:, -1]
        logp = rules.apply(logits.float().log_softmax(-1), model, history, never, step=step)
        last = step + 1 >= limits[alive]  # the limit counts the closing </s>
        chosen = torch.where(last, torch.full_like(alive, end), pick(logp))
        score.index_add_(0, alive, logp.gather(1, chosen[:, None])[:, 0].double())
        token = chosen[:, None]
        done = (chosen == end) | last
        for row, i in enumerate(alive.tolist()):
            if not done[row]:
                out[i].append(int(token[row, 0]))
        if done.all():
            break
        if rules.no_repeat_ngram:
            history = torch.cat([history, token], dim=1)
        if done.any():  # drop finished rows from every tensor, so that work shrinks with the batch
            keep = (~done).nonzero().squeeze(1)
            alive, token, memory, history = alive[keep], token[keep], memory[keep], history[keep]
            memory_mask = memory_mask[keep] if memory_mask is not None else None
            reorder(cache, keep)
    return list(zip(score.tolist(), out, strict=True))


@torch.no_grad()
def beam_search(
    model: Translator,
    src: Tensor,
    *,
    beam: int = 4,
    alpha: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    rules: Rules = Rules(),
) -> list[list[int]]:
    """Beam search with the GNMT length penalty ((5 + |y|) / 6) ^ alpha (Wu et al. 2016), as in
    Vaswani et al. 2017 (beam 4, alpha 0.6, max length = input length + 50). Returns the best
    hypothesis per input, without <s> and </s> (see :func:`beam_search_nbest`)."""
    found = beam_search_nbest(
        model, src, beam=beam, nbest=1, alpha=alpha, max_len_a=max_len_a, max_len_b=max_len_b, rules=rules
    )
    return [candidates[0][1] for candidates in found]


@torch.no_grad()
def beam_search_nbest(
    model: Translator,
    src: Tensor,
    *,
    beam: int = 4,
    nbest: int = 1,
    alpha: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    rules: Rules = Rules(),
) -> list[list[tuple[float, list[int]]]]:
    """The ``nbest`` (at most ``beam``) best hypotheses of a beam search per input, best first, each
    as (length-normalised log-probability, ids without <s> and </s>); distinct sequences.

    A beam of one is greedy search. Otherwise every live hypothesis may end at every step, and the
    ``nbest`` best ended ones are kept; an input's search ends only when no live hypothesis can still
    beat the worst of them under the length penalty, or at the length limit (Hugging Face's
    ``early_stopping=False``, with an exact bound). The greedy continuation always stays in the beam,
    so the best hypothesis never scores below greedy's."""
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest ({nbest}) must be between 1 and the beam ({beam})")
    if beam == 1:  # a beam of one is greedy search (as in Hugging Face's generate), scored the same way
        found = _left_to_right(model, src, _most_likely, max_len_a=max_len_a, max_len_b=max_len_b, rules=rules)
        return [[(score / _length_penalty(len(ids) + 1, alpha), ids)] for score, ids in found]
    model.eval()
    start, end = _ids(model)
    src = ended_sources(model, src)
    limits = _max_lengths(model, src, max_len_a, max_len_b)
    # The beams of one input share its source: memory and cross-attention keys/values stay one row
    # per input (cross-attention groups the beams' queries), and only follow the batch as it shrinks.
    memory, memory_mask = model.encode(src)
    cache = model.new_cache()
    never = _never(model, src.device)
    search = _BeamSearch.start(src.shape[0], beam=beam, nbest=nbest, alpha=alpha, limits=limits, start=start, end=end)
    for step in range(int(limits.max())):
        n = len(search.alive)
        logits = model.decode(search.tokens[:, -1:], memory, memory_mask, cache=cache, offset=step)[:, -1]
        logp = rules.apply(logits.float().log_softmax(-1), model, search.tokens[:, 1:], never, step=step)
        last = step + 1 >= limits[search.alive]  # at the length limit only </s> may follow
        kept = search.step(_only_end_where(logp, last, beam, end), last, step)
        if kept is None:
            break
        keep, select = kept
        if len(keep) < n:
            memory = memory[keep]
            memory_mask = memory_mask[keep] if memory_mask is not None else None
            reorder(cache, keep, parts=("cross",))
        reorder(cache, select, parts=("self",))
    return search.results()


def _length_penalty(length, alpha: float):
    """GNMT's ((5 + |y|) / 6) ^ alpha, for a length or a tensor of lengths."""
    return ((5.0 + length) / 6.0) ** alpha


def _only_end_where(logp: Tensor, last: Tensor, beam: int, end: int) -> Tensor:
    """Log-probabilities (n * beam, vocab) with every token but ``end`` ruled out for the inputs where
    ``last`` (n,) is true."""
    if not last.any():
        return logp
    n, vocab = last.shape[0], logp.shape[-1]
    forced = torch.full_like(logp.view(n, beam, vocab), float("-inf"))
    forced[..., end] = logp.view(n, beam, vocab)[..., end]
    return torch.where(last[:, None, None], forced, logp.view(n, beam, vocab)).view(n * beam, vocab)


@dataclass
class _BeamSearch:
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
    def start(cls, b: int, *, beam: int, nbest: int, alpha: float, limits: Tensor, start: int, end: int) -> _BeamSearch:
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

    def _record_ended(self, ended: Tensor, step: int) -> None:
        """``ended`` (n, beam): the scores of every live hypothesis followed by </s>. Those that beat
        an input's ``nbest``-th best so far replace it (length-normalised)."""
        normalised = ended / _length_penalty(step + 1, self.alpha)
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
            now / _length_penalty(self.limits[alive], self.alpha), now / _length_penalty(step + 2, self.alpha)
        )
        return last | (self.bar[alive] >= bound)

    def results(self) -> list[list[tuple[float, list[int]]]]:
        """The ``nbest`` best ended hypotheses per input, best first."""
        return [found or [(float("-inf"), [])] for found in self.finished]


@torch.no_grad()
def sample(
    model: LanguageModel,
    prompt: Tensor,
    *,
    max_new: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    rules: Rules = Rules(),
) -> list[list[int]]:
    """Continue ``prompt`` (b, n), all rows of the same length, with a decoder-only model: temperature,
    top-k and nucleus (top-p, Holtzman et al. 2020) sampling; temperature 0 is greedy.
    Returns the new ids of each row, stopping at the model's end id (</s>)."""
    model.eval()
    _, end = _ids(model)
    never = _never(model, prompt.device)
    cache = model.new_cache()
    logits = model(prompt, cache=cache)[:, -1]
    b = prompt.shape[0]
    out: list[list[int]] = [[] for _ in range(b)]
    ended = torch.zeros(b, dtype=torch.bool, device=prompt.device)
    history = prompt[:, :0]
    offset = prompt.shape[1]
    most = position_limit(model)
    if most is not None:
        max_new = min(max_new, most - offset)  # the model's table ends there
    for step in range(max_new):
        logp = rules.apply(logits.float().log_softmax(-1), model, history, never, step=step)
        token = _draw(logp, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        for i in (~ended).nonzero().squeeze(1).tolist():
            if token[i] != end:
                out[i].append(int(token[i]))
        ended |= token == end
        if ended.all():
            break
        if rules.no_repeat_ngram:
            history = torch.cat([history, token[:, None]], dim=1)
        logits = model(token[:, None], cache=cache, offset=offset + step)[:, -1]
    return out


def _most_likely(logp: Tensor) -> Tensor:
    """Greedy's pick: the most likely token of each row (rows, vocab) -> (rows,)."""
    return logp.argmax(dim=-1)


def _draw(
    logp: Tensor, *, temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator | None
) -> Tensor:
    """One token per row of ``logp`` (rows, vocab): the most likely at temperature 0, else drawn from
    softmax(logp / temperature) restricted to the top-k and the top-p nucleus."""
    if temperature == 0:
        return logp.argmax(dim=-1)
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
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)
