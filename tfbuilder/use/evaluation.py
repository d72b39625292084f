"""Translating text and scoring a checkpoint: loss, perplexity, sacreBLEU and chrF. No Lightning here."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterable, Iterator, Sequence
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from tfbuilder.inference import decoding
from tfbuilder.train import objectives, preflight
from tfbuilder.data.batching import pack
from tfbuilder.data.collate import Collate, lengths
from tfbuilder.data.packing import packed_splits
from tfbuilder.data.prepare import Vocab, prepare
from tfbuilder.devices import model_device
from tfbuilder.inference.ensemble import Ensemble
from tfbuilder.runs.checkpoints import Loaded, run_dir_of, scores_file
from tfbuilder.specials import TRANSLATION_ADDED

Precision = Literal["32", "bf16"]


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
    for text, _ in translate_scored(model, vocab, lines, search=search, max_tokens=max_tokens, chunk=chunk, precision=precision):
        yield text


def translate_scored(
    model: nn.Module,
    vocab: Vocab,
    lines: Iterable[str],
    *,
    search: "Search",
    max_tokens: int = 6000,
    chunk: int = 512,
    precision: Precision = "32",
) -> Iterator[tuple[str, float]]:
    """The best translation of each of ``lines`` with its score, in order, as :func:`translate` finds them."""
    model = decoding_model(model, precision)
    buffer: list[str] = []
    for line in lines:
        buffer.append(line.rstrip("\n"))
        if len(buffer) >= chunk:
            yield from (found[0] for found in translate_batch(model, vocab, buffer, search=search, max_tokens=max_tokens))
            buffer = []
    if buffer:
        yield from (found[0] for found in translate_batch(model, vocab, buffer, search=search, max_tokens=max_tokens))


def decoding_model(model: nn.Module, precision: Precision) -> nn.Module:
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
) -> list[list[tuple[str, float]]]:
    """The ``search.nbest`` best candidates (text, score) for each of ``lines``, best first. Lines are
    sorted by length into batches of at most ``max_tokens`` source tokens (and ``batch_size``
    sentences). Scores: the length-normalised log-probability beam search ranks by; for samples,
    their log-probability."""
    ids = vocab.src.encode_batch(lines)
    sizes = [len(x) + TRANSLATION_ADDED for x in ids]  # x</s>
    order = sorted(range(len(ids)), key=lambda i: sizes[i])
    out: list[list[tuple[str, float]]] = [[] for _ in lines]
    # Beams (and samples) multiply the decoder's batch: keep the budget about the same.
    width = search.nbest if search.sample else search.beam
    device = model_device(model)
    for batch in pack(sizes, sizes, order, max_tokens=max(max_tokens // max(width, 1), max(sizes)), batch_size=batch_size):
        src = decoding.source_batch(model, [ids[i] for i in batch]).to(device, non_blocking=True)
        for i, candidates in zip(batch, _search(model, src, search, generator)):
            out[i] = [(vocab.tgt.decode(hyp), score) for score, hyp in candidates]
    return out


def _search(model: nn.Module, src: torch.Tensor, search: Search, generator) -> list[list[tuple[float, list[int]]]]:
    rules = search.rules
    if search.sample:
        return decoding.sample_translations(
            model, src, n=search.nbest, temperature=search.temperature, top_k=search.top_k, top_p=search.top_p,
            generator=generator, rules=rules,
        )
    if search.beam == 1:  # greedy: the most likely token each step (temperature 0), with its score
        return decoding.sample_translations(model, src, n=1, temperature=0.0, rules=rules)
    return decoding.beam_search_nbest(model, src, beam=search.beam, nbest=search.nbest, alpha=search.alpha, rules=rules)


@dataclass
class Scores:
    split: str
    examples: int
    loss: float
    perplexity: float
    bleu: float | None = None
    chrf: float | None = None
    bleu_signature: str | None = None
    beam: int | None = None
    seconds_decoding: float | None = None
    precision: str | None = None
    accuracy: float | None = None  # share of target tokens predicted right (teacher forcing)
    exact_match: float | None = None  # share of outputs equal to their reference
    bleu_tokenize: str | None = None  # sacreBLEU's tokenizer: 13a (words), or char for character-level data
    ensemble: list[str] | None = None  # the checkpoints scored together, when more than one


@dataclass(frozen=True)
class Output:
    """One translated example of a split: its source, reference, the hypothesis and its score."""

    source: str
    reference: str
    hypothesis: str
    score: float


def evaluate(loaded: Loaded, split: str = "test", **options) -> Scores:
    """Loss and perplexity on ``split`` (per-token NLL, unsmoothed, float32); for sequence-to-sequence
    models also sacreBLEU and chrF of the detokenized output against the raw references.
    ``options`` are :func:`evaluate_outputs`'s (beam, alpha, max_tokens, precision, search, ensemble)."""
    return evaluate_outputs(loaded, split, **options)[0]


@torch.no_grad()
def evaluate_outputs(
    loaded: Loaded,
    split: str = "test",
    *,
    beam: int = 4,
    alpha: float = 0.6,
    max_tokens: int = 6000,
    precision: Precision = "32",
    search: Search | None = None,
    ensemble: Sequence[Loaded] = (),
) -> tuple[Scores, list[Output]]:
    """:func:`evaluate`, with the translations (in the split's order; none for other model kinds).
    ``search`` (default: beam ``beam``, ``alpha``) finds them; with ``ensemble`` (more checkpoints
    sharing the vocabulary), the models translate and are scored together (:class:`~tfbuilder.inference.ensemble.Ensemble`)."""
    search = search or Search(beam=beam, alpha=alpha)
    recipe = loaded.recipe
    if recipe.model.head is not None:
        raise ValueError("a model with a sequence head (model.head) is scored by tfbuilder.use.predict.score")
    data = recipe.data
    if data is None:
        raise ValueError("the checkpoint's recipe has no data section")
    prepared = prepare(data, vocab=loaded.vocab, model_vocab=recipe.model.vocab_size)
    if split not in prepared.splits:
        raise ValueError(f"no '{split}' split in {data.path or 'the data'} (have: {', '.join(prepared.splits)})")
    ids = prepared.vocab.specials  # what the data's batches are made with
    examples = packed_splits(prepared.splits, data, causal=recipe.model.kind == "decoder", eos=ids.end)[split]
    model = ensemble_of(loaded, ensemble) if ensemble else loaded.model.eval()
    device = model_device(model)
    kind = recipe.model.kind
    objective = teacher_forced if ensemble else objectives.objective(recipe, epsilon=0.0)
    collate = Collate(examples, ids)
    src_sizes, tgt_sizes, extra = lengths(examples)
    nll = tokens = correct = 0.0
    torch.manual_seed(0)  # the masked-LM objective draws its masks
    # A model without a pad id cannot tell padding from a token: score it one sentence at a time.
    unpadded = {"max_tokens": None, "batch_size": 1} if recipe.model.pad_id is None else {"max_tokens": max_tokens, "batch_size": None}
    by_length = np.lexsort((tgt_sizes, src_sizes))
    for batch_ids in pack(src_sizes, tgt_sizes, by_length, extra=extra, **unpadded):
        batch = {k: v.to(device, non_blocking=True) for k, v in collate(batch_ids).items()}
        result = objective(model, batch)
        nll += float(result.nll)
        tokens += int(result.tokens)
        correct += float(result.correct)
    loss = nll / max(tokens, 1)
    scores = Scores(split, len(examples), loss, math.exp(min(loss, 50)), accuracy=correct / max(tokens, 1))
    if ensemble:
        scores.ensemble = [str(x.path) for x in (loaded, *ensemble)]
    outputs: list[Output] = []
    if kind == "encoder_decoder":
        sources, references = prepared.raw[split]
        start = time.perf_counter()
        found = list(translate_scored(model, loaded.vocab, sources, search=search, max_tokens=max_tokens, precision=precision))
        scores.seconds_decoding = time.perf_counter() - start
        scores.beam = search.beam
        scores.precision = precision
        hypotheses = [text for text, _ in found]
        outputs = [Output(s, r, h, score) for s, r, (h, score) in zip(sources, references, found)]
        scores.exact_match = sum(h == r for h, r in zip(hypotheses, references)) / max(len(references), 1)
        _text_scores(scores, hypotheses, references, data)
    return scores, outputs


def ensemble_of(loaded: Loaded, others: Sequence[Loaded]) -> Ensemble:
    """The models of ``loaded`` and ``others`` as one :class:`~tfbuilder.inference.ensemble.Ensemble`; a
    ``ValueError`` naming the checkpoint that does not fit (another vocabulary or model kind)."""
    for other in others:
        if other.recipe.model.kind != "encoder_decoder" or loaded.recipe.model.kind != "encoder_decoder":
            raise ValueError(f"{other.describe()}: only translation (encoder_decoder) models can be ensembled")
        if other.vocab.to_json() != loaded.vocab.to_json():
            raise ValueError(f"{other.describe()} has another vocabulary than {loaded.describe()}: models must share one to be ensembled")
    return Ensemble([loaded.model, *(o.model for o in others)]).eval()


def teacher_forced(model: Ensemble, batch: dict[str, torch.Tensor]) -> objectives.Result:
    """An ensemble's loss on a translation batch: the NLL of its averaged distribution."""
    logp = model(batch["src"], batch["tgt_in"])
    return objectives.smoothed_cross_entropy(logp.flatten(0, 1), batch["tgt_out"].flatten(), 0.0, ignore=model.pad_id)


def bleu_tokenize(data) -> str | None:
    """The sacreBLEU tokenizer that fits the data: 13a (words) for text, ``char`` for character-level
    text, and none for synthetic tasks, whose outputs are not language (exact match and token
    accuracy tell there; their BLEU is 0 for any one-symbol output, right or wrong)."""
    if data.type == "synthetic":
        return None
    return "char" if data.tokenizer.type == "char" else "13a"


def _text_scores(scores: Scores, hypotheses: list[str], references: list[str], data) -> None:
    """sacreBLEU and chrF where they mean something (see :func:`bleu_tokenize`)."""
    import sacrebleu

    tokenize = bleu_tokenize(data)
    if tokenize is None:
        return
    bleu = sacrebleu.metrics.BLEU(tokenize=tokenize)
    scores.bleu = bleu.corpus_score(hypotheses, [references]).score
    scores.bleu_signature = str(bleu.get_signature())
    scores.bleu_tokenize = tokenize
    scores.chrf = sacrebleu.metrics.CHRF().corpus_score(hypotheses, [references]).score


def scores_path(loaded: Loaded, split: str, beam: int | None, precision: Precision = "32", *, ensemble: int = 1) -> Path:
    """Where :func:`save_scores` writes: :func:`tfbuilder.runs.checkpoints.scores_file` of the checkpoint's run
    directory (the checkpoint's own folder for a loose file); an ensemble of ``ensemble`` models led
    by this checkpoint is named ``<checkpoint>-ensemble<N>``."""
    run_dir = run_dir_of(loaded.path) or loaded.path.parent
    name = loaded.path.stem + (f"-ensemble{ensemble}" if ensemble > 1 else "")
    return scores_file(run_dir, split, name, beam=beam, precision=precision)


def write_outputs(outputs: Sequence[Output], path: str | Path, *, layout: Literal["plain", "fairseq"] = "plain") -> None:
    """Write translations in the split's order, atomically: ``plain``, one hypothesis per line;
    ``fairseq``, fairseq-generate's layout: per example ``S-i`` (source), ``T-i`` (reference) and
    ``H-i`` (score, hypothesis), tab-separated, i from 0."""
    from tfbuilder.atomic import write_text

    if layout == "plain":
        text = "".join(f"{o.hypothesis}\n" for o in outputs)
    else:
        text = "".join(
            f"S-{i}\t{o.source}\nT-{i}\t{o.reference}\nH-{i}\t{o.score:.4f}\t{o.hypothesis}\n" for i, o in enumerate(outputs)
        )
    write_text(Path(path), text, what="translations")


MAX_SCORE_COPIES = 10_000


def save_scores(loaded: Loaded, scores: Scores) -> Path:
    """Write ``scores`` as JSON beside the checkpoint's run (``tfbuilder test`` and sweeps), atomically
    and never over an earlier file: when :func:`scores_path` is taken, the next free
    ``<name>-<n>.json``. Returns the path written (compare it with :func:`scores_path` to tell)."""
    from tfbuilder.atomic import write_new_text

    path = scores_path(loaded, scores.split, scores.beam, scores.precision or "32", ensemble=len(scores.ensemble or ()) or 1)
    text = json.dumps(asdict(scores), indent=2)
    for n in range(1, MAX_SCORE_COPIES):
        candidate = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
        if write_new_text(candidate, text, what="scores") is not None:
            return candidate
    raise FileExistsError(f"{path} and {MAX_SCORE_COPIES - 1:,} numbered copies exist: not overwriting them")


def generate(loaded: Loaded, prompt: str, **kwargs) -> str:
    """Continue ``prompt`` with a decoder-only checkpoint, from the model's start id (see
    :func:`tfbuilder.inference.decoding.sample`, which takes ``kwargs``)."""
    start = loaded.model.specials.start
    prefix = ([] if start is None else [start]) + loaded.vocab.tgt.encode(prompt)
    check_positions(loaded, len(prefix), kwargs.get("max_new", 100))
    ids = torch.tensor([prefix], device=model_device(loaded.model))
    return loaded.vocab.tgt.decode(decoding.sample(loaded.model, ids, **kwargs)[0])


def check_positions(loaded: Loaded, prefix: int, max_new: int) -> None:
    """Refuse (``ValueError``) a continuation that could run past the model's learned position table:
    :func:`tfbuilder.inference.decoding.sample` feeds the ``prefix`` tokens and each of ``max_new`` new ones."""
    limit = preflight.max_positions(loaded.recipe.model)
    if limit is None or prefix + max_new <= limit:
        return
    if prefix >= limit:
        raise ValueError(f"the prompt takes {prefix} positions; the model's learned position table has {limit}: shorten the prompt")
    raise ValueError(
        f"the prompt ({prefix} positions) and --max-new {max_new} need {prefix + max_new} positions; the model's "
        f"learned position table has {limit}: give --max-new {limit - prefix} or less"
    )
