"""Decoding with a key/value cache: greedy, beam search, sampling. Plain PyTorch, no Lightning.

Every function takes the plain model a recipe builds (or :func:`tfbuilder.load_checkpoint` returns)
and int64 ids; sources are right-padded with ``model.pad_id``. The decoder is fed one token per
step: self-attention keys and values are appended to a per-layer cache, and cross-attention keys
and values are computed once per source. A decoder-only model's prompts are left-padded instead
(:mod:`~tfbuilder.inference.continuation`, re-exported here: :func:`sample`, :func:`prompt_batch`,
:func:`continue_beam_search`); the rules and picks every decoder shares are in
:mod:`~tfbuilder.inference.rules` (:class:`Rules` re-exported here).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
from torch import Tensor

from tfbuilder import masks
from tfbuilder.inference.beams import BeamSearch, length_penalty, only_end_where
from tfbuilder.inference.continuation import (  # noqa: F401 (re-exported)
    continue_beam_search,
    continue_prompts,
    prompt_batch,
    sample,
    transformers_beam_search,
)
from tfbuilder.inference.interfaces import Decodable, LanguageModel, Translator, language_model, translator
from tfbuilder.inference.rules import (  # noqa: F401 (re-exported)
    Pick,
    Rules,
    draw,
    most_likely,
    never_ids,
    position_limit,
    reorder,
    start_end,
)


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


@torch.no_grad()
def greedy(
    model: Translator | LanguageModel,
    src: Tensor,
    *,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    rules: Rules = Rules(),
) -> list[list[int]]:
    """Greedy translation of ``src`` (b, j); each output stops at </s>, or is cut to ``a * len(src) + b``
    tokens counting the closing </s>. Returns the ids without <s> and </s>. A decoder-only model
    continues ``src``, its prompts left-padded with its pad id, by at most ``max_len_b`` tokens."""
    if not isinstance(model, Translator):
        lm = language_model(model)
        real = None if lm.pad_id is None else masks.left_padding(src, lm.pad_id)
        return sample(lm, src, max_new=max_len_b, temperature=0.0, rules=rules, attention_mask=real)
    found = _left_to_right(model, src, most_likely, max_len_a=max_len_a, max_len_b=max_len_b, rules=rules)
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
    pick = partial(draw, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    drawn = _left_to_right(model, rows, pick, max_len_a=max_len_a, max_len_b=max_len_b, rules=rules)
    return [sorted(drawn[i * n : (i + 1) * n], key=lambda d: -d[0]) for i in range(src.shape[0])]


def _left_to_right(
    model: Translator, src: Tensor, pick: Pick, *, max_len_a: float, max_len_b: int, rules: Rules
) -> list[tuple[float, list[int]]]:
    """One token at a time, ``pick(logp) -> (rows,)`` choosing it from the log-probabilities the
    rules allow, until </s> or the length limit. Returns (log-probability, ids) per row; finished
    rows leave the batch."""
    model.eval()
    start, end = start_end(model)
    src = ended_sources(model, src)
    b = src.shape[0]
    limits = _max_lengths(model, src, max_len_a, max_len_b)
    memory, memory_mask = model.encode(src)
    cache = model.new_cache()
    never = never_ids(model, src.device)
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
    model: Translator | LanguageModel,
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
    model: Translator | LanguageModel,
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
    so the best hypothesis never scores below greedy's.

    A decoder-only model continues ``src``, its prompts left-padded with its pad id (their real tokens
    start at each row's first other id), by at most ``max_len_b`` tokens (:func:`continue_beam_search`)."""
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest ({nbest}) must be between 1 and the beam ({beam})")
    if not isinstance(model, Translator):
        lm = language_model(model)
        real = None if lm.pad_id is None else masks.left_padding(src, lm.pad_id)
        return continue_beam_search(
            lm, src, beam=beam, nbest=nbest, alpha=alpha, max_new=max_len_b, rules=rules, attention_mask=real
        )
    if beam == 1:  # a beam of one is greedy search (as in Hugging Face's generate), scored the same way
        found = _left_to_right(model, src, most_likely, max_len_a=max_len_a, max_len_b=max_len_b, rules=rules)
        return [[(score / length_penalty(len(ids) + 1, alpha), ids)] for score, ids in found]
    model.eval()
    start, end = start_end(model)
    src = ended_sources(model, src)
    limits = _max_lengths(model, src, max_len_a, max_len_b)
    # The beams of one input share its source: memory and cross-attention keys/values stay one row
    # per input (cross-attention groups the beams' queries), and only follow the batch as it shrinks.
    memory, memory_mask = model.encode(src)
    cache = model.new_cache()
    never = never_ids(model, src.device)
    search = BeamSearch.start(src.shape[0], beam=beam, nbest=nbest, alpha=alpha, limits=limits, start=start, end=end)
    for step in range(int(limits.max())):
        n = len(search.alive)
        logits = model.decode(search.tokens[:, -1:], memory, memory_mask, cache=cache, offset=step)[:, -1]
        logp = rules.apply(logits.float().log_softmax(-1), model, search.tokens[:, 1:], never, step=step)
        last = step + 1 >= limits[search.alive]  # at the length limit only </s> may follow
        kept = search.step(only_end_where(logp, last, beam, end), last, step)
        if kept is None:
            break
        keep, select = kept
        if len(keep) < n:
            memory = memory[keep]
            memory_mask = memory_mask[keep] if memory_mask is not None else None
            reorder(cache, keep, parts=("cross",))
        reorder(cache, select, parts=("self",))
    return search.results()
