"""What a checkpoint with a sequence head (:mod:`tfbuilder.model.heads`) says about texts: ``predict``
writes a label and its probabilities (or a number) per input, ``score`` tests it on a split of its
data. No Lightning here.

Inputs are read as the data layer reads them (:mod:`tfbuilder.data.readers`): a file of a registered
format whose split is one file (``.jsonl``, ``.csv`` and ``.tsv``, optionally ``.gz``) through the run's
``data.columns`` (text, and text_pair for pairs; a label column is not needed and is ignored), any
other file one text per line.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tfbuilder.data import readers, text
from tfbuilder.data.batching import pack
from tfbuilder.data.collate import Collate, labelled, lengths
from tfbuilder.data.prepare import prepare
from tfbuilder.data.readers import chunks
from tfbuilder.data.settle import settle
from tfbuilder.devices import model_device
from tfbuilder.errors import DataError, TfbuilderError
from tfbuilder.model.heads import SequenceHead
from tfbuilder.model.model import DecoderOnly, EncoderOnly
from tfbuilder.model.sizing import max_positions
from tfbuilder.runs.checkpoints import Loaded
from tfbuilder.spec.head import HeadSection
from tfbuilder.specials import LANGUAGE_MODEL_ADDED
from tfbuilder.train.heads import metrics
from tfbuilder.train.objectives import objective

BATCH = 64  # texts per forward pass
DIGITS = 6  # probabilities are written rounded to this many decimals


def _head(loaded: Loaded) -> HeadSection:
    head = loaded.recipe.model.head
    if head is None:
        raise TfbuilderError(
            f"{loaded.describe()} has no sequence head (model.head): it predicts tokens, not labels; "
            "see tfbuilder generate or translate"
        )
    return head


def input_format(path: Path) -> str:
    """The format that reads ``path`` by its extension (``.gz`` aside), such as ``jsonl``, ``csv`` or
    ``tsv``; ``text`` otherwise."""
    found = readers.file_reader(path)
    return found.traits.name if found is not None else "text"


def read_inputs(loaded: Loaded, path: str | Path) -> Iterator[tuple[str, str | None]]:
    """(text, pair or None) of each input of ``path`` (``-``: standard input, one text per line),
    through the run's ``data.columns``."""
    if str(path) == "-":
        yield from ((line.rstrip("\n"), None) for line in sys.stdin)
        return
    path = Path(path)
    found = readers.file_reader(path)
    columns = loaded.recipe.data.columns if loaded.recipe.data is not None else None
    if found is None or found.rows is None:
        if columns is not None and columns.text_pair is not None:
            raise TfbuilderError(
                f"--input {path}: the model reads pairs ({columns.text} and {columns.text_pair}): "
                f"give a {readers.file_suffixes(columns=True)} file"
            )
        yield from ((line, None) for line in text.lines(path))
        return
    if not found.traits.columns:  # rows are the texts themselves
        pairs = columns is not None and columns.text_pair is not None
        fields: tuple[str, ...] = ("text", "text_pair") if pairs else ("text",)
    elif columns is None or columns.text is None:
        raise TfbuilderError(
            f"--input {path}: the checkpoint's recipe names no data.columns.text "
            f"to read from {found.traits.name} records"
        )
    else:
        fields = (columns.text,) + ((columns.text_pair,) if columns.text_pair else ())
    for values in found.rows(path, fields):
        yield values[0], values[1] if len(values) > 1 else None


def _encoded(loaded: Loaded, inputs: list[tuple[str, str | None]]) -> dict[str, torch.Tensor]:
    """A batch of ``inputs``; texts too long for the model's positions keep their beginning."""
    tok = loaded.vocab.src
    texts = tok.encode_batch([t for t, _ in inputs])
    pairs = tok.encode_batch([p or "" for _, p in inputs]) if inputs[0][1] is not None else None
    limit = max_positions(loaded.recipe.model)
    if limit is not None:
        room = limit - LANGUAGE_MODEL_ADDED - (1 if pairs is not None else 0)
        for i, ids in enumerate(texts):
            if pairs is not None:
                # The longer of the two gives way first (BERT's truncation of pairs, "longest first").
                while len(texts[i]) + len(pairs[i]) > room:
                    longer = texts if len(texts[i]) >= len(pairs[i]) else pairs
                    longer[i] = longer[i][:-1]
            else:
                texts[i] = ids[: max(room, 0)]
    return labelled(texts, pairs, ids=loaded.vocab.specials)


@torch.no_grad()
def predict(loaded: Loaded, inputs: Iterable[tuple[str, str | None]], *, batch: int = BATCH) -> Iterator[dict]:
    """One record per input, in order: ``{"label": name, "probabilities": {name: p, ...}}``
    (classify) or ``{"value": x}`` (regress)."""
    head = _head(loaded)
    model = loaded.model.eval()
    if not isinstance(model, (EncoderOnly, DecoderOnly)) or not isinstance(model.head, SequenceHead):
        raise TfbuilderError(f"{loaded.describe()}: its model has no sequence head, though its recipe names one")
    device = model_device(model)
    names = head.labels or [str(i) for i in range(head.outputs)]
    for chunk in chunks(inputs, batch):
        encoded = {k: v.to(device) for k, v in _encoded(loaded, chunk).items()}
        hidden = model.features(encoded["tokens"], token_types=encoded["token_types"])
        outputs = model.head(hidden, tokens=encoded["tokens"]).float().cpu()
        if head.type == "regress":
            yield from ({"value": float(v)} for v in outputs[:, 0])
            continue
        probabilities = outputs.softmax(dim=-1)
        for row in probabilities:
            best = int(row.argmax())
            yield {
                "label": names[best],
                "probabilities": {n: round(float(p), DIGITS) for n, p in zip(names, row, strict=True)},
            }


def lines(records: Iterable[dict]) -> Iterator[str]:
    """JSON Lines of ``records``."""
    return (json.dumps(r, ensure_ascii=False) + "\n" for r in records)


@dataclass
class HeadScores:
    """A sequence head's scores on a split: loss (cross-entropy or squared error, per text) and
    accuracy and macro-F1, or MSE and Pearson's r."""

    split: str
    examples: int
    loss: float
    scores: dict[str, float]


@torch.no_grad()
def score(loaded: Loaded, split: str = "test", *, max_tokens: int = 8000) -> HeadScores:
    """Test a sequence head on ``split`` of its recipe's data (labels mapped as in training: a label
    the model does not know is an error naming the file and the record)."""

    head = _head(loaded)
    recipe = loaded.recipe
    if recipe.data is None:
        raise TfbuilderError("the checkpoint's recipe has no data section")
    prepared = prepare(recipe.data, vocab=loaded.vocab, model_vocab=recipe.model.vocab_size)
    if split not in prepared.splits:
        raise DataError(f"no '{split}' split in {recipe.data.path} (have: {', '.join(prepared.splits)})")
    settle(recipe, prepared)
    examples = prepared.splits[split]
    model = loaded.model.eval()
    device = model_device(model)
    loss_of = objective(recipe, epsilon=0.0)
    collate = Collate(examples, prepared.vocab.specials)
    sizes, _, _ = lengths(examples)
    nll = 0.0
    sums = torch.zeros(metrics.size(head.type, head.outputs), dtype=torch.float64)
    padded = recipe.model.pad_id is not None  # without a pad id, one text a batch
    budget = max(max_tokens, int(sizes.max())) if padded else None
    for ids in pack(
        sizes, sizes, np.argsort(sizes, kind="stable"), max_tokens=budget, batch_size=None if padded else 1
    ):
        batch = {k: v.to(device) for k, v in collate(ids).items()}
        result = loss_of(model, batch)
        if result.outputs is None:
            raise TfbuilderError(f"{loaded.describe()}: the head's objective returned no outputs to score")
        nll += float(result.nll)
        sums += metrics.batch_sums(head.type, result.outputs, batch["labels"], head.outputs).cpu()
    found = metrics.scores(head.type, sums, head.outputs)
    return HeadScores(
        split, len(examples), nll / max(len(examples), 1), {k: v for k, v in found.items() if not math.isnan(v)}
    )
