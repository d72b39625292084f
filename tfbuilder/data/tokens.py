"""Tokenized examples as flat arrays: every token of a split in one array, and where each example starts.

This is the layout of fairseq's and Megatron's indexed datasets and of nanoGPT's token file: no Python
object per example, so a split of millions of examples costs a few bytes per token and per example.
In memory (:class:`TokenArray`) for generated data; on disk (:class:`StoredTokens`) for a prepared
store (:mod:`tfbuilder.data.store`), read an example at a time with positioned reads. The operating
system's page cache keeps what was read, shared by every process on the machine (DataLoader workers,
DDP ranks); unlike a memory map, nothing is mapped into the process, so its resident memory does not
grow as training touches more of the corpus (a map's read-ahead made a training process's resident
memory grow by 430 MB in its first 20 batches of a 4-million-example store, and by the whole store
over an epoch).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
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
    def from_rows(cls, rows: Sequence[Sequence[int]], dtype: np.dtype | type = np.int64) -> TokenArray:
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


class _Offsets:
    """``offsets[i]`` of a stored side, read from its ``.idx`` file on demand (no copy in memory)."""

    def __init__(self, owner: StoredTokens):
        self.owner = owner

    def __len__(self) -> int:
        return self.owner.examples + 1

    def __getitem__(self, i: int) -> int:
        if i < 0:
            i += len(self)
        return int(np.frombuffer(self.owner.read("idx", 8 * i, 8), dtype=np.int64)[0])


class StoredTokens:
    """One side of a stored split: ``<stem>.tok`` (ids), ``<stem>.idx`` (int64 offsets) and
    ``<stem>.len`` (uint32 lengths). The lengths are read into memory once, at 2 bytes per example
    when every length fits (what bucketing sorts); example ``i`` costs two positioned reads."""

    def __init__(self, stem: Path, dtype: np.dtype, examples: int):
        self.stem, self.dtype, self.examples = stem, np.dtype(dtype), examples
        lengths = np.fromfile(f"{stem}.len", dtype=np.uint32, count=examples)
        self.lengths = lengths.astype(np.uint16) if examples and int(lengths.max()) < 2**16 else lengths
        self.offsets = _Offsets(self)
        self._files: dict[str, int] = {}
        self._pid = -1

    def read(self, suffix: str, start: int, size: int) -> bytes:
        if self._pid != os.getpid():  # a forked worker opens its own descriptors
            self._files, self._pid = {}, os.getpid()
        fd = self._files.get(suffix)
        if fd is None:
            fd = self._files[suffix] = os.open(f"{self.stem}.{suffix}", os.O_RDONLY)
        data = os.pread(fd, size, start)
        if len(data) != size:
            raise OSError(f"{self.stem}.{suffix} is shorter than its index says (truncated?)")
        return data

    def __getstate__(self) -> dict:  # DataLoader workers started by spawn: descriptors are not sent
        return {**self.__dict__, "_files": {}, "_pid": -1}

    def __len__(self) -> int:
        return self.examples

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < self.examples:
            raise IndexError(f"example {i} of {self.examples}")
        start, end = np.frombuffer(self.read("idx", 8 * int(i), 16), dtype=np.int64)
        if not 0 <= start <= end:  # changed since the store was opened and checked
            raise OSError(f"{self.stem}.idx is damaged at example {i} (offsets {start}, {end}): prepare the data again")
        size = self.dtype.itemsize
        return np.frombuffer(self.read("tok", int(start) * size, int(end - start) * size), dtype=self.dtype)

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))

    def longest(self) -> int:
        return int(self.lengths.max()) if self.examples else 0

    def tolist(self) -> list[list[int]]:
        return [self[i].tolist() for i in range(len(self))]


@dataclass
class Split:
    """Tokenized examples of one split (targets are None for monolingual text). ``dropped``: examples
    left out (empty, or longer than ``data.max_len``), and ``dropped_tokens`` their tokens. Labelled
    data (:mod:`tfbuilder.data.labels`): ``tgt`` holds the second texts of pairs, ``labels`` a class
    id (int64) or a number (float32) per example."""

    src: Rows
    tgt: Rows | None = None
    dropped: int = 0
    dropped_tokens: int = 0
    labels: np.ndarray | None = None

    def __post_init__(self) -> None:
        # Lists of rows are accepted for convenience (tests, small in-memory data).
        if isinstance(self.src, (list, tuple)):
            self.src = TokenArray.from_rows(self.src)
        if isinstance(self.tgt, (list, tuple)):
            self.tgt = TokenArray.from_rows(self.tgt)

    def __len__(self) -> int:
        return len(self.src)
