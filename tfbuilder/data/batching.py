"""Length-bucketed batching by a token budget (Vaswani et al. 2017, sec. 5.1: "sentence pairs were batched
together by approximate sequence length"), deterministic from (seed, epoch), resumable, split across ranks."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np


def pack(
    src_lens: Sequence[int], tgt_lens: Sequence[int], order: Sequence[int], *, max_tokens: int | None, batch_size: int | None
) -> list[list[int]]:
    """Cut ``order`` into consecutive batches. With ``max_tokens``, a batch's padded source and target sizes
    (examples x longest) each stay within the budget; an example longer than the budget is a batch alone."""
    batches: list[list[int]] = []
    current: list[int] = []
    longest_src = longest_tgt = 0
    for index in order:
        s, t = src_lens[index], tgt_lens[index]
        if current:
            n = len(current) + 1
            full = (
                len(current) >= batch_size
                if max_tokens is None
                else n * max(longest_src, s) > max_tokens or n * max(longest_tgt, t) > max_tokens
            )
            if full:
                batches.append(current)
                current, longest_src, longest_tgt = [], 0, 0
        current.append(int(index))
        longest_src, longest_tgt = max(longest_src, s), max(longest_tgt, t)
    if current:
        batches.append(current)
    return batches


class BucketBatchSampler:
    """Yields lists of example indices. Each epoch: shuffle, sort by length (ties in random order), pack,
    shuffle the batches; rank ``r`` of ``world`` takes every world-th batch.

    Training samplers are ``infinite``: epochs follow each other, and the number of batches consumed
    so far (``start()``, over all epochs) is all that resuming needs.
    """

    def __init__(
        self,
        src_lens: Sequence[int],
        tgt_lens: Sequence[int],
        *,
        max_tokens: int | None = None,
        batch_size: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        infinite: bool = False,
        rank: int = 0,
        world: int = 1,
    ):
        if (max_tokens is None) == (batch_size is None):
            raise ValueError("give exactly one of max_tokens and batch_size")
        self.src_lens = np.asarray(src_lens)
        self.tgt_lens = np.asarray(tgt_lens)
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self.seed, self.shuffle, self.infinite = seed, shuffle, infinite
        self.rank, self.world = rank, world
        self.start: Callable[[], int] = lambda: 0  # batches consumed before this run (resume)
        self._cache: tuple[int, list[list[int]]] | None = None

    def epoch(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch``."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        rng = np.random.default_rng([self.seed, epoch])
        n = len(self.src_lens)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        # Stable sort: equal lengths keep the random order, so batches differ between epochs.
        order = order[np.lexsort((self.tgt_lens[order], self.src_lens[order]))]
        batches = pack(self.src_lens, self.tgt_lens, order, max_tokens=self.max_tokens, batch_size=self.batch_size)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        if self.world > 1:
            if self.infinite:  # every rank must take the same number of steps
                batches = batches[: len(batches) // self.world * self.world]
            batches = batches[self.rank :: self.world]
        self._cache = (epoch, batches)
        return batches

    @property
    def batches_per_epoch(self) -> int:
        return len(self.epoch(0))

    def __iter__(self) -> Iterator[list[int]]:
        if not self.infinite:
            yield from self.epoch(0)
            return
        per_epoch = self.batches_per_epoch
        if per_epoch == 0:
            raise ValueError("no training batches: the data is smaller than the number of processes")
        position = self.start()  # read lazily, at the first batch: after a checkpoint has been restored
        while True:
            epoch, offset = divmod(position, per_epoch)
            yield self.epoch(epoch)[offset]
            position += 1

    def __len__(self) -> int:
        if self.infinite:
            raise TypeError("an infinite sampler has no length")
        return len(self.epoch(0))
