"""Examples -> padded batches (no Lightning here: evaluation and decoding use it too)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .prepare import Split
from .tokenizers import BOS, EOS, PAD

Batch = dict[str, torch.Tensor]


def pad(rows: Sequence[Sequence[int]], *, bos: bool = False, eos: bool = False) -> torch.Tensor:
    """Right-padded int64 (b, n) from ragged rows, adding <s> and/or </s>."""
    extra = int(bos) + int(eos)
    out = np.full((len(rows), max(map(len, rows)) + extra), PAD, dtype=np.int64)
    for r, row in enumerate(rows):
        start = 0
        if bos:
            out[r, 0] = BOS
            start = 1
        out[r, start : start + len(row)] = row
        if eos:
            out[r, start + len(row)] = EOS
    return torch.from_numpy(out)


class Collate:
    """Examples -> a batch. Seq2seq: ``src`` x</s>, ``tgt_in`` <s>y, ``tgt_out`` y</s>;
    language models: ``tokens`` <s>x</s> (the objective shifts or masks them)."""

    def __init__(self, split: Split):
        self.split = split

    def __call__(self, indices: list[int]) -> Batch:
        src = [self.split.src[i] for i in indices]
        if self.split.tgt is None:
            return {"tokens": pad(src, bos=True, eos=True), "index": torch.tensor(indices)}
        tgt = [self.split.tgt[i] for i in indices]
        return {
            "src": pad(src, eos=True),
            "tgt_in": pad(tgt, bos=True),
            "tgt_out": pad(tgt, eos=True),
            "index": torch.tensor(indices),
        }


def lengths(split: Split) -> tuple[list[int], list[int]]:
    src = [len(s) + 2 for s in split.src]  # room for the specials
    tgt = [len(t) + 1 for t in split.tgt] if split.tgt is not None else src
    return src, tgt
