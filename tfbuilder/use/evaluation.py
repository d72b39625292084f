"""Scoring a checkpoint: loss, perplexity, sacreBLEU and chrF on a split, its outputs and scores files.
Translating is :mod:`tfbuilder.inference.translate`. No Lightning here."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, TypeVar

import numpy as np
import torch
from torch import nn

from tfbuilder.atomic import write_new_text, write_text
from tfbuilder.data.batching import pack
from tfbuilder.data.collate import Collate, lengths
from tfbuilder.data.packing import packed_splits
from tfbuilder.data.prepare import Prepared, prepare
from tfbuilder.data.tokens import Split
from tfbuilder.devices import model_device
from tfbuilder.inference.interfaces import translator
from tfbuilder.inference.translate import Precision, Search, ensemble_of, source_limit, translate_scored
from tfbuilder.runs.checkpoints import Loaded, run_dir_of, scores_file
from tfbuilder.spec.sections import DataSection
from tfbuilder.specials import EOS
from tfbuilder.train import objectives


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
    precision: Precision | None = None
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
    sharing the vocabulary), the models translate and are scored together
    (:class:`~tfbuilder.inference.ensemble.Ensemble`)."""
    search = search or Search(beam=beam, alpha=alpha)
    recipe = loaded.recipe
    if recipe.model.head is not None:
        raise ValueError("a model with a sequence head (model.head) is scored by tfbuilder.use.predict.score")
    data, prepared, examples = _split(loaded, split)
    collate = Collate(examples, prepared.vocab.specials)
    # A model without a pad id cannot tell padding from a token: score it one sentence at a time.
    budget = None if recipe.model.pad_id is None else max_tokens
    model: nn.Module
    if ensemble:
        model = ensemble_of(loaded, ensemble)
        sums = _teacher_forced_sums(model, teacher_forced, examples, collate, max_tokens=budget)
    else:
        model = single = loaded.model.eval()
        sums = _teacher_forced_sums(
            single, objectives.objective(recipe, epsilon=0.0), examples, collate, max_tokens=budget
        )
    nll, tokens, correct = sums
    loss = nll / max(tokens, 1)
    scores = Scores(split, len(examples), loss, math.exp(min(loss, 50)), accuracy=correct / max(tokens, 1))
    if ensemble:
        scores.ensemble = [str(x.path) for x in (loaded, *ensemble)]
    if recipe.model.kind != "encoder_decoder":
        return scores, []
    sources, references = prepared.raw[split]
    if references is None:
        raise ValueError(f"the '{split}' split has no references to score translations against")
    start = time.perf_counter()
    limit = source_limit(loaded)
    found = list(
        translate_scored(
            model, loaded.vocab, sources, search=search, max_tokens=max_tokens, precision=precision, max_source=limit
        )
    )
    scores.seconds_decoding = time.perf_counter() - start
    scores.beam = search.beam
    scores.precision = precision
    hypotheses = [text for text, _ in found]
    outputs = [Output(s, r, h, score) for s, r, (h, score) in zip(sources, references, found, strict=True)]
    scores.exact_match = sum(h == r for h, r in zip(hypotheses, references, strict=True)) / max(len(references), 1)
    _text_scores(scores, hypotheses, references, data)
    return scores, outputs


def _split(loaded: Loaded, split: str) -> tuple[DataSection, Prepared, Split]:
    """The checkpoint's data section, its prepared data, and ``split`` as it is scored (packed or not)."""
    recipe = loaded.recipe
    data = recipe.data
    if data is None:
        raise ValueError("the checkpoint's recipe has no data section")
    prepared = prepare(data, vocab=loaded.vocab, model_vocab=recipe.model.vocab_size)
    if split not in prepared.splits:
        raise ValueError(f"no '{split}' split in {data.path or 'the data'} (have: {', '.join(prepared.splits)})")
    end = prepared.vocab.specials.end  # the data's batches are made with the vocabulary's ids
    if end is None and data.packing:
        raise ValueError("packed data needs an end id between documents; the vocabulary has none")
    eos = end if end is not None else EOS  # unused unless the data is packed
    return data, prepared, packed_splits(prepared.splits, data, causal=recipe.model.kind == "decoder", eos=eos)[split]


M = TypeVar("M", bound=nn.Module)


def _teacher_forced_sums(
    model: M,
    objective: Callable[[M, dict[str, torch.Tensor]], objectives.Result],
    examples: Split,
    collate: Collate,
    *,
    max_tokens: int | None,
) -> tuple[float, int, float]:
    """(NLL, target tokens, tokens predicted right) of ``model`` over ``examples``, batched by length into
    at most ``max_tokens`` tokens a batch (None: one example a batch)."""
    device = model_device(model)
    src_sizes, tgt_sizes, extra = lengths(examples)
    nll = correct = 0.0
    tokens = 0
    torch.manual_seed(0)  # the masked-LM objective draws its masks
    by_length = np.lexsort((tgt_sizes, src_sizes))
    for batch_ids in pack(
        src_sizes,
        tgt_sizes,
        by_length,
        extra=extra,
        max_tokens=max_tokens,
        batch_size=1 if max_tokens is None else None,
    ):
        batch = {k: v.to(device, non_blocking=True) for k, v in collate(batch_ids).items()}
        result = objective(model, batch)
        nll += float(result.nll)
        tokens += int(result.tokens)
        correct += float(result.correct)
    return nll, tokens, correct


def teacher_forced(model: nn.Module, batch: dict[str, torch.Tensor]) -> objectives.Result:
    """An ensemble's loss on a translation batch: the NLL of its averaged distribution."""
    logp = model(batch["src"], batch["tgt_in"])
    pad_id = translator(model).pad_id
    return objectives.smoothed_cross_entropy(
        logp.flatten(0, 1), batch["tgt_out"].flatten(), 0.0, ignore=-100 if pad_id is None else pad_id
    )


def bleu_tokenize(data: DataSection) -> str | None:
    """The sacreBLEU tokenizer that fits the data: 13a (words) for text, ``char`` for character-level
    text, and none for synthetic tasks, whose outputs are not language (exact match and token
    accuracy tell there; their BLEU is 0 for any one-symbol output, right or wrong)."""
    if data.type == "synthetic":
        return None
    return "char" if data.tokenizer.type == "char" else "13a"


def _text_scores(scores: Scores, hypotheses: list[str], references: list[str], data: DataSection) -> None:
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


def scores_path(
    loaded: Loaded, split: str, beam: int | None, precision: Precision = "32", *, ensemble: int = 1
) -> Path:
    """Where :func:`save_scores` writes: :func:`tfbuilder.runs.checkpoints.scores_file` of the checkpoint's run
    directory (the checkpoint's own folder for a loose file); an ensemble of ``ensemble`` models led
    by this checkpoint is named ``<checkpoint>-ensemble<N>``."""
    run_dir = run_dir_of(loaded.path) or loaded.path.parent
    name = loaded.path.stem + (f"-ensemble{ensemble}" if ensemble > 1 else "")
    return scores_file(run_dir, split, name, beam=beam, precision=precision)


def write_outputs(
    outputs: Sequence[Output], path: str | Path, *, layout: Literal["plain", "fairseq"] = "plain"
) -> None:
    """Write translations in the split's order, atomically: ``plain``, one hypothesis per line;
    ``fairseq``, fairseq-generate's layout: per example ``S-i`` (source), ``T-i`` (reference) and
    ``H-i`` (score, hypothesis), tab-separated, i from 0."""

    if layout == "plain":
        text = "".join(f"{o.hypothesis}\n" for o in outputs)
    else:
        text = "".join(
            f"S-{i}\t{o.source}\nT-{i}\t{o.reference}\nH-{i}\t{o.score:.4f}\t{o.hypothesis}\n"
            for i, o in enumerate(outputs)
        )
    write_text(Path(path), text, what="translations")


MAX_SCORE_COPIES = 10_000


def save_scores(loaded: Loaded, scores: Scores) -> Path:
    """Write ``scores`` as JSON beside the checkpoint's run (``tfbuilder test`` and sweeps), atomically
    and never over an earlier file: when :func:`scores_path` is taken, the next free
    ``<name>-<n>.json``. Returns the path written (compare it with :func:`scores_path` to tell)."""

    path = scores_path(
        loaded, scores.split, scores.beam, scores.precision or "32", ensemble=len(scores.ensemble or ()) or 1
    )
    text = json.dumps(asdict(scores), indent=2)
    for n in range(1, MAX_SCORE_COPIES):
        candidate = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
        if write_new_text(candidate, text, what="scores") is not None:
            return candidate
    raise FileExistsError(f"{path} and {MAX_SCORE_COPIES - 1:,} numbered copies exist: not overwriting them")
