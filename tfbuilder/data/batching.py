"""Length-bucketed batching by a token budget (Vaswani et al. 2017, sec. 5.1: "sentence pairs were batched
together by approximate sequence length"), deterministic from (seed, epoch), resumable, split across ranks."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np


def cut(
    src_lens: np.ndarray,
    tgt_lens: np.ndarray,
    order: np.ndarray,
    *,
    max_tokens: int | None,
    batch_size: int | None,
    extra: tuple[int, int] = (0, 0),
) -> np.ndarray:
    """Where consecutive batches of ``order`` begin and end (``bounds``, batch k is
    ``order[bounds[k]:bounds[k + 1]]``). With ``max_tokens``, a batch's padded source and target sizes
    (examples x longest) each stay within the budget, filled greedily in order (and, with
    ``batch_size`` too, at most that many examples); an example longer than the budget is a batch
    alone; ``extra`` is added to every source and target length (the special tokens). Vectorised:
    numpy work per batch, not a Python step per example."""
    n = len(order)
    if max_tokens is None:
        return np.append(np.arange(0, n, batch_size, dtype=np.int64), n)
    most = n if batch_size is None else batch_size  # with both: at most batch_size examples too
    bounds = [0]
    start = 0
    window = 64
    while start < n:
        while True:  # widen the window until the budget is exceeded inside it, or the order ends
            stop = min(n, start + window)
            picked = order[start:stop]
            count = np.arange(1, stop - start + 1, dtype=np.int64)
            longest_src = np.maximum.accumulate(src_lens[picked].astype(np.int64)) + extra[0]
            longest_tgt = np.maximum.accumulate(tgt_lens[picked].astype(np.int64)) + extra[1]
            over = (count * longest_src > max_tokens) | (count * longest_tgt > max_tokens) | (count > most)
            over[0] = False  # the first example always goes in
            if over.any() or stop == n:
                break
            window *= 2
        size = int(np.argmax(over)) if over.any() else stop - start
        start += size
        bounds.append(start)
        window = max(64, 2 * size)
    return np.asarray(bounds, dtype=np.int64)


def pack(
    src_lens: Sequence[int] | np.ndarray,
    tgt_lens: Sequence[int] | np.ndarray,
    order: Sequence[int] | np.ndarray,
    *,
    max_tokens: int | None,
    batch_size: int | None,
    extra: tuple[int, int] = (0, 0),
) -> list[list[int]]:
    """:func:`cut` as lists of example indices."""
    order = np.asarray(order, dtype=np.int64)
    src, tgt = np.asarray(src_lens), np.asarray(tgt_lens)
    bounds = cut(src, tgt, order, max_tokens=max_tokens, batch_size=batch_size, extra=extra)
    return [order[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def by_length(order: np.ndarray, src_lens: np.ndarray, tgt_lens: np.ndarray) -> np.ndarray:
    """``order`` sorted by source then target length, stably: equal lengths keep their order (the random
    one, so batches differ between epochs). Two stable passes (target, then source) equal one sort on
    the pair; on 16-bit keys numpy sorts them by radix, in linear time."""
    for lens in (tgt_lens, src_lens):
        keys = lens[order]
        if len(keys) and int(keys.max()) < 2**16:
            keys = keys.astype(np.uint16)
        order = order[np.argsort(keys, kind="stable")]
    return order


class Epoch:
    """One rank's batches of one epoch, as arrays (a few bytes per example, no Python list per batch):
    batch k is ``order[bounds[p]:bounds[p + 1]]`` with ``p = picks[k]``."""

    def __init__(self, order: np.ndarray, bounds: np.ndarray, picks: np.ndarray):
        self.order, self.bounds, self.picks = order, bounds, picks

    def __len__(self) -> int:
        return len(self.picks)

    def __getitem__(self, k: int) -> np.ndarray:
        p = self.picks[k]
        return self.order[self.bounds[p] : self.bounds[p + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[k] for k in range(len(self)))

    def tolist(self) -> list[list[int]]:
        return [batch.tolist() for batch in self]


Position = tuple[int, int]  # (epoch, batches of that epoch's global order consumed by all ranks together)


def share(count: int, done: int, *, rank: int, world: int, even: bool = True) -> slice:
    """The batches of an epoch's global order (``count`` batches, the first ``done`` already trained)
    that ``rank`` of ``world`` takes: every world-th from ``done + rank``. ``even``: only as many as
    every rank can take (``(count - done) // world`` each), so that all ranks step together; the few
    left at the epoch's end (fewer than ``world``) are not trained in that epoch."""
    end = done + (count - done) // world * world if even else count
    return slice(done + rank, end, world)


def advance(position: Position, steps: int, *, count: int, world: int) -> Position:
    """The global position after each of ``world`` ranks trained ``steps`` more batches from
    ``position``, epochs of ``count`` batches being shared as :func:`share` does. A resume on another
    number of ranks continues from here: the first batch of the global order no rank trained yet."""
    per_epoch = count // world
    if per_epoch == 0:
        raise ValueError("no training batches: the data is smaller than the number of processes")
    epoch, done = position
    left = (count - done) // world  # steps the ranks can still take together in this epoch
    if steps < left:
        return epoch, done + steps * world
    steps -= left
    return epoch + 1 + steps // per_epoch, steps % per_epoch * world


class BucketBatchSampler:
    """Yields lists of example indices. Each epoch: shuffle, sort by length (ties in random order), pack,
    shuffle the batches (the epoch's global order); rank ``r`` of ``world`` takes every world-th batch.

    Training samplers are ``infinite``: epochs follow each other, and the global position (``start()``:
    the epoch, and how many batches of its global order all ranks together trained) is all that resuming
    needs, on any number of ranks (:func:`advance`).
    """

    def __init__(
        self,
        src_lens: Sequence[int] | np.ndarray,
        tgt_lens: Sequence[int] | np.ndarray,
        *,
        max_tokens: int | None = None,
        batch_size: int | None = None,
        extra: tuple[int, int] = (0, 0),
        seed: int = 0,
        shuffle: bool = True,
        infinite: bool = False,
        rank: int = 0,
        world: int = 1,
    ):
        if max_tokens is None and batch_size is None:
            raise ValueError("give max_tokens, batch_size or both")
        self.src_lens = np.asarray(src_lens)
        self.tgt_lens = np.asarray(tgt_lens)
        self.max_tokens, self.batch_size, self.extra = max_tokens, batch_size, extra
        self.seed, self.shuffle, self.infinite = seed, shuffle, infinite
        self.rank, self.world = rank, world
        self.start: Callable[[], Position] = lambda: (0, 0)  # the global position before this run (resume)
        self._cache: tuple[int, Epoch] | None = None

    def whole(self, epoch: int) -> Epoch:
        """Every batch of ``epoch``, in the epoch's global order (all ranks')."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        self._cache = None  # the previous epoch's arrays go before this one's are made
        rng = np.random.default_rng([self.seed, epoch])
        n = len(self.src_lens)
        order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
        if self.shuffle:
            rng.shuffle(order)  # rng.permutation(n), without its 8-byte copy
        order = by_length(order, self.src_lens, self.tgt_lens)
        bounds = cut(
            self.src_lens,
            self.tgt_lens,
            order,
            max_tokens=self.max_tokens,
            batch_size=self.batch_size,
            extra=self.extra,
        )
        count = len(bounds) - 1
        picks = rng.permutation(count) if self.shuffle else np.arange(count)
        batches = Epoch(order, bounds, picks)
        self._cache = (epoch, batches)
        return batches

    def epoch(self, epoch: int, done: int = 0) -> Epoch:
        """This rank's batches of ``epoch``, after the first ``done`` of its global order."""
        whole = self.whole(epoch)
        mine = share(len(whole), done, rank=self.rank, world=self.world, even=self.infinite)
        return Epoch(whole.order, whole.bounds, whole.picks[mine])

    @property
    def batches_in_epoch(self) -> int:
        """Batches in an epoch's global order, all ranks' (the same every epoch: the lengths sort alike)."""
        return len(self.whole(0))

    @property
    def batches_per_epoch(self) -> int:
        return len(self.epoch(0))

    def __iter__(self) -> Iterator[np.ndarray]:
        if not self.infinite:
            yield from self.epoch(0)
            return
        if self.batches_per_epoch == 0:
            raise ValueError("no training batches: the data is smaller than the number of processes")
        epoch, done = self.start()  # read lazily, at the first batch: after a checkpoint has been restored
        while True:
            yield from self.epoch(epoch, done)
            epoch, done = epoch + 1, 0

    def __len__(self) -> int:
        if self.infinite:
            raise TypeError("an infinite sampler has no length")
        return len(self.epoch(0))
