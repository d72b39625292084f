"""Packing documents into fixed blocks for language models (GPT-2, nanoGPT, Megatron's GPT dataset).

The documents of a split are read as one stream, each followed by </s>: ``d0 </s> d1 </s> d2 </s> ...``.
Example ``i`` is the window of ``window`` tokens starting at ``i * stride``. A causal LM takes
``window = block_size + 1`` and ``stride = block_size``: it reads ``block_size`` tokens and predicts
the next one at each, so every token of the stream is predicted once and no document is dropped,
however long. Nothing is copied: a window is gathered from the stored documents on demand.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from torch import Tensor

from tfbuilder.data.tokenizers import EOS
from tfbuilder.data.tokens import Split, StoredTokens, TokenArray
from tfbuilder.errors import DataError
from tfbuilder.spec.sections import DataSection


class Packed:
    """Fixed windows over documents joined by </s>; reads like a :class:`TokenArray` (``len``,
    ``[i]``, ``lengths``)."""

    def __init__(self, docs: TokenArray | StoredTokens, *, window: int, stride: int, eos: int = EOS):
        self.docs, self.window, self.stride, self.eos = docs, window, stride, eos
        stream = int(docs.offsets[-1]) + len(docs)  # every document and its </s>
        count = (stream - window) // stride + 1 if stream >= window else 0
        self.lengths = np.broadcast_to(np.uint32(window), (count,))  # every example has window tokens

    def __len__(self) -> int:
        return len(self.lengths)

    def _document_at(self, position: int) -> int:
        """The document whose tokens (or closing </s>) hold stream ``position``: the last ``d`` with
        ``offsets[d] + d <= position`` (binary search: no array the size of the corpus is made)."""
        offsets = self.docs.offsets
        lo, hi = 0, len(self.docs) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if int(offsets[mid]) + mid <= position:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(f"block {i} of {len(self)}")
        start = i * self.stride
        out = np.empty(self.window, dtype=np.int64)
        d = self._document_at(start)
        skip = start - (int(self.docs.offsets[d]) + d)
        filled = 0
        while filled < self.window:
            piece = self.docs[d][skip:]
            take = min(len(piece), self.window - filled)
            out[filled : filled + take] = piece[:take]
            filled += take
            if filled < self.window:
                out[filled] = self.eos
                filled += 1
            d, skip = d + 1, 0
        return out

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[i] for i in range(len(self)))


def segments(tokens: Tensor, eos: int | None = EOS) -> Tensor:
    """Document numbers of a packed batch ``tokens`` (b, n), made on its device: a </s> opens the next
    document (it is where that document's first token is predicted from), so a token attends to
    the </s> before it and its own document's tokens only. A model without an end id (``eos`` None)
    cannot tell its documents apart."""
    if eos is None:
        raise ValueError("data.document_mask: the model has no end-of-text id to tell packed documents apart")
    return (tokens == eos).cumsum(dim=1)


def packed_splits(
    splits: dict[str, Split], data: DataSection, *, causal: bool, eos: int | None = EOS
) -> dict[str, Split]:
    """The splits as training and scoring read them: with ``data.packing``, windows of ``block_size``
    tokens over the documents (one more for a causal LM, which predicts each next token); else as
    prepared."""
    if not data.packing or data.block_size is None:
        return splits
    if eos is None:
        raise DataError("packing joins the documents with </s>, and the tokenizer has none (data.tokenizer.specials)")
    out = {}
    for name, split in splits.items():
        if not isinstance(split.src, (TokenArray, StoredTokens)):
            raise TypeError(f"the {name} split is already packed")
        out[name] = Split(Packed(split.src, window=data.block_size + int(causal), stride=data.block_size, eos=eos))
    return out
