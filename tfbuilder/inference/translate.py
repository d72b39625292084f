"""Translating text with a checkpoint (beam search, sampling, ensembles) and continuing a prompt:
inference, below training (training's validation BLEU translates lines). No Lightning here."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch
from torch import nn

from tfbuilder.data.batching import pack
from tfbuilder.data.prepare import Vocab
from tfbuilder.devices import model_device
from tfbuilder.inference import decoding
from tfbuilder.inference.ensemble import Ensemble
from tfbuilder.inference.interfaces import Translator, language_model, translator
from tfbuilder.inference.rules import Rules
from tfbuilder.model import sizing
from tfbuilder.runs.checkpoints import Loaded
from tfbuilder.specials import TRANSLATION_ADDED

Precision = Literal["32", "bf16"]
M = TypeVar("M", bound=nn.Module)
DEFAULT_MAX_SOURCE = 1024  # source tokens read of a line, where the model's positions have no end


def source_limit(loaded: Loaded) -> int:
    """The most source tokens of a line a translation reads: what the model's learned position table
    holds (less the end token), else :data:`DEFAULT_MAX_SOURCE` (sinusoidal, rotary and relative
    positions go on for ever, but a line's attention grows with the square of its length)."""
    limit = sizing.max_positions(loaded.recipe.model)
    return DEFAULT_MAX_SOURCE if limit is None else max(1, limit - TRANSLATION_ADDED)


def translate_lines(loaded: Loaded, lines: Iterable[str], **options) -> Iterator[str]:
    """:func:`translate` with a checkpoint's model and tokenizers (``options``: beam, alpha,
    unk_penalty, no_repeat_ngram, max_tokens, chunk, precision)."""
    return translate(loaded.model, loaded.vocab, lines, **options)


def translate(
    model: nn.Module,
    vocab: Vocab,
    lines: Iterable[str],
    *,
    beam: int = 4,
    alpha: float = 0.6,
    unk_penalty: float = 0.0,
    no_repeat_ngram: int = 0,
    max_tokens: int = 6000,
    chunk: int = 512,
    precision: Precision = "32",
) -> Iterator[str]:
    """Translate ``lines`` in order, ``chunk`` lines at a time (so output streams while input is read),
    each chunk sorted by length into batches of at most ``max_tokens`` source tokens; beam 1 is greedy.
    ``precision="bf16"`` decodes with a bfloat16 copy of the model (faster on CPUs with bf16 matrix
    instructions; log-probabilities are computed in float32 either way). ``model`` may be an
    :class:`~tfbuilder.inference.ensemble.Ensemble`."""
    search = Search(beam=beam, alpha=alpha, unk_penalty=unk_penalty, no_repeat_ngram=no_repeat_ngram)
    for text, _ in translate_scored(
        model, vocab, lines, search=search, max_tokens=max_tokens, chunk=chunk, precision=precision
    ):
        yield text


def translate_scored(
    model: nn.Module,
    vocab: Vocab,
    lines: Iterable[str],
    *,
    search: Search,
    max_tokens: int = 6000,
    chunk: int = 512,
    precision: Precision = "32",
    max_source: int = DEFAULT_MAX_SOURCE,
) -> Iterator[tuple[str, float]]:
    """The best translation of each of ``lines`` with its score, in order, as :func:`translate` finds
    them; a line of more than ``max_source`` tokens is translated from its first ``max_source``."""
    model = decoding_model(model, precision)
    buffer: list[str] = []
    for line in lines:
        buffer.append(line.rstrip("\n"))
        if len(buffer) >= chunk:
            yield from (
                found[0]
                for found in translate_batch(
                    model, vocab, buffer, search=search, max_tokens=max_tokens, max_source=max_source
                )
            )
            buffer = []
    if buffer:
        yield from (
            found[0]
            for found in translate_batch(
                model, vocab, buffer, search=search, max_tokens=max_tokens, max_source=max_source
            )
        )


def decoding_model(model: M, precision: Precision) -> M:
    """``model`` itself for float32; a bfloat16 copy for ``bf16`` (the caller's model is untouched)."""
    if precision == "32":
        return model
    if precision == "bf16":
        return copy.deepcopy(model).to(torch.bfloat16)
    raise ValueError(f"precision must be '32' or 'bf16', not {precision!r}")


@dataclass(frozen=True)
class Search:
    """How translations are found: beam search (``beam`` 1 is greedy) with the GNMT length penalty
    ``alpha``, or, with ``sample``, drawing (``temperature``, ``top_k``, ``top_p``); ``nbest``
    candidates per sentence; every pick obeys the :class:`~tfbuilder.inference.decoding.Rules` made of
    ``unk_penalty`` and ``no_repeat_ngram``."""

    beam: int = 4
    alpha: float = 0.6
    nbest: int = 1
    sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    unk_penalty: float = 0.0
    no_repeat_ngram: int = 0

    def __post_init__(self) -> None:
        if not self.sample and self.nbest > self.beam:
            raise ValueError(f"--nbest {self.nbest} needs a beam at least as wide (--beam {self.beam})")
        if self.no_repeat_ngram < 0:
            raise ValueError(f"--no-repeat-ngram-size must be 0 (off) or more, not {self.no_repeat_ngram}")

    @property
    def rules(self) -> decoding.Rules:
        return decoding.Rules(unk_penalty=self.unk_penalty, no_repeat_ngram=self.no_repeat_ngram)


def translate_batch(
    model: nn.Module,
    vocab: Vocab,
    lines: list[str],
    *,
    search: Search = Search(),
    max_tokens: int = 6000,
    batch_size: int | None = None,
    generator: torch.Generator | None = None,
    max_source: int = DEFAULT_MAX_SOURCE,
    cut: Callable[[int, int], None] | None = None,
) -> list[list[tuple[str, float]]]:
    """The ``search.nbest`` best candidates (text, score) for each of ``lines``, best first. Lines are
    sorted by length into batches of at most ``max_tokens`` source tokens (and ``batch_size``
    sentences). Scores: the length-normalised log-probability beam search ranks by; for samples,
    their log-probability. ``model``: a translation model (:class:`~tfbuilder.inference.interfaces.Translator`).
    An empty line (no tokens) translates to an empty line, without a search: every search gives at least
    one token (:class:`~tfbuilder.inference.decoding.Rules`' ``min_len``). A line of more than
    ``max_source`` tokens is translated from its first ``max_source`` (``cut(i, tokens)`` is told of
    line ``i``), so that one long line cannot take the memory and time of its squared length."""
    seq2seq = translator(model)
    ids = vocab.src.encode_batch(lines)
    for i, x in enumerate(ids):
        if len(x) > max_source:
            if cut is not None:
                cut(i, len(x))
            ids[i] = x[:max_source]
    sizes = [len(x) + TRANSLATION_ADDED for x in ids]  # x</s>
    order = sorted((i for i in range(len(ids)) if ids[i]), key=lambda i: sizes[i])
    out: list[list[tuple[str, float]]] = [[] if ids[i] else [("", 0.0)] for i in range(len(lines))]
    if not order:
        return out
    # Beams (and samples) multiply the decoder's batch: keep the budget about the same.
    width = search.nbest if search.sample else search.beam
    device = model_device(model)
    for batch in pack(
        sizes, sizes, order, max_tokens=max(max_tokens // max(width, 1), max(sizes)), batch_size=batch_size
    ):
        src = decoding.source_batch(seq2seq, [ids[i] for i in batch]).to(device, non_blocking=True)
        for i, candidates in zip(batch, _search(seq2seq, src, search, generator), strict=True):
            out[i] = [(vocab.tgt.decode(hyp), score) for score, hyp in candidates]
    return out


def _search(
    model: Translator, src: torch.Tensor, search: Search, generator: torch.Generator | None
) -> list[list[tuple[float, list[int]]]]:
    rules = search.rules
    if search.sample:
        return decoding.sample_translations(
            model,
            src,
            n=search.nbest,
            temperature=search.temperature,
            top_k=search.top_k,
            top_p=search.top_p,
            generator=generator,
            rules=rules,
        )
    if search.beam == 1:  # greedy: the most likely token each step (temperature 0), with its score
        return decoding.sample_translations(model, src, n=1, temperature=0.0, rules=rules)
    return decoding.beam_search_nbest(model, src, beam=search.beam, nbest=search.nbest, alpha=search.alpha, rules=rules)


def ensemble_of(loaded: Loaded, others: Sequence[Loaded]) -> Ensemble:
    """The models of ``loaded`` and ``others`` as one :class:`~tfbuilder.inference.ensemble.Ensemble`; a
    ``ValueError`` naming the checkpoint that does not fit (another vocabulary or model kind)."""
    for other in others:
        if other.recipe.model.kind != "encoder_decoder" or loaded.recipe.model.kind != "encoder_decoder":
            raise ValueError(f"{other.describe()}: only translation (encoder_decoder) models can be ensembled")
        if other.vocab.to_json() != loaded.vocab.to_json():
            raise ValueError(
                f"{other.describe()} has another vocabulary than {loaded.describe()}: "
                "models must share one to be ensembled"
            )
    return Ensemble([loaded.model, *(o.model for o in others)]).eval()


def generate(loaded: Loaded, prompt: str, *, echo: bool = False, **kwargs) -> str:
    """Continue ``prompt`` with a decoder-only checkpoint (see :func:`generate_batch`, which takes ``kwargs``):
    the new text, or with ``echo`` the prompt's tokens and the new ones decoded together (the prompt as
    the model read it)."""
    return generate_batch(loaded, [prompt], echo=echo, **kwargs)[0]


def generate_batch(
    loaded: Loaded,
    prompts: list[str],
    *,
    echo: bool = False,
    max_new: int = 100,
    beam: int = 1,
    alpha: float = 0.6,
    rules: Rules = Rules(),
    **sampling,
) -> list[str]:
    """Continue ``prompts`` with a decoder-only checkpoint, each from the model's start id, as one batch
    left-padded to the longest (each row continues as it would alone): with ``beam`` > 1 by beam search
    (:func:`~tfbuilder.inference.decoding.continue_beam_search`, length penalty ``alpha``), else by
    :func:`~tfbuilder.inference.decoding.sample`, which takes ``sampling`` (temperature, top_k, top_p,
    generator). Returns the texts in order, as :func:`generate`."""
    model = language_model(loaded.model)
    start = model.specials.start
    tokens = [loaded.vocab.tgt.encode(prompt) for prompt in prompts]
    prefixes = [([] if start is None else [start]) + t for t in tokens]
    check_positions(loaded, max(len(p) for p in prefixes), max_new)
    ids, real = decoding.prompt_batch(model, prefixes)
    device = model_device(loaded.model)
    ids, real = ids.to(device), None if real is None else real.to(device)
    if beam > 1:
        found = decoding.continue_beam_search(
            model, ids, beam=beam, alpha=alpha, max_new=max_new, rules=rules, attention_mask=real
        )
        new = [candidates[0][1] for candidates in found]
    else:
        new = decoding.sample(model, ids, max_new=max_new, rules=rules, attention_mask=real, **sampling)
    return [loaded.vocab.tgt.decode(t + n if echo else n) for t, n in zip(tokens, new, strict=True)]


def check_positions(loaded: Loaded, prefix: int, max_new: int) -> None:
    """Refuse (``ValueError``) a continuation that could run past the model's learned position table:
    :func:`generate_batch` feeds the ``prefix`` tokens (the longest prompt's) and each of ``max_new`` new ones."""
    limit = sizing.max_positions(loaded.recipe.model)
    if limit is None or prefix + max_new <= limit:
        return
    if prefix >= limit:
        raise ValueError(
            f"the prompt takes {prefix} positions; the model's learned position table has {limit}: shorten the prompt"
        )
    raise ValueError(
        f"the prompt ({prefix} positions) and --max-new {max_new} need {prefix + max_new} positions; the model's "
        f"learned position table has {limit}: give --max-new {limit - prefix} or less"
    )
