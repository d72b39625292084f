"""Examples -> padded batches (no Lightning here: evaluation and decoding use it too)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tfbuilder.data.labels import positions
from tfbuilder.data.packing import Packed
from tfbuilder.data.tokens import Split
from tfbuilder.errors import DataError
from tfbuilder.specials import LANGUAGE_MODEL_ADDED, OWN, TRANSLATION_ADDED, SpecialIds

Batch = dict[str, torch.Tensor]


def pad(
    rows: Sequence[Sequence[int] | np.ndarray], *, bos: bool = False, eos: bool = False, ids: SpecialIds = OWN
) -> torch.Tensor:
    """Right-padded int64 (b, n) from ragged rows, adding <s> and/or </s> (the ids of ``ids``)."""
    extra = int(bos) + int(eos)
    out = np.full((len(rows), max(map(len, rows)) + extra), _needed(ids.pad, "padding"), dtype=np.int64)
    start = int(bos)
    if bos:
        out[:, 0] = _needed(ids.start, "<s>")
    end = _needed(ids.end, "</s>") if eos else 0
    for r, row in enumerate(rows):
        out[r, start : start + len(row)] = row
        if eos:
            out[r, start + len(row)] = end
    return torch.from_numpy(out)


def _needed(token: int | None, role: str) -> int:
    """The id of a token batches are made with (settling the data against the model makes sure it exists)."""
    if token is None:
        raise DataError(f"the tokenizer has no {role} token, which batches of this model need")
    return token


class Collate:
    """Examples -> a batch. Seq2seq: ``src`` x</s>, ``tgt_in`` <s>y, ``tgt_out`` y</s>;
    language models: ``tokens`` <s>x</s> (the objective shifts or masks them), or a packed block as it
    is (documents already end in </s>). ``ids``: the tokenizer's <s>, </s> and padding ids."""

    def __init__(self, split: Split, ids: SpecialIds = OWN):
        self.split = split
        self.ids = ids

    def __call__(self, indices: Sequence[int] | np.ndarray) -> Batch:
        index = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        src = [self.split.src[i] for i in indices]
        if self.split.labels is not None:
            pairs = None if self.split.tgt is None else [self.split.tgt[i] for i in indices]
            labels = torch.from_numpy(self.split.labels[np.asarray(indices, dtype=np.int64)])
            return {**labelled(src, pairs, ids=self.ids), "labels": labels, "index": index}
        if isinstance(self.split.src, Packed):
            return {"tokens": torch.from_numpy(np.stack(src).astype(np.int64)), "index": index}
        if self.split.tgt is None:
            return {"tokens": pad(src, bos=True, eos=True, ids=self.ids), "index": index}
        tgt = [self.split.tgt[i] for i in indices]
        ids = self.ids
        return {
            "src": pad(src, eos=True, ids=ids),
            "tgt_in": pad(tgt, bos=True, ids=ids),
            "tgt_out": pad(tgt, eos=True, ids=ids),
            "index": index,
        }


def labelled(
    texts: Sequence[Sequence[int] | np.ndarray],
    pairs: Sequence[Sequence[int] | np.ndarray] | None = None,
    *,
    ids: SpecialIds = OWN,
) -> Batch:
    """Texts of a sequence head: ``tokens`` <s> text </s> (and pair </s>), right-padded, with
    ``token_types`` 0 over <s> text </s> and 1 over pair </s> (BERT, Devlin et al. 2019, sec. 3);
    ``ids``: the tokenizer's <s>, </s> and padding ids."""
    if pairs is None:
        tokens = pad(texts, bos=True, eos=True, ids=ids)
        return {"tokens": tokens, "token_types": torch.zeros_like(tokens)}
    joined = [
        np.concatenate([np.asarray(a, dtype=np.int64), [ids.end], np.asarray(b, dtype=np.int64)])
        for a, b in zip(texts, pairs, strict=True)
    ]
    tokens = pad(joined, bos=True, eos=True, ids=ids)
    types = np.zeros(tokens.shape, dtype=np.int64)
    for r, a in enumerate(texts):
        types[r, len(a) + 2 : len(joined[r]) + 2] = 1  # after <s> text </s>, through the final </s>
    return {"tokens": tokens, "token_types": torch.from_numpy(types)}


def lengths(split: Split) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """The token counts of ``split``'s sources and targets (the store's arrays, not copies), and what
    :class:`Collate` adds to each: x</s> and <s>y (or y</s>) for translation, <s>x</s> for language
    models, nothing to a packed block."""
    if isinstance(split.src, Packed):
        return split.src.lengths, split.src.lengths, (0, 0)
    if split.labels is not None:  # <s> text </s> [pair </s>], one sequence
        total = positions(split)
        return total, total, (0, 0)
    if split.tgt is None:
        return split.src.lengths, split.src.lengths, (LANGUAGE_MODEL_ADDED, LANGUAGE_MODEL_ADDED)
    return split.src.lengths, split.tgt.lengths, (TRANSLATION_ADDED, TRANSLATION_ADDED)
