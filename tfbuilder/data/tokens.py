"""Tokenized examples as flat arrays: every token of a split in one array, and where each example starts.

This is the layout of fairseq's and Megatron's indexed datasets and of nanoGPT's token file: no Python
object per example, so a split of millions of examples costs a few bytes per token and per example.
The arrays are numpy memory maps when they come from a prepared store (:mod:`tfbuilder.data.store`):
pages are read on demand and shared by every process on the machine (DataLoader workers, DDP ranks),
so the resident memory of training does not grow with the corpus.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned type that holds every id (uint16 up to 65,536 tokens)."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


class TokenArray:
    """Ragged rows of token ids: ``flat`` holds them back to back, row ``i`` is
    ``flat[offsets[i]:offsets[i + 1]]``; ``lengths`` is ``np.diff(offsets)``, kept as its own
    (small-typed) array so that bucketing reads 4 bytes per example and nothing else."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray, lengths: np.ndarray | None = None):
        self.flat = flat
        self.offsets = offsets
        self.lengths = lengths if lengths is not None else np.diff(offsets).astype(np.uint32)

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[int]], dtype: np.dtype | type = np.int64) -> "TokenArray":
        """An in-memory array of ``rows`` (lists of ids)."""
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter((t for r in rows for t in r), dtype=dtype, count=int(offsets[-1]))
        return cls(flat, offsets, lengths.astype(np.uint32))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.flat[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))

    def longest(self) -> int:
        return int(self.lengths.max()) if len(self) else 0

    def tolist(self) -> list[list[int]]:
        return [self[i].tolist() for i in range(len(self))]


class Rows(Protocol):
    """What batching and collation read of a split's side: a :class:`TokenArray`, or packed blocks
    (:class:`~tfbuilder.data.packing.Packed`)."""

    lengths: np.ndarray

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> np.ndarray: ...


@dataclass
class Split:
    """Tokenized examples of one split (targets are None for monolingual text). ``dropped``: examples
    left out (empty, or longer than ``data.max_len``), and ``dropped_tokens`` their tokens."""

    src: Rows
    tgt: Rows | None = None
    dropped: int = 0
    dropped_tokens: int = 0

    def __post_init__(self) -> None:
        # Lists of rows are accepted for convenience (tests, small in-memory data).
        if isinstance(self.src, (list, tuple)):
            self.src = TokenArray.from_rows(self.src)
        if isinstance(self.tgt, (list, tuple)):
            self.tgt = TokenArray.from_rows(self.tgt)

    def __len__(self) -> int:
        return len(self.src)
