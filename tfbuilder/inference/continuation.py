"""Continuing prompts with a decoder-only model: greedy search and sampling (:func:`sample`), beam search
(:func:`continue_beam_search`, and :func:`transformers_beam_search`, Hugging Face's), over a batch of
prompts left-padded to one width (:func:`prompt_batch`), each row continued as it would be alone.

The prompt is read once; each new token is fed alone through the key/value cache, with the mask of
real tokens growing by one column (transformers' ``attention_mask``)."""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from tfbuilder.inference.beams import BeamSearch
from tfbuilder.inference.interfaces import Cache, Decodable, LanguageModel
from tfbuilder.inference.rules import Pick, Rules, draw, never_ids, position_limit, reorder, start_end
from tfbuilder.inference.transformers_beams import EarlyStopping, TransformersBeams


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
    attention_mask: Tensor | None = None,
) -> list[list[int]]:
    """Continue ``prompt`` (b, n) with a decoder-only model: temperature, top-k and nucleus (top-p,
    Holtzman et al. 2020) sampling; temperature 0 is greedy. Rows of different lengths are left-padded,
    ``attention_mask`` (b, n) marking their real tokens (:func:`prompt_batch` makes both); without it
    every token is real. Returns the new ids of each row, stopping at the model's end id (</s>)."""
    pick = partial(draw, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    found = continue_prompts(model, prompt, pick, max_new=max_new, rules=rules, attention_mask=attention_mask)
    return [ids for _, ids in found]


def prompt_batch(model: Decodable, rows: list[list[int]]) -> tuple[Tensor, Tensor | None]:
    """Prompts (ids) as one batch (b, n) for a decoder-only model, left-padded with its pad id (0
    without one), and the mask of their real tokens, None when every row has the same length (no
    padding: the model takes its fastest path). On the host: the caller moves both."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), model.pad_id or 0, dtype=torch.long)
    real = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        real[i, width - len(row) :] = True
    return ids, (None if all(len(r) == width for r in rows) else real)


def _feed(model: LanguageModel, tokens: Tensor, cache: Cache, offset: int, real: Tensor | None) -> Tensor:
    """The next-token logits (b, vocab) after ``tokens`` (b, n), fed through ``cache`` after ``offset``
    tokens; ``real`` (b, offset + n) marks the real ones of left-padded rows (None: all)."""
    if real is None:
        return model(tokens, cache=cache, offset=offset)[:, -1]
    return model(tokens, cache=cache, offset=offset, attention_mask=real)[:, -1]


def _grown(real: Tensor | None, rows: Tensor | None = None) -> Tensor | None:
    """The mask of real tokens (rows, j) with the rows ``rows`` kept (an index; None: all) and one real
    token more."""
    if real is None:
        return None
    if rows is not None:
        real = real[rows]
    return torch.cat([real, torch.ones_like(real[:, :1])], dim=1)


def _room(model: Decodable, width: int, max_new: int) -> int:
    """``max_new``, fewer where the model's learned position table ends."""
    most = position_limit(model)
    return max_new if most is None else min(max_new, most - width)


@torch.no_grad()
def continue_prompts(
    model: LanguageModel,
    prompt: Tensor,
    pick: Pick,
    *,
    max_new: int = 100,
    rules: Rules = Rules(),
    attention_mask: Tensor | None = None,
) -> list[tuple[float, list[int]]]:
    """Continue ``prompt`` (b, n) one token at a time, ``pick(logp) -> (rows,)`` choosing from the
    log-probabilities the rules allow, until </s> or ``max_new`` tokens. ``attention_mask`` (b, n)
    marks the real tokens of left-padded rows. Returns (log-probability, new ids without </s>) per row."""
    model.eval()
    _, end = start_end(model)
    never = never_ids(model, prompt.device)
    cache = model.new_cache()
    real = attention_mask
    logits = _feed(model, prompt, cache, 0, real)
    b, offset = prompt.shape
    out: list[list[int]] = [[] for _ in range(b)]
    score = torch.zeros(b, dtype=torch.float64, device=prompt.device)
    ended = torch.zeros(b, dtype=torch.bool, device=prompt.device)
    history = prompt[:, :0]
    for step in range(_room(model, offset, max_new)):
        logp = rules.apply(logits.float().log_softmax(-1), model, history, never, step=step)
        token = pick(logp)
        score += torch.where(ended, 0.0, logp.gather(1, token[:, None])[:, 0].double())
        for i in (~ended).nonzero().squeeze(1).tolist():
            if token[i] != end:
                out[i].append(int(token[i]))
        ended |= token == end
        if ended.all():
            break
        if rules.no_repeat_ngram:
            history = torch.cat([history, token[:, None]], dim=1)
        real = _grown(real)
        logits = _feed(model, token[:, None], cache, offset + step, real)
    return list(zip(score.tolist(), out, strict=True))


def _beams_start(
    model: LanguageModel, prompt: Tensor, beam: int, real: Tensor | None
) -> tuple[Cache, Tensor, Tensor | None]:
    """Read the prompt (b, n) once, then copy its keys and values to each of the ``beam`` rows of its
    beams: the cache, the next-token logits (b * beam, vocab) and the mask of real tokens of the rows."""
    cache = model.new_cache()
    logits = _feed(model, prompt, cache, 0, real)
    rows = torch.arange(prompt.shape[0], device=prompt.device).repeat_interleave(beam)
    reorder(cache, rows, parts=("self",))
    return cache, logits[rows], None if real is None else real[rows]


@torch.no_grad()
def continue_beam_search(
    model: LanguageModel,
    prompt: Tensor,
    *,
    beam: int = 4,
    nbest: int = 1,
    alpha: float = 0.6,
    max_new: int = 100,
    rules: Rules = Rules(),
    attention_mask: Tensor | None = None,
) -> list[list[tuple[float, list[int]]]]:
    """Beam search continuing ``prompt`` (b, n) with a decoder-only model: the ``nbest`` best
    continuations per row, best first, as (length-normalised log-probability, new ids without </s>).
    ``attention_mask`` (b, n) marks the real tokens of left-padded rows.

    The search of :func:`~tfbuilder.inference.decoding.beam_search_nbest` (GNMT length penalty, exact
    stopping bound, the greedy path kept in the beam). A hypothesis ends at </s> or, cut, at
    ``max_new`` new tokens, scored as it stands. :func:`transformers_beam_search` is Hugging Face's."""
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest ({nbest}) must be between 1 and the beam ({beam})")
    model.eval()
    _, end = start_end(model)
    never = never_ids(model, prompt.device)
    b, offset = prompt.shape
    cache, logits, real = _beams_start(model, prompt, beam, attention_mask)
    most = _room(model, offset, max_new)
    limits = torch.full((b,), most, dtype=torch.long, device=prompt.device)
    search = BeamSearch.start(b, beam=beam, nbest=nbest, alpha=alpha, limits=limits, start=end, end=end)
    for step in range(most):
        logp = rules.apply(logits.float().log_softmax(-1), model, search.tokens[:, 1:], never, step=step)
        kept = search.step(logp, torch.zeros_like(search.alive, dtype=torch.bool), step)
        if kept is None:
            break
        if step + 1 == most:  # the hypotheses still live are cut here, scored as they stand
            search.record_cut(step)
            break
        select = kept[1]
        reorder(cache, select, parts=("self",))  # the cache follows the beams
        real = _grown(real, select)
        logits = _feed(model, search.tokens[:, -1:], cache, offset + step, real)
    return search.results()


@torch.no_grad()
def transformers_beam_search(
    model: LanguageModel,
    prompt: Tensor,
    *,
    beam: int = 4,
    length_penalty: float = 1.0,
    early_stopping: EarlyStopping = False,
    max_new: int = 100,
    rules: Rules = Rules(),
    attention_mask: Tensor | None = None,
) -> list[tuple[float, list[int]]]:
    """Hugging Face transformers' beam search continuing ``prompt`` (b, n) (see
    :mod:`~tfbuilder.inference.transformers_beams`): ``generate(num_beams=beam,
    length_penalty=length_penalty, early_stopping=early_stopping, max_new_tokens=max_new)``, whose
    defaults these are but the beam (transformers' ``num_beams`` has none). Returns the best
    continuation per row (score, new ids without </s>)."""
    if beam < 1:
        raise ValueError(f"beam ({beam}) must be at least 1")
    model.eval()
    _, end = start_end(model)
    never = never_ids(model, prompt.device)
    b, offset = prompt.shape
    cache, logits, real = _beams_start(model, prompt, beam, attention_mask)
    most = _room(model, offset, max_new)
    search = TransformersBeams.start(
        b,
        beam=beam,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        max_new=most,
        end=end,
        device=prompt.device,
    )
    for step in range(most):
        logp = rules.apply(logits.float().log_softmax(-1), model, search.tokens[:, 1:], never, step=step)
        select = search.step(logp, step)
        if select is None:
            break
        reorder(cache, select, parts=("self",))  # transformers' reorder_cache
        real = _grown(real, select)
        logits = _feed(model, search.tokens[:, -1:], cache, offset + step, real)
    return search.results()
